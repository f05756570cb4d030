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

``--tails N`` (fan-out; replaces parts 1 and 2): a job writes ``--bytes`` (default 64 MiB in this
mode) as in part 1 and times its own writes, once with one websocket subscriber and once with
``N``, alternated ``--rounds`` times (default 3). One subscriber of the N decodes every frame
and checks that every byte was received or ``skipped``; the others read every frame and look
only at its head. Prints the job's own write rate with N subscribers against one (target
>= 0.5) and the growth of the node process's resident memory over its RSS before the first
run (sampled every 20 ms; target <= 32 MiB with N subscribers). The node is configured to
admit ``N`` tails of one job (``max_tails_per_job``) where it has the key.

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

import attrs
import httpx
import trio
import trio.lowlevel
from benchlib import (
    BrokenRun,
    cpu_seconds,
    pct,
    serve_node_child,
    served_run,
    start_served,
    stop_served,
)
from trio_websocket import ConnectionClosed, open_websocket_url

THROUGHPUT_TARGET = 0.7
FANOUT_TARGET = 0.5
RSS_TARGET_MIB = 32.0
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

# FLOOD, timing its own writes: "{"write_s": seconds}" on stdout (the job's result).
# It starts once the file p["go"] exists (the benchmark's subscribers are connected).
TIMED_FLOOD = (
    FLOOD.replace("import json, os, sys", "import json, os, sys, time")
    .replace(
        "fd = sys.stderr.fileno()",
        "fd = sys.stderr.fileno()\nwhile not os.path.exists(p['go']):\n    time.sleep(0.002)\n"
        "start = time.perf_counter()",
    )
    .replace(
        'sys.stdout.write("{}")',
        'sys.stdout.write(json.dumps({"write_s": time.perf_counter() - start}))',
    )
)

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


def tail_caps(tails: int) -> dict[str, int]:
    """Node keys that admit ``tails`` subscribers of one job, where this tree's node has them
    (a tree from before the caps refuses unknown keys)."""
    from fleet_trio.node.config import NodeSettings

    fields = {f.name for f in attrs.fields(NodeSettings)}
    if tails <= 0 or "max_tails_per_job" not in fields:
        return {}
    return {"max_tails_per_job": tails + 1, "max_tails": max(256, tails + 1)}


def write_config(state: Path, tails: int = 0) -> Path:
    cfg = {
        "node": {
            **tail_caps(tails),
            "listen": "127.0.0.1:0",
            "node_id": "bench-tail",
            "timings": {"drain_timeout": "3s", "kill_grace": "1s"},
            "journal": {"path": str(state / "journal.sqlite")},  # not in the user's home
        },
        "tasks": {
            "flood": {"command": [sys.executable, "-c", FLOOD], "gpu": False, "timeout": "300s"},
            "ticks": {"command": [sys.executable, "-c", TICKS], "gpu": False, "timeout": "300s"},
            "timed": {
                "command": [sys.executable, "-c", TIMED_FLOOD],
                "gpu": False,
                "timeout": "300s",
            },
        },
    }
    path = state / "node.yaml"
    path.write_text(json.dumps(cfg))  # JSON is YAML
    return path


def serve_main(state: Path, tails: int = 0) -> int:
    import fleet_trio.gpu.fake as fake

    fake.init_device(str(state / "gpu"), "Fake H200", 141.0)
    trio.run(serve_node_child, write_config(state, tails), state / "gpu", state / "node.url")
    return 0


def start_node(state: Path, tails: int = 0) -> tuple[subprocess.Popen[bytes], str]:
    extra = [f"--serve-tails={tails}"] if tails else []
    return start_served(__file__, [str(state), *extra], state / "node.url", "node")


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


def rss_bytes(pid: int) -> int:
    """Resident memory of process ``pid`` (``VmRSS``; 0 where it cannot be read)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


async def glance(url: str, counts: dict[str, int]) -> None:
    """A subscriber that reads every frame as it comes and looks only at its ``type``."""
    from fleet_trio.logbus.tail_client import RECEIVE_BUFFER

    head = len('{"type":"')
    mine: dict[str, int] = {}
    async with open_websocket_url(url, receive_buffer_size=RECEIVE_BUFFER) as ws:
        try:
            while True:
                text = await ws.get_message()
                kind = str(text[head : text.index('"', head)])
                mine[kind] = mine.get(kind, 0) + 1
        except ConnectionClosed:
            pass
    if mine.get("end") != 1 or mine.get("error"):
        raise BrokenRun(f"a subscriber's frames: {mine}")
    for kind, n in mine.items():
        counts[kind] = counts.get(kind, 0) + n


async def fanout_run(
    node_url: str, nbytes: int, tails: int, node_pid: int, go: Path
) -> tuple[float, int, Tally, dict[str, int]]:
    """One job writing ``nbytes`` with ``tails`` subscribers from the start, all connected
    before it writes its first byte: the job's own write time, the node's peak RSS meanwhile,
    the checking subscriber's tally and the other subscribers' frame counts."""
    go.unlink(missing_ok=True)
    tally = Tally()
    counts: dict[str, int] = {}
    peak = 0
    async with httpx.AsyncClient(base_url=node_url, timeout=30) as client:
        with trio.fail_after(RUN_TIMEOUT * 3):
            job_id = await dispatch(client, "timed", {"bytes": nbytes, "go": str(go)})
            url = f"{ws_base(node_url)}/fleet/jobs/{job_id}/tail?from=start"
            async with trio.open_nursery() as nursery:

                async def sample() -> None:
                    nonlocal peak
                    while True:
                        peak = max(peak, rss_bytes(node_pid))
                        await trio.sleep(0.02)

                nursery.start_soon(sample)
                async with trio.open_nursery() as readers:
                    readers.start_soon(subscribe, ws_base(node_url), job_id, tally)
                    for _ in range(tails - 1):
                        readers.start_soon(glance, url, counts)
                    await (
                        trio.lowlevel.checkpoint()
                    )  # the connects are under way; the job waits for go
                    await wait_connected(node_url, job_id, tails)
                    go.write_text("go")
                nursery.cancel_scope.cancel()
            peak = max(peak, rss_bytes(node_pid))
            while True:
                r = await client.get(f"/fleet/jobs/{job_id}")
                body = r.json()
                if body.get("state") == "done":
                    break
                if body.get("state") not in ("pending", "running"):
                    raise BrokenRun(f"job {job_id}: {body}")
                await trio.sleep(0.05)
    got = tally.received + tally.received_other + tally.skipped
    if tally.end is None or tally.end["offset"] != got or tally.received_other == nbytes:
        raise BrokenRun(f"timed flood: {got} bytes received or skipped, end {tally.end}")
    return float(body["data"]["write_s"]), peak, tally, counts


async def wait_connected(node_url: str, job_id: str, tails: int) -> None:
    """Until the node's metrics count ``tails`` open subscribers, or 30 s (then on anyway:
    the subscribers read from the start, so a late one still gets every frame)."""
    async with httpx.AsyncClient(base_url=node_url, timeout=30) as client:
        with trio.move_on_after(30):
            while True:
                r = await client.get("/metrics")
                m = re.search(r"^fleet_trio_log_subscribers\S* ([0-9.e+]+)$", r.text, re.M)
                if m is None or float(m.group(1)) >= tails:
                    return
                await trio.sleep(0.05)


def fanout_main(args: argparse.Namespace, nbytes: int) -> int:
    mb = nbytes / 1e6
    print(
        f"fan-out: a job writes {mb:g} MB of log text on stderr and times its writes, with 1 "
        f"and with {args.tails} websocket subscribers from the start; a fresh node process "
        f"per run, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}"
    )
    seconds: dict[int, list[float]] = {1: [], args.tails: []}
    grown: dict[int, list[float]] = {1: [], args.tails: []}
    last: dict[int, tuple[Tally, dict[str, int]]] = {}
    ratios: list[float] = []
    cpu: dict[int, list[tuple[float, float]]] = {1: [], args.tails: []}
    with served_run() as served:
        for i in range(args.rounds):
            for n in [1, args.tails] if i % 2 == 0 else [args.tails, 1]:
                with tempfile.TemporaryDirectory(prefix="fleet-bench-tail-") as tmp:
                    state = Path(tmp)
                    proc, node_url = start_node(state, args.tails)
                    served.append(proc)
                    # warm: the first websocket's imports and buffers are not the tails' cost
                    trio.run(fanout_run, node_url, 1 << 16, 2, proc.pid, state / "go")
                    base = rss_bytes(proc.pid)
                    c0, (n0, _) = time.process_time(), cpu_seconds(proc.pid)
                    write_s, peak, tally, counts = trio.run(
                        fanout_run, node_url, nbytes, n, proc.pid, state / "go"
                    )
                    cpu[n].append((cpu_seconds(proc.pid)[0] - n0, time.process_time() - c0))
                    stop_served(proc)
                seconds[n].append(write_s)
                grown[n].append((peak - base) / (1 << 20))
                last[n] = (tally, counts)
            ratios.append(seconds[1][-1] / seconds[args.tails][-1])
        for n in (1, args.tails):
            s = statistics.median(seconds[n])
            tally, counts = last[n]
            print(
                f"  {n:4d} subscriber{'s' if n > 1 else ' '} {mb / s:9.1f} MB/s   (the job's "
                f"own write time, median {s:.3f} s; the checking subscriber got "
                f"{tally.received / 1e6:g} MB, skipped {tally.skipped / 1e6:g} MB"
                + (f"; each other subscriber {frames(counts, n - 1)}" if n > 1 else "")
                + f"; CPU seconds: node {statistics.median(c[0] for c in cpu[n]):.2f}, the "
                f"subscribers {statistics.median(c[1] for c in cpu[n]):.2f})"
            )
        ratio = statistics.median(ratios)
        verdict = "ok" if ratio >= FANOUT_TARGET else "BELOW TARGET"
        shown = " ".join(f"{r:.2f}" for r in ratios)
        print(
            f"  ratio {args.tails} tails/1 tail {ratio:.2f}   (the job's write rate, median of "
            f"{args.rounds} rounds: {shown}; target >= {FANOUT_TARGET}: {verdict})"
        )
        growth = statistics.median(grown[args.tails])
        verdict = "ok" if growth <= RSS_TARGET_MIB else "ABOVE TARGET"
        shown = " ".join(f"{g:.1f}" for g in grown[args.tails])
        print(
            f"  node RSS growth with {args.tails} tails {growth:.1f} MiB   (peak during the run "
            f"over the RSS before it, median of {shown}; with 1 tail "
            f"{statistics.median(grown[1]):.1f} MiB; target <= {RSS_TARGET_MIB:g} MiB: {verdict})"
        )
    return 0


def frames(counts: dict[str, int], readers: int) -> str:
    """The other subscribers' frames, per subscriber on average."""
    per = {k: v / readers for k, v in counts.items()}
    return ", ".join(f"{per[k]:.0f} {k}" for k in ("output", "skipped") if k in per)


REPO = str(Path(__file__).resolve().parents[2])

SUMMARY = {
    "ratio": re.compile(r"ratio node/pipe ([0-9.]+)"),
    "floor": re.compile(r"floor: .*? ratio ([0-9.]+)"),
    "node CPU s": re.compile(r"CPU seconds per run .*? node ([0-9.]+)"),
    "p99 ms": re.compile(r"p99 +([0-9.]+) ms"),
    "fan-out ratio": re.compile(r"ratio \d+ tails/1 tail ([0-9.]+)"),
    "RSS growth MiB": re.compile(r"RSS growth with \d+ tails (-?[0-9.]+) MiB"),
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
    parser.add_argument(
        "--bytes", type=int, default=None, help="part 1 (200000000); --tails (67108864)"
    )
    parser.add_argument(
        "--tails",
        type=int,
        default=0,
        metavar="N",
        help="fan-out instead of parts 1 and 2: the job's write rate with N subscribers "
        "against one, and the node's RSS growth",
    )
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
    parser.add_argument("--serve-tails", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        return serve_main(Path(args.serve), args.serve_tails)
    if args.bytes is None:
        args.bytes = 64 << 20 if args.tails else 200_000_000
    if args.before:
        if args.runs < 1:
            parser.error("--runs must be >= 1")
        passed = [
            f"--bytes={args.bytes}",
            f"--rounds={args.rounds}",
            f"--seconds={args.seconds}",
            *(["--floor"] if args.floor else []),
            *([f"--tails={args.tails}"] if args.tails else []),
        ]
        return compare(args.before, args.runs, passed)
    if args.bytes < 1 or args.seconds < 0.1 or args.rounds < 1:
        parser.error("--bytes and --rounds must be >= 1 and --seconds >= 0.1")
    if args.tails:
        if args.tails < 2:
            parser.error("--tails must be >= 2")
        return fanout_main(args, args.bytes)

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
