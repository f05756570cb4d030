"""How long a worker holds a job, and its CPU per job: ``fleet-trio worker`` against the
thinnest protocol-speaking worker (``thin_worker.py``), side by side in one run.

Both run as child processes against the simulated rc controller served by this process:

* **hold time**, from the controller's own timestamps: the assignment leaves the controller
  (the poll answer that hands it out) → the terminal status report has arrived;
* **CPU per job**: the worker process's own user+sys time (``/proc/PID/stat`` fields 14–15)
  over the timed jobs, divided by their number; its children's (the job, the verify script,
  fields 16–17) is shown apart.

``fleet-trio worker`` runs with its production timings and one verify script configured
(``#!/bin/sh`` ``exit 0``); the thin worker has none (no verify, sweep, log upload, live log).

Modes: ``--mode seq`` (default) submits ``true`` jobs one at a time, each once the previous
one's terminal status is in; ``--mode burst`` submits ``--burst`` (30) at once to the one
device and measures the wall time per job until the last is terminal (repeated ``--rounds``).

    .venv/bin/python scripts/bench/worker_hold.py [-n 60] [--mode seq|burst] [--burst 30]

Prints the medians and p90 of each side, the time above the thin worker (median difference;
the issue's target: ≤ 20 ms for a ``true`` job with a verify pass) and the CPU ratio.
"""

from __future__ import annotations

import argparse
import functools
import os
import pathlib
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import attrs
import trio

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from benchlib import job_bench_parser, pct

from fleet_trio.sim import SimController, serve_controller

TOKEN = "wtok"
TRUE = shutil.which("true") or "/bin/true"
TERMINAL = frozenset({"succeeded", "failed", "killed", "lost"})
TARGET_ABOVE_MS = 20.0
TICK = os.sysconf("SC_CLK_TCK")
HERE = pathlib.Path(__file__).resolve().parent


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(own user+sys, waited-for children's user+sys) of ``pid`` in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # fields[0] is field 3 (state): utime is field 14 → index 11
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return (utime + stime) / TICK, (cutime + cstime) / TICK


@attrs.define
class Side:
    name: str
    hold_ms: list[float] = attrs.Factory(list)
    per_job_ms: list[float] = attrs.Factory(list)
    """Burst mode: the round's wall time / its jobs."""
    cpu_s: float = 0.0
    child_cpu_s: float = 0.0
    jobs: int = 0
    device: str = ""
    pid: int = 0


def fleet_trio_command(
    tmp: pathlib.Path, url: str, host: str, profile: str = "", tree: str = ""
) -> list[str]:
    """``fleet-trio worker`` with one verify script; ``tree``: a source tree of another
    version (its ``fleet_trio`` package is run instead, e.g. the one before a change)."""
    tmp = tmp / host
    tmp.mkdir()
    verify = tmp / "verify.d"
    verify.mkdir()
    script = verify / "10-clean"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o755)
    cfg = tmp / "worker.yaml"
    cfg.write_text(
        f"controller_url: {url}\ntoken: {TOKEN}\nhost: {host}\nsheet_dir: {tmp}\n"
        f"verify_dir: {verify}\ndevices:\n  - gpu0\n"
    )
    exe = pathlib.Path(sys.executable).parent / "fleet-trio"
    base = [str(exe)] if exe.exists() else [sys.executable, "-m", "fleet_trio"]
    if profile:
        base = [sys.executable, str(HERE / "cpu_profile.py"), profile, "-m", "fleet_trio"]
    if tree:
        # In TREE: ``-m`` puts the working directory first on sys.path, ahead of an
        # editable install of this tree.
        base = ["env", "-C", tree, f"PYTHONPATH={tree}", sys.executable, "-m", "fleet_trio"]
    return [*base, "worker", "-c", str(cfg)]


def thin_command(url: str, host: str) -> list[str]:
    return [sys.executable, str(HERE / "thin_worker.py"), url, TOKEN, host, "gpu0"]


@asynccontextmanager
async def child(ctrl: SimController, argv: list[str], host: str) -> AsyncIterator[int]:
    async with trio.open_nursery() as nursery:
        proc: trio.Process = await nursery.start(
            functools.partial(
                trio.run_process,
                argv,
                check=False,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        await ctrl.wait_for(
            lambda: any(w.host == host for w in ctrl.workers()) and ctrl.polls(), timeout=30
        )
        yield proc.pid
        proc.send_signal(signal.SIGTERM)
        with trio.fail_after(15):
            await proc.wait()


def hold_ms(ctrl: SimController, job_id: str) -> float:
    job = ctrl.job(job_id)
    assert job.started_at is not None
    ends = [
        r.at
        for r in ctrl.requests("status")
        if r.path == f"/v1/jobs/{job_id}/status"
        and r.outcome == "handled"
        and r.json().get("state") in TERMINAL
    ]
    return (min(ends) - job.started_at) * 1000.0


async def wait_terminal(ctrl: SimController, job_ids: list[str]) -> None:
    def done() -> bool:
        return all(TERMINAL.intersection(ctrl.statuses(j)) for j in job_ids)

    try:
        await ctrl.wait_for(done, timeout=60.0)
    except trio.TooSlowError:
        stuck = {j: ctrl.job(j).state for j in job_ids if not TERMINAL & set(ctrl.statuses(j))}
        raise RuntimeError(f"jobs not terminal after 60 s: {stuck}") from None
    for j in job_ids:
        if ctrl.statuses(j)[-1] != "succeeded":
            raise RuntimeError(f"job {j}: statuses {ctrl.statuses(j)}")


async def one_round(ctrl: SimController, side: Side, args: argparse.Namespace) -> None:
    """One timed job (seq) or one burst of jobs (burst) on ``side``'s device."""
    if args.mode == "seq":
        j = ctrl.submit(side.device, [TRUE])
        try:
            await wait_terminal(ctrl, [j])
        except RuntimeError as exc:
            raise RuntimeError(f"{side.name}: {exc}") from None
        side.hold_ms.append(hold_ms(ctrl, j))
        side.jobs += 1
        return
    t0 = time.perf_counter()
    ids = [ctrl.submit(side.device, [TRUE]) for _ in range(args.burst)]
    await wait_terminal(ctrl, ids)
    side.per_job_ms.append((time.perf_counter() - t0) * 1000.0 / args.burst)
    side.hold_ms.extend(hold_ms(ctrl, j) for j in ids)
    side.jobs += args.burst


async def bench(args: argparse.Namespace) -> list[Side]:
    """Both workers up at once, each with its own device; their jobs interleaved (the order
    alternates), so that the machine's noise hits both alike."""
    ctrl = SimController(token=TOKEN, reaper_interval=1.0, startup_grace=0.0)
    sides = [Side("thin"), Side("fleet-trio")]
    if args.before:
        sides.insert(1, Side("before"))
    async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
        url = await nursery.start(serve_controller, ctrl)
        tmp = pathlib.Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-hold-")))
        for side in sides:
            host = f"bench-{side.name}"
            side.device = f"{host}:gpu0"
            if side.name == "thin":
                argv = thin_command(url, host)
            elif side.name == "before":
                argv = fleet_trio_command(tmp, url, host, tree=args.before)
            else:
                argv = fleet_trio_command(tmp, url, host, args.profile)
            side.pid = await stack.enter_async_context(child(ctrl, argv, host))
        for side in sides:
            warm = [ctrl.submit(side.device, [TRUE]) for _ in range(args.warmup)]
            await wait_terminal(ctrl, warm)
        for side in sides:
            side.cpu_s, side.child_cpu_s = cpu_seconds(side.pid)
        rounds = args.n if args.mode == "seq" else args.rounds
        for i in range(rounds):
            for side in sides if i % 2 == 0 else sides[::-1]:
                await one_round(ctrl, side, args)
        for side in sides:
            own, kids = cpu_seconds(side.pid)
            side.cpu_s, side.child_cpu_s = own - side.cpu_s, kids - side.child_cpu_s
        await stack.aclose()  # the workers stop (SIGTERM, their drain) while the controller serves
        nursery.cancel_scope.cancel()
    return sides


def main(argv: list[str] | None = None) -> int:
    description = __doc__.split("\n\n")[0].replace("\n", " ")
    parser = job_bench_parser(description, n=60, n_help="seq mode: timed jobs")
    parser.add_argument("--mode", choices=("seq", "burst"), default="seq")
    parser.add_argument("--burst", type=int, default=30, help="burst mode: jobs at once")
    parser.add_argument("--rounds", type=int, default=2, help="burst mode: rounds (default 2)")
    parser.add_argument(
        "--before",
        default="",
        metavar="TREE",
        help="also run the fleet_trio package found in TREE (e.g. `git worktree add` of an"
        " older commit) as a third side, `before`",
    )
    parser.add_argument(
        "--profile", default="", metavar="FILE", help="CPU-profile the fleet-trio worker into FILE"
    )
    args = parser.parse_args(argv)
    sides = trio.run(bench, args)
    thin = sides[0]

    def row(xs: list[float]) -> str:
        return f"median {statistics.median(xs):8.2f}  p90 {pct(xs, 0.9):8.2f}  max {max(xs):8.2f}"

    what = (
        f"{args.n} `true` jobs one at a time"
        if args.mode == "seq"
        else f"{args.rounds} rounds of {args.burst} `true` jobs submitted at once"
    )
    print(f"worker hold  {what}, interleaved; fleet-trio with one verify script; ms")
    for s in sides:
        print(f"  hold  {s.name:<11} {row(s.hold_ms)}")
    if args.mode == "burst":
        for s in sides:
            print(f"  wall/job {s.name:<8} {row(s.per_job_ms)}")
    for s in sides[1:]:
        above = statistics.median(s.hold_ms) - statistics.median(thin.hold_ms)
        ratio = statistics.median(s.hold_ms) / statistics.median(thin.hold_ms)
        verdict = "ok" if above <= TARGET_ABOVE_MS else "ABOVE TARGET"
        print(
            f"  above thin  {s.name:<11}{above:8.2f} ms (medians; ratio {ratio:.2f})"
            f"   target <= {TARGET_ABOVE_MS:g} ms: {verdict}"
        )
    for s in sides:
        print(
            f"  cpu   {s.name:<11} {s.cpu_s * 1000.0 / s.jobs:8.2f} ms/job own (user+sys),"
            f" children {s.child_cpu_s * 1000.0 / s.jobs:8.2f} ms/job"
        )
    if thin.cpu_s > 0:
        for s in sides[1:]:
            print(f"  cpu ratio   {s.name:<11}{s.cpu_s / thin.cpu_s:8.2f} (/ thin, own)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
