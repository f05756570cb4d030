"""Dispatch ack latency of ``fleet-trio node`` vs a bare quart-trio app (target p99 ratio ≤ 1.5),
with the job journal on vs off (target p50 and p99 ratios ≤ 1.2), and health latency while jobs
run and are sampled vs an idle node (target ratio ≈ 1).

Part 1 (ack): ``--clients`` concurrent clients (one ``httpx.AsyncClient`` each, so no shared
pool serialises them) each POST ``/fleet/dispatch`` with a unique job id, timing send → 202,
then poll ``GET /fleet/jobs/{id}`` every 500 ms until ``done|error`` (upstream's delegator polls
every 3 s; at 50 ms the polls, not the acks, would be the load). The same burst goes to

* the node: ``serve_node`` with a trivial task (a Python child that reads ``{}`` on stdin and
  prints ``{}``; ``gpu: false``, no footprint) and the fake GPU;
* the same node with its job journal off (``journal: {enabled: false}``): the journal's cost
  is the difference (every ack is committed to SQLite before the 202; concurrent acks share a
  commit);
* the floor: a bare quart-trio app on hypercorn (trio worker, the node's hypercorn settings)
  that parses the body and answers 202 with the same ack body, and ``done`` to every poll.

One warm-up burst per side (opens the keep-alive connections), then ``--rounds`` bursts per
side, alternating which side goes first. Prints p50/p99 of each, the p99 ratio, and the p99
difference (the client's own scheduling time is in both numbers; the difference is free of it).

``--clients 1`` (issue 19: one client at a time): one client per side dispatches ``--count``
jobs one at a time, ``--gap`` seconds apart (so only a job's own start competes with its ack),
``--rounds`` times (+1 warm-up round of 5), the sides taking turns dispatch by dispatch; then
polls each job to ``done``. Prints the median ack
of each side, the node/floor median ratios (target ≤ 1.5) and each job's start lag (from
sending the dispatch to the Python child's own first timestamp): a change that made the ack
faster by starting the job later would show there.

Part 2 (health): one client GETs ``/fleet/health`` every 10 ms on the node, first with the
node idle, then while ``--jobs`` jobs run (each holds 512 MiB of the fake GPU for 2 s, with a
footprint, so every job is sampled every 500 ms; gpu: false, so they run side by side; their
dispatcher polls every 500 ms from a process of its own, as it would from another host, so the
health client's loop is not the one busy), ``--rounds`` times. Prints both p99 and the ratio
busy/idle, and checks that the footprint reached health.

Each server runs in its **own process** (this script re-run with ``--serve``): in the same
process, 256 client tasks would share the node's event loop and GIL, and the numbers would
mostly measure the client. Separate processes treat both sides alike (as the dispatcher on
another host would). Only 127.0.0.1 is used.

    .venv/bin/python scripts/bench/dispatch.py [--clients 256] [--jobs 32] [--rounds 2]
                                               [--child python|sh] [--ack-only]
                                               [--count 40] [--gap 0.1]

Exit status: 0 whether or not the targets are met; 1 when the run is broken (a server does
not start, a request fails, an ack is not 202, a job ends in ``error``, no footprint).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
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
from benchlib import BrokenRun, pct, serve_node_child, served_run, start_served

ACK_TARGET = 1.5
JOURNAL_TARGET = 1.2
ONE_CLIENT_TARGET = 1.5
"""``--clients 1``: the node's median ack against the bare app's (issue 19)."""
SIDES = {"node": "node, journal on", "nojournal": "node, journal off", "floor": "bare quart-trio"}
POLL_INTERVAL = 0.5
HEALTH_INTERVAL = 0.01
JOB_POLL_INTERVAL = 0.5
HOLD_SECONDS = 2.0
ROUND_TIMEOUT = 60.0
CONNECT_BATCH = 32
STEADY = (0.75, HOLD_SECONDS)
"""Part 2's steady window (s after the dispatch burst): spawns over, no job finished yet."""

# The trivial task (part 1) and the sampled one (part 2): plain Python, no project imports, so
# a child costs one interpreter start. ``hold`` writes its fake-GPU holding atomically.
TRIVIAL = "import sys,json,time; t=time.time(); json.load(sys.stdin); print(json.dumps({'t': t}))"
"""Prints when it began (wall clock): ``--clients 1`` reports each job's start lag from it."""
HOLD = (
    "import json,os,sys,time; json.load(sys.stdin); d=os.environ['FLEET_TRIO_FAKE_GPU_DIR']; "
    "p=os.path.join(d,str(os.getpid())); t=p+'.tmp'; open(t,'w').write('512M'); "
    f"os.rename(t,p); time.sleep({HOLD_SECONDS}); os.unlink(p); print('{{}}')"
)


TRIVIAL_SH = ["/bin/sh", "-c", "cat >/dev/null; echo '{}'"]
ENV_CHILD = "FLEET_BENCH_TRIVIAL"


def trivial_command() -> list[str]:
    """``--child python`` (default: the brief's task) or ``sh`` (a cheaper child, to tell
    the node's own cost from 256 interpreter starts on the same CPUs)."""
    if os.environ.get(ENV_CHILD) == "sh":
        return TRIVIAL_SH
    return [sys.executable, "-c", TRIVIAL]


# ------------------------------------------------------------------------------------------
# server side (``--serve node|floor STATE_DIR``), run in a child process


def write_config(state: Path, journal: bool = True) -> Path:
    fake = state / "gpu"
    cfg = {
        "node": {
            "listen": "127.0.0.1:0",
            "node_id": "bench",
            "footprints": {"path": str(state / "footprints.json")},
            "timings": {"drain_timeout": "3s", "kill_grace": "1s"},
            "journal": {"enabled": journal, "path": str(state / "journal.sqlite")},
        },
        "tasks": {
            "trivial": {"command": trivial_command(), "gpu": False},
            "hold": {
                "family": "bench",
                "footprint": {"family": "bench", "quant": ""},
                "command": [sys.executable, "-c", HOLD],
                "env": {"FLEET_TRIO_FAKE_GPU_DIR": str(fake)},
                "timeout": "30s",
                "gpu": False,
            },
        },
    }
    path = state / ("node.yaml" if journal else "node-nojournal.yaml")
    path.write_text(json.dumps(cfg))  # JSON is YAML
    return path


async def serve_floor_child(url_file: Path) -> None:
    from hypercorn.trio import serve
    from quart import Response, request
    from quart_trio import QuartTrio

    from fleet_trio.node.server import hypercorn_config

    app = QuartTrio("floor")

    @app.post("/fleet/dispatch")
    async def dispatch() -> Response:
        body = json.loads(await request.get_data())
        ack = json.dumps({"job_id": body["job_id"], "status": "accepted"})
        return Response(ack, status=202, content_type="application/json")

    @app.get("/fleet/jobs/<job_id>")
    async def job(job_id: str) -> Response:
        out = json.dumps({"job_id": job_id, "state": "done", "data": {}})
        return Response(out, status=200, content_type="application/json")

    async with trio.open_nursery() as nursery:
        urls: list[str] = await nursery.start(
            lambda task_status: serve(app, hypercorn_config("127.0.0.1:0"), task_status=task_status)
        )
        url_file.write_text(urls[0])
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _ in signals:
                nursery.cancel_scope.cancel()
                break


def serve_main(kind: str, state: Path) -> int:
    url_file = state / f"{kind}.url"
    if kind in ("node", "nojournal"):
        import fleet_trio.gpu.fake as fake

        if not (state / "gpu").exists():
            fake.init_device(str(state / "gpu"), "Fake H200", 141.0)
        config = write_config(state, journal=kind == "node")
        trio.run(serve_node_child, config, state / "gpu", url_file)
    else:
        trio.run(serve_floor_child, url_file)
    return 0


# ------------------------------------------------------------------------------------------
# client side


def start_server(kind: str, state: Path) -> tuple[subprocess.Popen[bytes], str]:
    return start_served(__file__, [kind, str(state)], state / f"{kind}.url", f"{kind} server")


def new_client(url: str, connections: int = 1) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return httpx.AsyncClient(base_url=url, timeout=30, limits=limits)


async def one_job(
    client: httpx.AsyncClient,
    task_type: str,
    payload: dict[str, Any],
    poll_every: float,
    acks: list[float] | None,
) -> None:
    job_id = f"bench-{uuid.uuid4().hex}"
    body = json.dumps({"job_id": job_id, "task_type": task_type, "payload": payload}).encode()
    headers = {"Content-Type": "application/json"}
    t0 = time.perf_counter()
    r = await client.post("/fleet/dispatch", content=body, headers=headers)
    elapsed = (time.perf_counter() - t0) * 1000.0
    if r.status_code != 202 or r.json() != {"job_id": job_id, "status": "accepted"}:
        raise BrokenRun(f"dispatch {job_id}: {r.status_code} {r.text[:200]}")
    if acks is not None:
        acks.append(elapsed)
    while True:  # bounded by the caller's fail_after
        await trio.sleep(poll_every)
        r = await client.get(f"/fleet/jobs/{job_id}")
        state = r.json().get("state")
        if state == "error":
            raise BrokenRun(f"job {job_id} failed: {r.text[:300]}")
        if state == "done":
            return


async def one_ack(client: httpx.AsyncClient) -> tuple[str, float, float]:
    """One dispatch: ``(job id, wall-clock time sent, ack latency ms)``."""
    job_id = f"bench-{uuid.uuid4().hex}"
    body = json.dumps({"job_id": job_id, "task_type": "trivial", "payload": {}}).encode()
    sent = time.time()
    t0 = time.perf_counter()
    r = await client.post(
        "/fleet/dispatch", content=body, headers={"Content-Type": "application/json"}
    )
    elapsed = (time.perf_counter() - t0) * 1000.0
    if r.status_code != 202 or r.json() != {"job_id": job_id, "status": "accepted"}:
        raise BrokenRun(f"dispatch {job_id}: {r.status_code} {r.text[:200]}")
    return job_id, sent, elapsed


async def wait_done(client: httpx.AsyncClient, job_id: str) -> float | None:
    """Poll until ``done``; the child's start stamp (``None``: none, e.g. the sh child)."""
    while True:  # bounded by the caller's fail_after
        view = (await client.get(f"/fleet/jobs/{job_id}")).json()
        if view.get("state") == "error":
            raise BrokenRun(f"job {job_id} failed: {view}")
        if view.get("state") == "done":
            stamp = (view.get("data") or {}).get("t")
            return stamp if isinstance(stamp, float) else None
        await trio.sleep(POLL_INTERVAL)


async def bench_paced(
    urls: dict[str, str], count: int, gap: float, rounds: int, starts: dict[str, list[float]]
) -> dict[str, list[float]]:
    """``--clients 1``: ``rounds`` x ``count`` dispatches per side, one at a time, ``gap`` s
    apart, the sides taking turns dispatch by dispatch (on a machine whose load changes, each
    side then sees the same load); a side's jobs are polled to ``done`` after each round and
    their start lags (ms from sending the dispatch to the child's own stamp) go to
    ``starts``."""
    acks: dict[str, list[float]] = {k: [] for k in urls}
    for k in urls:
        starts[k] = []
    clients = {k: new_client(u) for k, u in urls.items()}
    sides = list(urls)
    try:
        for k in sides:
            await connect([clients[k]])
        for rnd in range(rounds + 1):  # the first round is the warm-up
            sent: dict[str, list[tuple[str, float]]] = {k: [] for k in sides}
            with trio.fail_after(ROUND_TIMEOUT + count * len(sides) * gap):
                for i in range(count if rnd else 5):
                    shift = (rnd + i) % len(sides)
                    for k in sides[shift:] + sides[:shift]:
                        job_id, at, ms = await one_ack(clients[k])
                        sent[k].append((job_id, at))
                        if rnd:
                            acks[k].append(ms)
                        await trio.sleep(gap)
                for k in sides:
                    for job_id, at in sent[k]:
                        stamp = await wait_done(clients[k], job_id)
                        if rnd and stamp is not None:
                            starts[k].append((stamp - at) * 1000.0)
    finally:
        for c in clients.values():
            await c.aclose()
    return acks


async def ack_burst(clients: list[httpx.AsyncClient], acks: list[float] | None) -> None:
    with trio.fail_after(ROUND_TIMEOUT):
        async with trio.open_nursery() as nursery:
            for c in clients:
                nursery.start_soon(one_job, c, "trivial", {}, POLL_INTERVAL, acks)


async def connect(clients: list[httpx.AsyncClient]) -> None:
    """Open every keep-alive connection, CONNECT_BATCH at a time: a burst of 256 connects
    overflows hypercorn's listen backlog (100) and some connections get reset. A dispatcher
    keeps its connections; the burst measures requests, not handshakes."""
    with trio.fail_after(ROUND_TIMEOUT):
        for i in range(0, len(clients), CONNECT_BATCH):
            async with trio.open_nursery() as nursery:
                for c in clients[i : i + CONNECT_BATCH]:
                    nursery.start_soon(c.get, "/fleet/jobs/bench-connect")


async def bench_acks(urls: dict[str, str], n: int, rounds: int) -> dict[str, list[float]]:
    acks: dict[str, list[float]] = {k: [] for k in urls}
    pools = {k: [new_client(u) for _ in range(n)] for k, u in urls.items()}
    try:
        for k in urls:
            await connect(pools[k])
            await ack_burst(pools[k], None)  # warm-up: code paths, job spawns
        sides = list(urls)
        for rnd in range(rounds):
            order = sides[rnd % len(sides) :] + sides[: rnd % len(sides)]
            for k in order:
                await ack_burst(pools[k], acks[k])
                await trio.sleep(0.5)  # let the other side's stragglers settle
    finally:
        for pool in pools.values():
            for c in pool:
                await c.aclose()
    return acks


async def sample_health(
    client: httpx.AsyncClient, out: list[tuple[float, float]], stop: trio.Event
) -> None:
    """Appends (wall-clock start, latency ms)."""
    while not stop.is_set():  # bounded by the caller's fail_after
        wall, t0 = time.time(), time.perf_counter()
        r = await client.get("/fleet/health")
        out.append((wall, (time.perf_counter() - t0) * 1000.0))
        if r.status_code != 200:
            raise BrokenRun(f"health: {r.status_code} {r.text[:200]}")
        await trio.sleep(HEALTH_INTERVAL)


async def dispatcher_main(node_url: str, jobs: int) -> None:
    """``--jobs-client``: the dispatcher of part 2, in its own process (as on another host):
    prints the wall-clock time of its dispatch burst, then dispatches and polls until done."""
    clients = [new_client(node_url) for _ in range(jobs)]
    try:
        await connect(clients)
        print(f"{time.time():.6f}", flush=True)
        with trio.fail_after(ROUND_TIMEOUT):
            async with trio.open_nursery() as nursery:
                for c in clients:
                    nursery.start_soon(one_job, c, "hold", {}, JOB_POLL_INTERVAL, None)
    finally:
        for c in clients:
            await c.aclose()


async def health_window(node_url: str, jobs: int, seconds: float) -> list[tuple[float, float]]:
    """Health samples for ``seconds`` idle (``jobs`` = 0) or until ``jobs`` jobs are done, as
    (seconds since the window's origin, latency ms). The jobs' dispatcher and pollers run in a
    process of their own, so this process only measures health; the origin is their dispatch
    burst (idle: the first sample)."""
    out: list[tuple[float, float]] = []
    stop = trio.Event()
    origin: float | None = None
    async with new_client(node_url) as hc:
        await hc.get("/fleet/health")  # open the connection outside the window
        with trio.fail_after(ROUND_TIMEOUT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(sample_health, hc, out, stop)
                if jobs:
                    argv = [sys.executable, os.path.abspath(__file__), "--jobs-client", node_url]
                    done = await trio.run_process(
                        [*argv, str(jobs)], capture_stdout=True, capture_stderr=True, check=False
                    )
                    if done.returncode != 0:
                        raise BrokenRun(f"dispatcher: {done.stderr.decode()[-500:]}")
                    origin = float(done.stdout.split()[0])
                else:
                    await trio.sleep(seconds)
                stop.set()
    if origin is None:
        origin = out[0][0] if out else 0.0
    return [(wall - origin, ms) for wall, ms in out]


async def bench_health(
    node_url: str, jobs: int, rounds: int
) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    idle: list[tuple[float, float]] = []
    busy: list[tuple[float, float]] = []
    for _ in range(rounds):
        idle += await health_window(node_url, 0, HOLD_SECONDS + 0.5)
        busy += await health_window(node_url, jobs, 0)
    async with new_client(node_url) as c:
        health = (await c.get("/fleet/health")).json()
    prints = [f for f in health.get("model_footprints", []) if f.get("model_family") == "bench"]
    if not prints:
        raise BrokenRun(f"no footprint for the sampled jobs in health: {health}")
    print(f"  footprint in health: {json.dumps(prints[0])}  (512 MiB held x 1.2 margin)")
    return idle, busy


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--clients", type=int, default=256, help="concurrent dispatchers (256)")
    parser.add_argument("--jobs", type=int, default=32, help="sampled jobs in part 2 (32)")
    parser.add_argument("--rounds", type=int, default=2, help="measured rounds per side (2)")
    parser.add_argument(
        "--child",
        choices=("python", "sh"),
        default="python",
        help="part 1's trivial task: a Python child (default) or a cheaper /bin/sh one",
    )
    parser.add_argument("--ack-only", action="store_true", help="part 1 only (the ack latencies)")
    parser.add_argument(
        "--count",
        type=int,
        default=40,
        help="--clients 1: dispatches per round, one at a time (40)",
    )
    parser.add_argument(
        "--gap",
        type=float,
        default=0.1,
        help="--clients 1: seconds between one ack and the next dispatch (0.1)",
    )
    parser.add_argument("--serve", nargs=2, metavar=("KIND", "STATE"), help=argparse.SUPPRESS)
    parser.add_argument("--jobs-client", nargs=2, metavar=("URL", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        return serve_main(args.serve[0], Path(args.serve[1]))
    if args.jobs_client:
        try:
            trio.run(dispatcher_main, args.jobs_client[0], int(args.jobs_client[1]))
        except BrokenRun as exc:
            print(exc, file=sys.stderr)
            return 1
        return 0
    if args.clients < 1 or args.jobs < 1 or args.rounds < 1 or args.count < 1:
        parser.error("--clients, --jobs, --rounds and --count must be >= 1")
    if not 0 <= args.gap <= 10:
        parser.error("--gap must be within 0..10 seconds")

    os.environ[ENV_CHILD] = args.child  # read by the node child's config
    with tempfile.TemporaryDirectory(prefix="fleet-bench-dispatch-") as tmp:
        state = Path(tmp)
        with served_run() as procs:
            urls: dict[str, str] = {}
            for kind in SIDES:
                proc, urls[kind] = start_server(kind, state)
                procs.append(proc)
            if args.clients == 1:
                starts: dict[str, list[float]] = {}
                acks = trio.run(bench_paced, urls, args.count, args.gap, args.rounds, starts)
                print(
                    f"ack latency: 1 client, {args.count} dispatches {args.gap * 1000:g} ms "
                    f"apart x {args.rounds} rounds per side (+5 warm-up), trivial {args.child} "
                    f"task, servers in their own processes, {os.cpu_count()} CPUs"
                )
            else:
                acks = trio.run(bench_acks, urls, args.clients, args.rounds)
                print(
                    f"ack latency: {args.clients} concurrent clients x {args.rounds} rounds per "
                    f"side (+1 warm-up), trivial {args.child} task, servers in their own "
                    f"processes, {os.cpu_count()} CPUs"
                )
            for k, label in SIDES.items():
                v = acks[k]
                print(
                    f"  {label:<20} p50 {pct(v, 0.5):8.2f} ms   p99 {pct(v, 0.99):8.2f} ms   "
                    f"(mean {statistics.fmean(v):.2f}, n {len(v)})"
                )
            if args.clients == 1:
                for k in ("node", "nojournal"):
                    v = starts[k]
                    if v:
                        print(
                            f"  {SIDES[k]:<20} job start (dispatch sent -> child running) "
                            f"p50 {pct(v, 0.5):.2f} ms  p90 {pct(v, 0.9):.2f} ms"
                        )
                for k, label in (("node", "journal on"), ("nojournal", "journal off")):
                    r50 = pct(acks[k], 0.5) / pct(acks["floor"], 0.5)
                    ok = "ok" if r50 <= ONE_CLIENT_TARGET else "ABOVE TARGET"
                    print(
                        f"  ratio p50 node/floor {r50:.2f} ({label})   "
                        f"(target <= {ONE_CLIENT_TARGET}: {ok})"
                    )
            p99n, p99f = pct(acks["node"], 0.99), pct(acks["floor"], 0.99)
            ratio = p99n / p99f
            verdict = "ok" if ratio <= ACK_TARGET else "ABOVE TARGET"
            print(f"  ratio p99 node/floor {ratio:.2f}   (target <= {ACK_TARGET}: {verdict})")
            print(f"  p99 difference       {p99n - p99f:+.2f} ms (client-side time cancels out)")
            on, off = acks["node"], acks["nojournal"]
            r50 = pct(on, 0.5) / pct(off, 0.5)
            r99 = pct(on, 0.99) / pct(off, 0.99)
            ok = "ok" if max(r50, r99) <= JOURNAL_TARGET else "ABOVE TARGET"
            print(
                f"  journal on/off       p50 {r50:.2f}   p99 {r99:.2f}   "
                f"(target <= {JOURNAL_TARGET}: {ok})"
            )
            if args.ack_only:
                return 0

            print(
                f"health latency: {args.jobs} jobs holding 512 MiB of the fake GPU for "
                f"{HOLD_SECONDS:g} s, sampled every 500 ms, vs idle; {args.rounds} rounds"
            )
            idle_s, busy_s = trio.run(bench_health, urls["node"], args.jobs, args.rounds)
            idle = [ms for _, ms in idle_s]
            busy = [ms for _, ms in busy_s]
            # steady: every job spawned and being sampled, none finished yet
            steady = [ms for t, ms in busy_s if STEADY[0] <= t < STEADY[1]]
            rows = [
                ("idle node", idle),
                (f"{args.jobs} jobs, whole", busy),
                (f"  steady {STEADY[0]:g}-{STEADY[1]:g} s", steady),
            ]
            for label, v in rows:
                if not v:
                    raise BrokenRun(f"no health samples for {label.strip()}")
                print(
                    f"  {label:<20} p50 {pct(v, 0.5):8.2f} ms   p99 {pct(v, 0.99):8.2f} ms   "
                    f"(n {len(v)})"
                )
            p99i = pct(idle, 0.99)
            print(
                f"  ratio p99 busy/idle  {pct(busy, 0.99) / p99i:.2f} whole, "
                f"{pct(steady, 0.99) / p99i:.2f} steady   (target: unchanged, ~1)"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
