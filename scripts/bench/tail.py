"""Live log tail of ``fleet-trio node``: throughput and latency through a websocket subscriber.

Part 1 (throughput): a job writes ``--bytes`` (default 200 MB) of log text on stderr as fast as
it can (a Python writer, 64 KiB writes of 100-byte lines), through the node, with one websocket
subscriber tailing from the start (connected right after the 202). Timed from the dispatch to
the arrival of the ``end`` message (the websocket's closing handshake after it is not timed; its
median is printed, and the CPU figures include it). The floor is the same writer into a plain
pipe (``| cat >/dev/null``).
The two sides run interleaved, ``--rounds`` times each (default 3; the order inside each
round alternates, pipe first then node first), so that load on a shared machine hits both
alike; a lone pipe run followed by a lone node run measured the load, not the tail. Prints
both median MB/s, each round's ratio and the median ratio node/pipe (target ≥ 0.7), and how
many bytes the subscriber got vs. were ``skipped``, in how many frames of each kind (the bus
never slows a job down for a slow subscriber: a subscriber more than 1 MiB behind skips).
Also the CPU seconds each side burns (pipe: the writer and ``cat``; node: the node process,
its reaped job and this process's websocket client, each shown) and the node process's minor
page faults: on a loaded machine the wall-clock ratio mostly follows them. The subscriber
reads as ``fleet-trio tail`` does (64 KiB per socket read) and decodes every frame.

Text, not ``/dev/zero``: NUL bytes are valid UTF-8 but each one is sent as the 6-character
JSON escape ``\\u0000``, which would measure JSON escaping rather than the tail.

Part 2 (latency): a job writes one line every 10 ms for ``--seconds`` (default 3 s), each
holding its ``time.time()``; the subscriber computes arrival − write time (same host, same
clock). Prints p50/p99 (target p99 ≤ 20 ms).

The node runs in its **own process** (this script re-run with ``--serve``), as in
``scripts/bench/dispatch.py``. Only 127.0.0.1 is used.

    .venv/bin/python scripts/bench/tail.py [--bytes 200000000] [--rounds 3] [--seconds 3] [--floor]
    .venv/bin/python scripts/bench/tail.py --before TREE [--runs 4] [--rounds 5 --floor ...]

``--floor`` adds a third run to each round: the same job with a subscriber of stdout only, to
which the flood (on stderr) is never sent, i.e. the node's cost without the tail's frames (its
CPU split the same way).

``--before TREE`` compares two versions of the node in one session: this benchmark (the same
script, so the same method) runs ``--runs`` times with TREE's ``fleet_trio`` first on the path
(another checkout, e.g. the commit before a change) and as often with this tree's, each in a
fresh interpreter, the order alternating run by run; it prints each run's lines with the load
average it started at, then each tree's run medians and their median.

Exit status: 0 whether or not the targets are met; 1 when the run is broken (the node does
not start, a dispatch is refused, a job fails, a message is malformed, bytes are lost).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import trio
from benchlib import (
    BrokenRun,
    cpu_seconds,
    pct,
    serve_node_child,
    served_run,
    start_served,
)
from trio_websocket import ConnectionClosed, open_websocket_url

THROUGHPUT_TARGET = 0.7
LATENCY_TARGET_MS = 20.0
LINE_INTERVAL = 0.01
RUN_TIMEOUT = 120.0

# Writes p["bytes"] bytes of 100-byte text lines on stderr in 64 KiB writes, then "{}" on stdout.
FLOOD = r"""
import json, os, sys
p = json.loads(sys.stdin.read() or "{}")
n = int(p.get("bytes", sys.argv[1] if len(sys.argv) > 1 else 0))
line = (b"step 000042 loss 0.1234 lr 3e-4 the quick brown fox jumps over the lazy dog " * 2)[:99]
line += b"\n"
block = line * 655 + line[:36]  # 65536 bytes
fd = sys.stderr.fileno()
while n > 0:
    chunk = block if n >= len(block) else block[:n]
    view = memoryview(chunk)
    while view:
        view = view[os.write(fd, view):]
    n -= len(chunk)
sys.stdout.write("{}")
"""

# One line every p["interval"] s for p["seconds"] s: "t=<time.time()> <padding>\n" on stderr.
TICKS = r"""
import json, sys, time
p = json.loads(sys.stdin.read())
n = int(p["seconds"] / p["interval"])
start = time.monotonic()
for i in range(n):
    delay = start + i * p["interval"] - time.monotonic()
    if delay > 0:
        time.sleep(delay)
    sys.stderr.write(f"t={time.time():.6f} tick {i}\n")
    sys.stderr.flush()
sys.stdout.write("{}")
"""


# ------------------------------------------------------------------------------------------
# server side (``--serve STATE_DIR``), run in a child process


def write_config(state: Path) -> Path:
    cfg = {
        "node": {
            "listen": "127.0.0.1:0",
            "node_id": "bench-tail",
            "timings": {"drain_timeout": "3s", "kill_grace": "1s"},
            "journal": {"path": str(state / "journal.sqlite")},  # not in the user's home
        },
        "tasks": {
            "flood": {"command": [sys.executable, "-c", FLOOD], "gpu": False, "timeout": "300s"},
            "ticks": {"command": [sys.executable, "-c", TICKS], "gpu": False, "timeout": "300s"},
        },
    }
    path = state / "node.yaml"
    path.write_text(json.dumps(cfg))  # JSON is YAML
    return path


def serve_main(state: Path) -> int:
    import fleet_trio.gpu.fake as fake

    fake.init_device(str(state / "gpu"), "Fake H200", 141.0)
    trio.run(serve_node_child, write_config(state), state / "gpu", state / "node.url")
    return 0


def start_node(state: Path) -> tuple[subprocess.Popen[bytes], str]:
    return start_served(__file__, [str(state)], state / "node.url", "node")


# ------------------------------------------------------------------------------------------
# client side


def ws_base(url: str) -> str:
    return "ws://" + url.split("://", 1)[1]


async def dispatch(client: httpx.AsyncClient, task: str, payload: dict[str, Any]) -> str:
    job_id = f"bench-{uuid.uuid4().hex[:12]}"
    body = json.dumps({"job_id": job_id, "task_type": task, "payload": payload}).encode()
    r = await client.post(
        "/fleet/dispatch", content=body, headers={"Content-Type": "application/json"}
    )
    if r.status_code != 202:
        raise BrokenRun(f"dispatch {task}: {r.status_code} {r.text[:200]}")
    return job_id


class Tally:
    def __init__(self) -> None:
        self.received = 0  # stderr bytes
        self.received_other = 0  # bytes of the other stream (the writer's final "{}")
        self.skipped = 0
        self.frames = {"output": 0, "skipped": 0}  # frames of each kind
        self.end: dict[str, Any] | None = None
        self.latencies: list[float] = []
        self.first: float | None = None  # perf_counter of the first output received
        self.last = 0.0  # ... and of the last
        self.node_faults = 0  # the node process's minor page faults during the run
        self.end_at = 0.0  # perf_counter when the ``end`` frame arrived
        self.closed_at = 0.0  # ... and when the closing handshake after it was done


async def subscribe(
    url: str, job_id: str, tally: Tally, *, ticks: bool = False, streams: str = ""
) -> None:
    from fleet_trio.logbus.tail import output_bytes
    from fleet_trio.logbus.tail_client import RECEIVE_BUFFER

    url = f"{url}/fleet/jobs/{job_id}/tail?from=start" + (f"&streams={streams}" if streams else "")
    async with open_websocket_url(url, receive_buffer_size=RECEIVE_BUFFER) as ws:
        try:
            while True:
                msg = json.loads(await ws.get_message())
                kind = msg.get("type")
                if kind in tally.frames:
                    tally.frames[kind] += 1
                if kind == "output":
                    if ticks:
                        now = time.time()
                        for line in msg["data"].splitlines():
                            if line.startswith("t="):
                                sent = float(line[2:].split(" ", 1)[0])
                                tally.latencies.append((now - sent) * 1000.0)
                    if msg["stream"] != "stderr":
                        tally.received_other += len(output_bytes(msg))
                    else:
                        tally.received += len(output_bytes(msg))
                        tally.last = time.perf_counter()
                        if tally.first is None:
                            tally.first = tally.last
                elif kind == "skipped":
                    tally.skipped += msg["bytes"]
                elif kind == "end":
                    tally.end_at = time.perf_counter()
                    tally.end = msg
                elif kind == "error":
                    raise BrokenRun(f"tail of {job_id}: {msg}")
        except ConnectionClosed:
            pass
    tally.closed_at = time.perf_counter()
    if tally.end is None:
        raise BrokenRun(f"tail of {job_id} closed before its end")
    if tally.end["state"] != "done":
        raise BrokenRun(f"job {job_id} failed: {tally.end}")


async def through_node(
    node_url: str, nbytes: int, node_pid: int, floor: bool = False
) -> tuple[float, tuple[float, float, float], Tally]:
    """Seconds from the dispatch to the ``end``, and the CPU seconds the node process, its job
    and this client burnt meanwhile. ``floor``: the subscriber asks for stdout only, so the
    flood (on stderr) is never sent: the node's cost without the tail's frames."""
    tally = Tally()
    async with httpx.AsyncClient(base_url=node_url, timeout=30) as client:
        await client.get("/fleet/health")  # open the connection outside the timing
        with trio.fail_after(RUN_TIMEOUT):
            f0 = minor_faults(node_pid)
            t0, c0, (n0, j0) = time.perf_counter(), time.process_time(), cpu_seconds(node_pid)
            job_id = await dispatch(client, "flood", {"bytes": nbytes})
            await subscribe(ws_base(node_url), job_id, tally, streams="stdout" if floor else "")
            elapsed = tally.end_at - t0  # to the ``end`` frame, not the close handshake after it
            n1, j1 = cpu_seconds(node_pid)
            tally.node_faults = minor_faults(node_pid) - f0
            cpu = (n1 - n0, j1 - j0, time.process_time() - c0)
    if floor:
        assert tally.end is not None
        if tally.received or tally.end["offset"] != nbytes + 2:
            raise BrokenRun(f"flood (stdout only): {tally.received} bytes of stderr, {tally.end}")
        return elapsed, cpu, tally
    # The job writes nbytes on stderr, then "{}" on stdout; a ``skipped`` may cover either.
    got = tally.received + tally.received_other + tally.skipped
    if got != nbytes + 2:
        raise BrokenRun(
            f"flood: {tally.received} + {tally.received_other} bytes received + "
            f"{tally.skipped} skipped != {nbytes} + 2"
        )
    return elapsed, cpu, tally


def minor_faults(pid: int) -> int:
    """Minor page faults of process ``pid`` so far (``/proc/PID/stat`` field 10; 0 where it
    cannot be read)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[7])
    except (OSError, IndexError, ValueError):
        return 0


def children_cpu() -> float:
    """CPU seconds of this process's reaped children (the pipe side's writer and ``cat``)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def through_pipe(nbytes: int) -> float:
    t0 = time.perf_counter()
    writer = subprocess.Popen(
        [sys.executable, "-c", FLOOD, str(nbytes)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert writer.stderr is not None
    cat = subprocess.run(["cat"], stdin=writer.stderr, stdout=subprocess.DEVNULL, check=False)
    writer.stderr.close()
    if writer.wait() != 0 or cat.returncode != 0:
        raise BrokenRun(f"pipe: writer {writer.returncode}, cat {cat.returncode}")
    return time.perf_counter() - t0


async def latency(node_url: str, seconds: float) -> Tally:
    tally = Tally()
    async with httpx.AsyncClient(base_url=node_url, timeout=30) as client:
        with trio.fail_after(RUN_TIMEOUT):
            payload = {"seconds": seconds, "interval": LINE_INTERVAL}
            job_id = await dispatch(client, "ticks", payload)
            await subscribe(ws_base(node_url), job_id, tally, ticks=True)
    expected = int(seconds / LINE_INTERVAL)
    if len(tally.latencies) != expected:
        raise BrokenRun(f"ticks: {len(tally.latencies)} lines received, {expected} written")
    return tally


REPO = str(Path(__file__).resolve().parents[2])

SUMMARY = {
    "ratio": re.compile(r"ratio node/pipe ([0-9.]+)"),
    "floor": re.compile(r"floor: .*? ratio ([0-9.]+)"),
    "node CPU s": re.compile(r"CPU seconds per run .*? node ([0-9.]+)"),
    "p99 ms": re.compile(r"p99 +([0-9.]+) ms"),
}


def one_run(tree: str, passed: list[str]) -> dict[str, float]:
    """This benchmark once, in a fresh interpreter with ``tree``'s ``fleet_trio`` first on the
    path; its output is printed; the figures of :data:`SUMMARY` it printed are returned."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [tree, env_path()])))
    load = os.getloadavg()[0]
    done = subprocess.run(
        [sys.executable, os.path.abspath(__file__), *passed],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    text = done.stdout + done.stderr
    print(f"   load average {load:.2f}", flush=True)
    print(text, end="", flush=True)
    if done.returncode != 0:
        raise BrokenRun(f"a run with {tree}'s fleet_trio failed (status {done.returncode})")
    found = {key: rx.search(text) for key, rx in SUMMARY.items()}
    return {key: float(m.group(1)) for key, m in found.items() if m is not None}


def env_path() -> str:
    return os.environ.get("PYTHONPATH", "")


def compare(before: str, runs: int, passed: list[str]) -> int:
    """``--before``: the benchmark ``runs`` times per tree, alternating; each tree's medians."""
    trees = {"before": os.path.abspath(before), "after": REPO}
    seen: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    try:
        for i in range(runs):
            for name in ["before", "after"] if i % 2 == 0 else ["after", "before"]:
                print(f"-- {name} (run {i + 1})", flush=True)
                seen[name].append(one_run(trees[name], passed))
    except BrokenRun as exc:
        print(f"broken run: {exc}", file=sys.stderr)
        return 1
    for name, results in seen.items():
        for key in SUMMARY:
            values = [r[key] for r in results if key in r]
            if values:
                shown = " ".join(f"{v:g}" for v in values)
                print(f"{name:6s} {key}: {shown} (median {statistics.median(values):g})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, default=200_000_000, help="part 1 (200000000)")
    parser.add_argument("--rounds", type=int, default=3, help="part 1's rounds per side (3)")
    parser.add_argument("--seconds", type=float, default=3.0, help="part 2's duration (3)")
    parser.add_argument(
        "--floor",
        action="store_true",
        help="part 1 also times the node with a subscriber of stdout only, to which the flood "
        "(on stderr) is never sent: the node's cost without the tail's frames",
    )
    parser.add_argument(
        "--before",
        metavar="TREE",
        help="run this benchmark --runs times with TREE's fleet_trio (another checkout) and as "
        "often with this tree's, alternating, and print each tree's medians",
    )
    parser.add_argument("--runs", type=int, default=4, help="runs per tree with --before (4)")
    parser.add_argument("--serve", metavar="STATE", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        return serve_main(Path(args.serve))
    if args.before:
        if args.runs < 1:
            parser.error("--runs must be >= 1")
        passed = [
            f"--bytes={args.bytes}",
            f"--rounds={args.rounds}",
            f"--seconds={args.seconds}",
            *(["--floor"] if args.floor else []),
        ]
        return compare(args.before, args.runs, passed)
    if args.bytes < 1 or args.seconds < 0.1 or args.rounds < 1:
        parser.error("--bytes and --rounds must be >= 1 and --seconds >= 0.1")

    with tempfile.TemporaryDirectory(prefix="fleet-bench-tail-") as tmp:
        state = Path(tmp)
        with served_run() as served:
            proc, node_url = start_node(state)
            served.append(proc)
            mb = args.bytes / 1e6
            print(
                f"throughput: {mb:g} MB of log text on stderr, one websocket subscriber from "
                f"the start; node in its own process, {os.cpu_count()} CPUs"
            )
            pipe_runs: list[float] = []
            node_runs: list[float] = []
            pipe_cpu: list[float] = []
            node_cpu: list[float] = []
            node_parts: list[tuple[float, float, float]] = []
            floor_runs: list[float] = []
            floor_cpu: list[float] = []
            floor_parts: list[tuple[float, float, float]] = []
            faults: list[int] = []
            closes: list[float] = []
            tally = Tally()
            for i in range(args.rounds):
                if i % 2 == 0:
                    c0 = children_cpu()
                    pipe_runs.append(through_pipe(args.bytes))
                    pipe_cpu.append(children_cpu() - c0)
                node_s, cpu, tally = trio.run(through_node, node_url, args.bytes, proc.pid)
                node_runs.append(node_s)
                node_cpu.append(sum(cpu))
                node_parts.append(cpu)
                faults.append(tally.node_faults)
                closes.append(tally.closed_at - tally.end_at)
                if args.floor:
                    floor_s, cpu, _ = trio.run(through_node, node_url, args.bytes, proc.pid, True)
                    floor_runs.append(floor_s)
                    floor_cpu.append(sum(cpu))
                    floor_parts.append(cpu)
                if i % 2 == 1:
                    c0 = children_cpu()
                    pipe_runs.append(through_pipe(args.bytes))
                    pipe_cpu.append(children_cpu() - c0)
            pipe_s = statistics.median(pipe_runs)
            node_s = statistics.median(node_runs)
            print(f"  plain pipe (| cat)    {mb / pipe_s:9.1f} MB/s   (median {pipe_s:.2f} s)")
            print(
                f"  node + ws subscriber  {mb / node_s:9.1f} MB/s   (median {node_s:.2f} s, "
                f"dispatch → end; last round received {tally.received / 1e6:g} MB, "
                f"skipped {tally.skipped / 1e6:g} MB in {tally.frames['output']} output and "
                f"{tally.frames['skipped']} skipped frames)"
            )
            if tally.first is not None and tally.last > tally.first:
                rate = tally.received / 1e6 / (tally.last - tally.first)
                print(f"  subscriber received   {rate:9.1f} MB/s   (first → last output frame)")
            parts = [statistics.median(p[k] for p in node_parts) for k in range(3)]
            print(
                f"  CPU seconds per run   pipe {statistics.median(pipe_cpu):.2f}   node "
                f"{statistics.median(node_cpu):.2f}   (medians; node: node process "
                f"{parts[0]:.2f}, its job {parts[1]:.2f}, the client {parts[2]:.2f}; the node "
                f"process's minor page faults {statistics.median(faults):.0f})"
            )
            print(
                f"  closing handshake after the end (not timed): median "
                f"{statistics.median(closes) * 1000:.1f} ms"
            )
            ratios = [p / n for p, n in zip(pipe_runs, node_runs, strict=True)]
            ratio = statistics.median(ratios)
            verdict = "ok" if ratio >= THROUGHPUT_TARGET else "BELOW TARGET"
            shown = " ".join(f"{r:.2f}" for r in ratios)
            print(
                f"  ratio node/pipe {ratio:.2f}   (median of {args.rounds} interleaved rounds: "
                f"{shown}; target >= {THROUGHPUT_TARGET}: {verdict})"
            )
            if floor_runs:
                ratios = [p / n for p, n in zip(pipe_runs, floor_runs, strict=True)]
                shown = " ".join(f"{r:.2f}" for r in ratios)
                print(
                    f"  floor: node, subscriber of stdout only (no frames of the flood): ratio "
                    f"{statistics.median(ratios):.2f} ({shown}), CPU seconds "
                    f"{statistics.median(floor_cpu):.2f} (node process "
                    f"{statistics.median(p[0] for p in floor_parts):.2f}, its job "
                    f"{statistics.median(p[1] for p in floor_parts):.2f}, the client "
                    f"{statistics.median(p[2] for p in floor_parts):.2f})"
                )

            print(
                f"latency: one line every {LINE_INTERVAL * 1000:g} ms for {args.seconds:g} s, "
                "arrival − write time at the subscriber"
            )
            lat = trio.run(latency, node_url, args.seconds).latencies
            p50, p99 = pct(lat, 0.5), pct(lat, 0.99)
            verdict = "ok" if p99 <= LATENCY_TARGET_MS else "ABOVE TARGET"
            print(
                f"  p50 {p50:6.2f} ms   p99 {p99:6.2f} ms   max {max(lat):6.2f} ms   "
                f"(n {len(lat)}; target p99 <= {LATENCY_TARGET_MS:g} ms: {verdict})"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
