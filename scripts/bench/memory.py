"""The memory budget of ``fleet-trio node``: peak RSS under a stream of large results and logs.

A node (its own process, this script re-run with ``--serve``, on the fake GPU) runs
``--results`` jobs (default 100) that each return a ``--result-mb`` (15) MB JSON result and
``--logs`` jobs (default 100) that each write ``--log-mb`` (10) MB of log text on stderr, at most
``--concurrency`` (4) at a time; every job is polled to its end (a result is downloaded once).
The node's ``node.memory_budget`` is ``--budget`` (default 256MiB).

The node's peak RSS (``VmHWM`` of ``/proc/<pid>/status``) is printed side by side with the
budget and with the bound it must stay under: budget + a fixed overhead, where the overhead is
the idle node's RSS plus what running jobs hold by design and never evict (64 MiB per running
job: the 16 MiB result buffer, the 8 MiB log history and the result's transient copies as it
ends) plus 64 MiB of allocator slack. Also printed:
the evictions the node's ``/metrics`` counted. ``--compare`` runs the same load a second time
with a budget so large nothing is evicted (what the node did before the budget).

    .venv/bin/python scripts/bench/memory.py [--budget 256MiB] [--results 100] [--logs 100]

Exit status: 0 whether or not the bound is met; 1 when the run is broken (the node does not
start, a dispatch is refused, a job fails other than by eviction).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import trio
from benchlib import BrokenRun, serve_node_child, start_served, stop_served

MIB = 1 << 20
PER_RUNNING_JOB = 64 * MIB
"""What one running job holds by design and the budget never evicts: the 16 MiB result buffer,
the 8 MiB log history, and its result's transient copies as it ends (decoded, re-encoded, the
poll's response body)."""
SLACK = 64 * MIB
RUN_TIMEOUT = 900.0
POLL_EVERY = 0.1

# Prints one JSON object of about p["mb"] MB on stdout.
RESULT = r"""
import json, sys
p = json.loads(sys.stdin.read())
n = int(p["mb"] * 1000000)
sys.stdout.write('{"blob": "' + "r" * n + '"}')
"""

# Writes p["mb"] MB of 100-byte text lines on stderr, then "{}" on stdout.
LOGS = r"""
import json, os, sys
p = json.loads(sys.stdin.read())
n = int(p["mb"] * 1000000)
line = b"step 000042 loss 0.1234 lr 3e-4 the quick brown fox jumps over the lazy dog " * 2
block = (line[:99] + b"\n") * 655
fd = sys.stderr.fileno()
while n > 0:
    chunk = block[: min(n, len(block))]
    view = memoryview(chunk)
    while view:
        view = view[os.write(fd, view):]
    n -= len(chunk)
sys.stdout.write("{}")
"""


# ------------------------------------------------------------------------------------------
# server side (``--serve STATE_DIR BUDGET``), run in a child process


def write_config(state: Path, budget: str) -> Path:
    cfg = {
        "node": {
            "listen": "127.0.0.1:0",
            "node_id": "bench-memory",
            "memory_budget": budget,
            "timings": {"drain_timeout": "3s", "kill_grace": "1s"},
            "journal": {"path": str(state / "journal.sqlite")},  # not in the user's home
        },
        "tasks": {
            "result": {"command": [sys.executable, "-c", RESULT], "timeout": "300s"},
            "logs": {"command": [sys.executable, "-c", LOGS], "timeout": "300s"},
        },
    }
    path = state / "node.yaml"
    path.write_text(json.dumps(cfg))  # JSON is YAML
    return path


def serve_main(state: Path, budget: str) -> int:
    import fleet_trio.gpu.fake as fake

    fake.init_device(str(state / "gpu"), "Fake H200", 141.0)
    trio.run(serve_node_child, write_config(state, budget), state / "gpu", state / "node.url")
    return 0


# ------------------------------------------------------------------------------------------
# client side


def proc_status(pid: int) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` (bytes) of ``pid``."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                out[name] = int(rest.split()[0]) * 1024
    return out


async def run_job(client: httpx.AsyncClient, task: str, mb: float, tally: dict[str, int]) -> None:
    job_id = f"bench-{uuid.uuid4().hex[:12]}"
    body = json.dumps({"job_id": job_id, "task_type": task, "payload": {"mb": mb}}).encode()
    r = await client.post(
        "/fleet/dispatch", content=body, headers={"Content-Type": "application/json"}
    )
    if r.status_code != 202:
        raise BrokenRun(f"dispatch {task}: {r.status_code} {r.text[:200]}")
    while True:
        await trio.sleep(POLL_EVERY)
        r = await client.get(f"/fleet/jobs/{job_id}")
        if r.status_code != 200:
            raise BrokenRun(f"poll {job_id}: {r.status_code} {r.text[:200]}")
        state = r.json()
        if state["state"] == "done":
            tally["done"] += 1
            return
        if state["state"] == "error":
            if str(state.get("error", "")).startswith("result evicted"):
                tally["evicted before the poll"] += 1
                return
            raise BrokenRun(f"job {job_id} failed: {state.get('error', '')[:300]}")


async def load(url: str, args: argparse.Namespace) -> dict[str, int]:
    tally = {"done": 0, "evicted before the poll": 0}
    results = [("result", args.result_mb)] * args.results
    logs = [("logs", args.log_mb)] * args.logs
    # interleaved, so results and logs compete for the budget
    jobs = [j for pair in itertools.zip_longest(results, logs) for j in pair if j is not None]
    limiter = trio.CapacityLimiter(args.concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:

        async def one(task: str, mb: float) -> None:
            async with limiter:
                await run_job(client, task, mb, tally)

        with trio.fail_after(RUN_TIMEOUT):
            async with trio.open_nursery() as nursery:
                for task, mb in jobs:
                    nursery.start_soon(one, task, mb)
    return tally


def scrape(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("fleet_trio_memory_"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def one_run(tmp: Path, budget: str, args: argparse.Namespace) -> dict[str, float]:
    proc: subprocess.Popen[bytes] | None = None
    try:
        proc, url = start_served(__file__, [str(tmp), budget], tmp / "node.url", "node")
        time.sleep(0.5)
        idle = proc_status(proc.pid)["VmRSS"]
        started = time.monotonic()
        tally = trio.run(load, url, args)
        elapsed = time.monotonic() - started
        status = proc_status(proc.pid)
        metrics = scrape(url)
    finally:
        if proc is not None:
            stop_served(proc)
    return {
        "idle": idle,
        "peak": status["VmHWM"],
        "end": status["VmRSS"],
        "elapsed": elapsed,
        "done": tally["done"],
        "evicted_before_poll": tally["evicted before the poll"],
        "evicted_results": metrics.get('fleet_trio_memory_evictions_total{kind="result"}', 0),
        "evicted_logs": metrics.get('fleet_trio_memory_evictions_total{kind="log"}', 0),
        "evicted_bytes": sum(v for k, v in metrics.items() if "evicted_bytes_total" in k),
        "retained": sum(v for k, v in metrics.items() if "retained_bytes" in k),
    }


def mib(n: float) -> str:
    return f"{n / MIB:8.1f} MiB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="256MiB", help="node.memory_budget (256MiB)")
    parser.add_argument("--results", type=int, default=100, help="result jobs (100)")
    parser.add_argument("--result-mb", type=float, default=15.0, help="MB per result (15)")
    parser.add_argument("--logs", type=int, default=100, help="log jobs (100)")
    parser.add_argument("--log-mb", type=float, default=10.0, help="MB of log per job (10)")
    parser.add_argument("--concurrency", type=int, default=4, help="jobs at a time (4)")
    parser.add_argument(
        "--compare", action="store_true", help="also run with a budget that never evicts"
    )
    parser.add_argument("--serve", nargs=2, metavar=("STATE", "BUDGET"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        return serve_main(Path(args.serve[0]), args.serve[1])

    from fleet_trio.memory import parse_size

    budget = parse_size(args.budget)
    print(
        f"memory: {args.results} jobs returning {args.result_mb:g} MB and {args.logs} writing "
        f"{args.log_mb:g} MB of logs, {args.concurrency} at a time; node in its own process, "
        f"{os.cpu_count()} CPUs"
    )
    runs: list[tuple[str, int, dict[str, float]]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="fleet-bench-memory-") as tmp:
            runs.append(("budget", budget, one_run(Path(tmp), args.budget, args)))
        if args.compare:
            with tempfile.TemporaryDirectory(prefix="fleet-bench-memory-") as tmp:
                runs.append(("no eviction", 1 << 45, one_run(Path(tmp), "32TiB", args)))
    except Exception as exc:  # a broken run, whatever broke it
        while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
            exc = exc.exceptions[0]
        print(f"broken run: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    for label, limit, r in runs:
        overhead = r["idle"] + args.concurrency * PER_RUNNING_JOB + SLACK
        bound = limit + overhead
        print(f"{label}: {r['elapsed']:.1f} s, {int(r['done'])} results polled done")
        print(f"  budget                {mib(limit) if limit < 1 << 44 else '    none'}")
        print(f"  peak RSS (VmHWM)      {mib(r['peak'])}")
        print(f"  idle RSS              {mib(r['idle'])}   end RSS {mib(r['end']).strip()}")
        if limit < 1 << 44:
            verdict = "ok" if r["peak"] <= bound else "OVER"
            print(
                f"  bound budget+overhead {mib(bound)}   (overhead = idle + {args.concurrency} "
                f"running × 64 MiB + 64 MiB slack = {mib(overhead).strip()}: {verdict})"
            )
            print(f"  peak RSS / budget     {r['peak'] / limit:8.2f}")
        print(
            f"  evicted: {int(r['evicted_results'])} results, {int(r['evicted_logs'])} log "
            f"histories, {mib(r['evicted_bytes']).strip()}; retained at the end "
            f"{mib(r['retained']).strip()}; {int(r['evicted_before_poll'])} results evicted "
            "before their poll"
        )
    if len(runs) == 2:
        print(f"  ratio peak RSS budget/no-eviction {runs[0][2]['peak'] / runs[1][2]['peak']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
