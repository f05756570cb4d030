"""Per-job overhead of ``fleet-trio worker``: N back-to-back ``true`` jobs through the worker.

Starts the simulated rc controller (``fleet_trio.sim``) and a real worker with the production
timings (idle-poll floor 250 ms, poll wait 30 s, heartbeat 10 s) — by default a
:class:`Worker` as a trio task in this process, as ``tests/worker/test_worker.py`` does; with
``--subprocess`` the ``fleet-trio worker -c <tmp yaml>`` command as a child process (own RSS,
own core) — then, in one run:

1. worker jobs:  N jobs ``true``, each submitted only after the controller has recorded the
                 previous one's terminal status; latency = submit → ``succeeded`` recorded,
                 split by the controller's timestamps into pick-up (submit → handed out by a
                 poll answer), → ``running`` report in, → terminal report in;
2. baselines:    N each of ``run(JobSpec(["true"]), NullSink())``, the same with the
                 RC_JOB_ID sweep the worker asks for, and ``trio.run_process(["true"])``,
                 interleaved with a rotating order (as ``spawn.py`` / ``sweep.py`` do);
3. round trip:   N heartbeats through a :class:`ControllerClient` (the worker's client class):
                 one HTTP round trip to the sim, server side included.

Prints jobs/s, the medians, the worker's share of a job's latency (worker job median −
run_process median; target: a few ms, flagged above ``TARGET_SHARE_MS``; exit 1 then), whether
each job was handed to a long poll already parked at the submit or raced the poll (the 250 ms
idle-poll floor would show as pick-ups ≥ 200 ms), and RSS: in-process, of this process (worker
+ sim + bench; the growth across the worker's start is shown), with ``--subprocess``, of the
worker process itself (VmRSS, VmHWM).

    .venv/bin/python scripts/bench/worker_jobs.py [-n 100] [--warmup 5] [--subprocess] [--profile]

``--profile`` cProfiles the job phase of this process (in-process: worker + sim) and prints the
own time per package in ms per job, then the top functions.
"""

from __future__ import annotations

import cProfile
import functools
import pathlib
import pstats
import resource
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager

import attrs
import trio

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from benchlib import job_bench_parser

from fleet_trio.proc.run import run
from fleet_trio.proc.sinks import NullSink
from fleet_trio.proc.spec import JobSpec
from fleet_trio.sim import SimController, serve_controller
from fleet_trio.worker.client import ControllerClient
from fleet_trio.worker.config import DeviceConfig, WorkerConfig
from fleet_trio.worker.worker import Worker, WorkerTimings, serve_worker

TARGET_SHARE_MS = 10.0
"""The worker's share of one job's latency should be a few ms; above this is flagged."""

SELF = "self"
TOKEN = "wtok"
TRUE = shutil.which("true") or "/bin/true"
HOST = "benchbox"
DEVICE = f"{HOST}:gpu0"
TERMINAL = frozenset({"succeeded", "failed", "killed", "lost"})


def rss_kib(pid: int | str, field: str) -> int:
    """``VmRSS`` / ``VmHWM`` of ``pid`` (``"self"``) in KiB, from /proc/<pid>/status."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    return 0


def max_rss_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


@attrs.define
class JobSample:
    """One job's timeline; every stage in ms, from the controller's own timestamps."""

    total_ms: float
    """submit → the bench sees ``succeeded`` (perf_counter)."""
    pickup_ms: float
    """submit → the controller hands the job out (a poll answer)."""
    to_running_ms: float
    """hand-out → the worker's ``running`` report reaches the controller."""
    to_terminal_ms: float
    """``running`` → the terminal report reaches the controller (the process runs in here)."""
    parked: bool
    """The poll that delivered the job had reached the controller before the submit."""


@attrs.define
class Results:
    jobs: list[JobSample] = attrs.Factory(list)
    wall_s: float = 0.0
    ours: list[float] = attrs.Factory(list)
    base: list[float] = attrs.Factory(list)
    swept: list[float] = attrs.Factory(list)
    rtt: list[float] = attrs.Factory(list)
    rss: list[tuple[str, int]] = attrs.Factory(list)
    """(what, KiB) in the order taken."""
    worker_pid: int = 0


async def one_job(ctrl: SimController) -> JobSample:
    t0 = time.perf_counter()
    start = trio.current_time()
    job_id = ctrl.submit(DEVICE, [TRUE])
    await ctrl.wait_for(lambda: TERMINAL.intersection(ctrl.statuses(job_id)), timeout=10.0)
    total = (time.perf_counter() - t0) * 1000.0
    statuses = ctrl.statuses(job_id)
    if statuses != ["running", "succeeded"]:
        raise RuntimeError(f"job {job_id}: statuses {statuses}")
    job = ctrl.job(job_id)
    assert job.started_at is not None
    reports = {
        r.json()["state"]: r.at
        for r in ctrl.requests("status")
        if r.path == f"/v1/jobs/{job_id}/status" and r.outcome == "handled"
    }
    delivering = max(p.at for p in ctrl.polls() if p.at <= job.started_at)
    return JobSample(
        total_ms=total,
        pickup_ms=(job.started_at - start) * 1000.0,
        to_running_ms=(reports["running"] - job.started_at) * 1000.0,
        to_terminal_ms=(reports["succeeded"] - reports["running"]) * 1000.0,
        parked=delivering < start,
    )


async def via_run() -> None:
    result = await run(JobSpec(command=["true"]), NullSink())
    assert result.exit_code == 0 and not result.killed, result


async def via_run_sweep() -> None:
    """``run()`` as the worker calls it for a job: with the RC_JOB_ID marker sweep after it."""
    job_id = f"bench-{uuid.uuid4()}"
    spec = JobSpec(command=["true"], env={"RC_JOB_ID": job_id}, sweep_job_id=job_id)
    result = await run(spec, NullSink())
    assert result.exit_code == 0 and not result.killed, result


async def via_run_process() -> None:
    done = await trio.run_process([TRUE], check=False)
    assert done.returncode == 0


async def timed(fn: Callable[[], Awaitable[None]]) -> float:
    start = time.perf_counter()
    await fn()
    return (time.perf_counter() - start) * 1000.0


@asynccontextmanager
async def in_process_worker(ctrl: SimController, url: str) -> AsyncIterator[None]:
    """A real :class:`Worker` as a trio task in this process (as tests/worker does)."""
    config = WorkerConfig(
        controller_url=url,
        token=TOKEN,
        host=HOST,
        devices=(DeviceConfig(name="gpu0"),),
        sheet_dir="/nonexistent",
    )
    worker = Worker(config, timings=WorkerTimings(probe_interval=float("inf")))
    async with trio.open_nursery() as nursery:
        with trio.fail_after(10):
            await nursery.start(serve_worker, worker)  # started: registered, loops running
            await ctrl.wait_for(lambda: ctrl.polls(), timeout=10)
        yield
        worker.request_shutdown("benchmark over")  # serve_worker's shutdown is bounded


def worker_command() -> list[str]:
    exe = pathlib.Path(sys.executable).parent / "fleet-trio"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "fleet_trio"]


@asynccontextmanager
async def subprocess_worker(ctrl: SimController, url: str) -> AsyncIterator[int]:
    """``fleet-trio worker -c <tmp>.yaml`` as a child process (config defaults otherwise)."""
    with tempfile.TemporaryDirectory(prefix="bench-worker-") as tmp:
        cfg = pathlib.Path(tmp) / "worker.yaml"
        cfg.write_text(
            f"controller_url: {url}\ntoken: {TOKEN}\nhost: {HOST}\n"
            f"sheet_dir: {tmp}\ndevices:\n  - gpu0\n"
        )
        async with trio.open_nursery() as nursery:
            child: trio.Process = await nursery.start(
                functools.partial(
                    trio.run_process, [*worker_command(), "worker", "-c", str(cfg)], check=False
                )
            )
            await ctrl.wait_for(lambda: ctrl.workers() and ctrl.polls(), timeout=30)
            yield child.pid
            child.send_signal(signal.SIGTERM)
            with trio.fail_after(15):
                await child.wait()


async def bench(
    n: int, warmup: int, subprocess: bool, prof: cProfile.Profile | None = None
) -> Results:
    res = Results()
    ctrl = SimController(token=TOKEN, reaper_interval=1.0, startup_grace=0.0)
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_controller, ctrl)
        res.rss.append(("this process, sim only", rss_kib(SELF, "VmRSS")))
        async with AsyncExitStack() as stack:
            if subprocess:
                pid = await stack.enter_async_context(subprocess_worker(ctrl, url))
                res.worker_pid = pid
                res.rss.append(("worker process, registered", rss_kib(pid, "VmRSS")))
            else:
                await stack.enter_async_context(in_process_worker(ctrl, url))
                res.rss.append(("this process, worker up", rss_kib(SELF, "VmRSS")))

            for _ in range(warmup):
                await one_job(ctrl)
            if prof is not None:
                prof.enable()
            t0 = time.perf_counter()
            for _ in range(n):
                res.jobs.append(await one_job(ctrl))
            res.wall_s = time.perf_counter() - t0
            if prof is not None:
                prof.disable()
            if subprocess:
                res.rss.append(("worker process, after the jobs", rss_kib(res.worker_pid, "VmRSS")))
                res.rss.append(("worker process, peak (VmHWM)", rss_kib(res.worker_pid, "VmHWM")))
            else:
                res.rss.append(("this process, after the jobs", rss_kib(SELF, "VmRSS")))

            for _ in range(warmup):
                await via_run()
                await via_run_process()
                await via_run_sweep()
            sides = [(via_run, res.ours), (via_run_process, res.base), (via_run_sweep, res.swept)]
            for i in range(n):
                shift = i % len(sides)  # rotate, so no variant always runs first
                for fn, out in sides[shift:] + sides[:shift]:
                    out.append(await timed(fn))

            worker_id = ctrl.workers()[0].worker_id
            async with ControllerClient(url, TOKEN) as client:
                for _ in range(warmup):
                    await client.heartbeat(worker_id, [])
                for _ in range(n):
                    t = time.perf_counter()
                    await client.heartbeat(worker_id, [])
                    res.rtt.append((time.perf_counter() - t) * 1000.0)
        nursery.cancel_scope.cancel()
    if not subprocess:
        res.rss.append(("this process, peak (ru_maxrss)", max_rss_kib()))
    return res


BUCKETS = (
    ("fleet_trio/worker/", "fleet_trio.worker"),
    ("fleet_trio/proc/", "fleet_trio.proc"),
    ("fleet_trio/sim/", "fleet_trio.sim (controller)"),
    ("fleet_trio/", "fleet_trio (other)"),
    ("/httpx/", "httpx (worker's client)"),
    ("/httpcore/", "httpcore (worker's client)"),
    ("/h11/", "h11 (both sides)"),
    ("/hypercorn/", "hypercorn (sim server)"),
    ("/quart", "quart/quart_trio (sim server)"),
    ("/werkzeug/", "werkzeug (sim server)"),
    ("/trio/", "trio"),
    ("/cattrs/", "cattrs"),
)


def print_profile(prof: cProfile.Profile, n: int) -> None:
    """Own time (tottime) per package over the job phase, in ms per job, then the top functions."""
    stats = pstats.Stats(prof)
    raw: dict[tuple[str, int, str], tuple[int, int, float, float, object]] = stats.stats  # type: ignore[attr-defined]
    per: dict[str, float] = {}
    for (filename, _line, name), (_cc, _nc, tottime, _ct, _callers) in raw.items():
        if "select.epoll" in name:
            bucket = "idle (epoll wait)"
        else:
            bucket = next((b for key, b in BUCKETS if key in filename), "other (stdlib, builtins)")
        per[bucket] = per.get(bucket, 0.0) + tottime
    total = sum(per.values())
    print(f"profile (job phase, own time, ms/job; total {total * 1000.0 / n:.3f}, profiled)")
    for bucket, t in sorted(per.items(), key=lambda kv: -kv[1]):
        print(f"  {bucket:<32} {t * 1000.0 / n:8.3f}")
    stats.sort_stats("tottime").print_stats(25)


def p90(xs: list[float]) -> float:
    return min(statistics.quantiles(xs, n=10)[-1], max(xs)) if len(xs) >= 2 else xs[0]


def main(argv: list[str] | None = None) -> int:
    parser = job_bench_parser(__doc__.splitlines()[0], n=100, n_help="jobs (and baseline runs)")
    parser.add_argument(
        "--subprocess",
        action="store_true",
        help="run `fleet-trio worker -c <tmp yaml>` as a child process instead of a trio task",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="cProfile the job phase (this process: in-process worker + sim), own time per package",
    )
    args = parser.parse_args(argv)

    prof = cProfile.Profile() if args.profile else None
    res = trio.run(bench, args.n, args.warmup, args.subprocess, prof)
    jobs = res.jobs
    total = [j.total_ms for j in jobs]
    m_total = statistics.median(total)
    m_base = statistics.median(res.base)
    m_ours = statistics.median(res.ours)
    m_rtt = statistics.median(res.rtt)
    share = m_total - m_base

    def med(xs: list[float]) -> str:
        return f"{statistics.median(xs):7.3f} ms (p90 {p90(xs):7.3f}, max {max(xs):7.3f})"

    mode = "`fleet-trio worker` child process" if args.subprocess else "in-process worker task"
    print(
        f"jobs                {args.n} back-to-back `true` ({args.warmup} warm-up), one device,"
        f" {mode}"
    )
    print(f"throughput          {args.n / res.wall_s:.1f} jobs/s   ({res.wall_s:.2f} s wall)")
    print(f"worker job          {med(total)}  submit -> `succeeded` seen by the bench")
    print(f"  pick-up           {med([j.pickup_ms for j in jobs])}  submit -> handed out by a poll")
    print(f"  to running        {med([j.to_running_ms for j in jobs])}  -> `running` report in")
    print(f"  to terminal       {med([j.to_terminal_ms for j in jobs])}  -> `succeeded` report in")
    print(f"run()               {med(res.ours)}")
    print(f"run() + sweep       {med(res.swept)}  with sweep_job_id, as the worker runs a job")
    print(f"run_process         {med(res.base)}")
    print(f"sim round trip      {med(res.rtt)}  one heartbeat through the worker's client")
    verdict = "ok" if share <= TARGET_SHARE_MS else "ABOVE TARGET"
    print(
        f"worker share        {share:7.3f} ms/job  worker job - run_process (medians)"
        f"   target <= {TARGET_SHARE_MS:g} ms: {verdict}"
    )
    print(f"  above run()       {m_total - m_ours:7.3f} ms/job  worker job - run() (medians)")
    m_swept = statistics.median(res.swept)
    print(f"  above run()+sweep {m_total - m_swept:7.3f} ms/job  worker job - run() + sweep")
    print(
        f"  less 3 round trips{m_total - m_swept - 3 * m_rtt:7.3f} ms/job  worker job - run()"
        " + sweep - 3 sim round trips (poll answer, running, terminal; server side included)"
    )
    parked = [j for j in jobs if j.parked]
    raced = [j for j in jobs if not j.parked]
    print(
        f"poll race           {len(parked)}/{len(jobs)} jobs handed out to a long poll already"
        f" parked at submit; {len(raced)} to a poll that arrived after the submit"
    )
    if raced:
        print(f"  raced jobs        {med([j.total_ms for j in raced])}")
    slow = sum(1 for j in jobs if j.pickup_ms >= 200.0)
    print(f"  pick-ups >= 200ms {slow} (the 250 ms idle-poll floor would show here)")
    for what, kib in res.rss:
        print(f"RSS                 {kib / 1024.0:7.1f} MiB  {what}")
    if not args.subprocess:
        grown = res.rss[2][1] - res.rss[0][1]
        print(
            f"  worker's part     {grown / 1024.0:7.1f} MiB  VmRSS after the jobs - before the"
            " worker started (same process as the sim; --subprocess for its own RSS)"
        )
    if prof is not None:
        print_profile(prof, args.n)
    return 0 if share <= TARGET_SHARE_MS else 1


if __name__ == "__main__":
    raise SystemExit(main())
