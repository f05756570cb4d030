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

``--go [PATH]`` measures against the real thing instead: the thin worker, the Go ``rc worker``
and ``fleet-trio worker``, all up at once, each on its own real rc controller (``rc serve``
on loopback, its own ``--data`` and port) behind a timestamping proxy (``rc_proxy.py``:
``TCP_NODELAY``, each answer written in one send), ``true`` jobs submitted with the real CLI
(``rc run -d HOST:gpu0 -- true``) round-robin across the three. Hold time is the proxy's
(the poll answer handing the job out written → the terminal report read); CPU per job as
above; Go and fleet-trio read the same config with the same one verify script. Defaults
there: ``-n 100`` jobs per worker, ``--rounds 1`` in burst mode (the controller assigns on a
1 s tick). PATH is the ``rc`` binary or its tarball (default
``../shared/tools/rc-ref/rc-ref.tar.gz`` beside the repository); without one it prints one
line and exits 0. Everything it starts is stopped by pid on exit, Ctrl-C and SIGTERM.

    .venv/bin/python scripts/bench/worker_hold.py --go [PATH] [-n 100] [--mode burst]
"""

from __future__ import annotations

import argparse
import functools
import os
import pathlib
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import attrs
import trio

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from benchlib import describe, job_bench_parser, pct
from rc_proxy import Stamps, serve_proxy

from fleet_trio.sim import SimController, serve_controller
from fleet_trio.sim.fleet import free_port

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


def verify_dir(tmp: pathlib.Path) -> pathlib.Path:
    """``tmp/verify.d`` with the one verify script (``#!/bin/sh`` ``exit 0``)."""
    verify = tmp / "verify.d"
    verify.mkdir()
    script = verify / "10-clean"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o755)
    return verify


def worker_config(tmp: pathlib.Path, url: str, host: str, verify: pathlib.Path) -> pathlib.Path:
    """``tmp/HOST/worker.yaml``: the config both ``fleet-trio worker`` and ``rc worker`` read."""
    tmp = tmp / host
    tmp.mkdir()
    cfg = tmp / "worker.yaml"
    cfg.write_text(
        f"controller_url: {url}\ntoken: {TOKEN}\nhost: {host}\nsheet_dir: {tmp}\n"
        f"verify_dir: {verify}\ndevices:\n  - gpu0\n"
    )
    return cfg


def fleet_trio_command(
    tmp: pathlib.Path, url: str, host: str, profile: str = "", tree: str = ""
) -> list[str]:
    """``fleet-trio worker`` with one verify script; ``tree``: a source tree of another
    version (its ``fleet_trio`` package is run instead, e.g. the one before a change)."""
    own = tmp / host
    own.mkdir()
    cfg = worker_config(own, url, host, verify_dir(own))
    return fleet_trio_argv(cfg, profile, tree)


def fleet_trio_argv(cfg: pathlib.Path, profile: str = "", tree: str = "") -> list[str]:
    """``fleet-trio worker -c CFG`` (see :func:`fleet_trio_command` for the options)."""
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


# --- --go: the thin worker, the Go `rc worker` and `fleet-trio worker`, each on a real rc ---

ROOT = HERE.parent.parent
RC_REF = pathlib.Path("tools/rc-ref/rc-ref.tar.gz")
RC_TOKENS = f"{TOKEN}:worker,ctok:client,atok:admin"
_JOB_LINE = re.compile(r"job ([0-9a-f][0-9a-f-]{7,})")


def default_go() -> pathlib.Path:
    """``../shared/tools/rc-ref/rc-ref.tar.gz`` beside the repository, or beside the main
    checkout when this one is a ``git worktree`` (its ``.git`` is a file naming the main one)."""
    candidates = [ROOT.parent / "shared" / RC_REF]
    git = ROOT / ".git"
    if git.is_file():
        text = git.read_text().strip()
        if text.startswith("gitdir:"):
            common = pathlib.Path(text.split(":", 1)[1].strip())
            # MAIN/.git/worktrees/NAME -> MAIN
            candidates.append(common.parent.parent.parent.parent / "shared" / RC_REF)
    return next((c for c in candidates if c.exists()), candidates[0])


def rc_binary(path: pathlib.Path, tmp: pathlib.Path) -> pathlib.Path | None:
    """The ``rc`` binary: ``path`` itself, or its member ``rc`` unpacked into ``tmp`` when
    ``path`` is a tarball; None when there is none."""
    if not path.is_file():
        return None
    if tarfile.is_tarfile(path):
        with tarfile.open(path) as tar:
            member = next(
                (m for m in tar.getmembers() if m.isfile() and m.name.endswith("rc")), None
            )
            if member is None:
                return None
            src = tar.extractfile(member)
            assert src is not None
            out = tmp / "rc"
            out.write_bytes(src.read())
        out.chmod(0o755)
        return out
    return path if os.access(path, os.X_OK) else None


@attrs.define
class GoSide:
    name: str
    stamps: Stamps = attrs.Factory(Stamps)
    hold_ms: list[float] = attrs.Factory(list)
    per_job_ms: list[float] = attrs.Factory(list)
    cpu_s: float = 0.0
    child_cpu_s: float = 0.0
    jobs: int = 0
    device: str = ""
    pid: int = 0
    controller: str = ""


def start(
    procs: list[subprocess.Popen[bytes]], argv: list[str], log: pathlib.Path, **kw: object
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a session of its own (a Ctrl-C reaches only this process, which then
    stops it by pid), its output into ``log``; recorded in ``procs`` for :func:`stop_all`."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **kw,  # type: ignore[call-overload]
        )
    procs.append(proc)
    return proc


def stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each process this run started (the last started first), SIGKILL after 15 s."""
    for proc in reversed(procs):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def wait_listening(port: int, proc: subprocess.Popen[bytes], log: pathlib.Path) -> None:
    with trio.fail_after(30):
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"rc serve exited: {log.read_text()[-500:]}")
            try:
                stream = await trio.open_tcp_stream("127.0.0.1", port)
            except OSError:
                await trio.sleep(0.05)
                continue
            await stream.aclose()
            return


async def rc_run(rc: pathlib.Path, side: GoSide) -> str:
    """``rc run -d DEVICE -- true`` through the real CLI against ``side``'s controller; the
    job's ID (from the CLI's ``rc: job ID on DEVICE`` line)."""
    env = {
        **os.environ,
        "RC_CONTROLLER": side.controller,
        "RC_TOKEN": "ctok",
        "RC_SUBMITTER": "bench",
    }
    with trio.fail_after(120):
        done = await trio.run_process(
            [str(rc), "run", "-d", side.device, "--", TRUE],
            env=env,
            check=False,
            stdin=subprocess.DEVNULL,
            capture_stdout=True,
            capture_stderr=True,
        )
    err = done.stderr.decode(errors="replace")
    m = _JOB_LINE.search(err)
    if done.returncode != 0 or m is None:
        raise RuntimeError(f"{side.name}: rc run exited {done.returncode}: {err.strip()[-300:]}")
    return m.group(1)


def go_hold(side: GoSide, job_id: str) -> float:
    st = side.stamps
    if job_id not in st.assigned or job_id not in st.terminal:
        raise RuntimeError(f"{side.name}: the proxy missed job {job_id}'s assignment or report")
    return st.hold_ms(job_id)


async def go_round(rc: pathlib.Path, side: GoSide, args: argparse.Namespace) -> None:
    if args.mode == "seq":
        side.hold_ms.append(go_hold(side, await rc_run(rc, side)))
        side.jobs += 1
        return
    ids: list[str] = []

    async def one() -> None:
        ids.append(await rc_run(rc, side))

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(args.burst):
            nursery.start_soon(one)
    side.per_job_ms.append((time.perf_counter() - t0) * 1000.0 / args.burst)
    side.hold_ms.extend(go_hold(side, j) for j in ids)
    side.jobs += args.burst


class Interrupted(Exception):
    """SIGTERM or SIGHUP reached the benchmark (a Ctrl-C is trio's KeyboardInterrupt)."""


async def interrupted_by_signal() -> None:
    """Raise :class:`Interrupted` on SIGTERM or SIGHUP, so that the run unwinds and
    :func:`stop_all` stops what it started instead of the process dying around them."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGHUP) as signals:
        async for signum in signals:
            raise Interrupted(signal.Signals(signum).name)


async def go_bench(
    args: argparse.Namespace,
    rc: pathlib.Path,
    tmp: pathlib.Path,
    procs: list[subprocess.Popen[bytes]],
) -> list[GoSide]:
    sides = [GoSide("thin"), GoSide("go"), GoSide("fleet-trio")]
    verify = verify_dir(tmp)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(interrupted_by_signal)
        for side in sides:
            host = f"bench-{side.name}"
            side.device = f"{host}:gpu0"
            port = free_port()
            side.controller = f"http://127.0.0.1:{port}"
            log = tmp / f"{side.name}-controller.log"
            ctrl = start(
                procs,
                [
                    str(rc),
                    "serve",
                    "--addr",
                    f"127.0.0.1:{port}",
                    "--data",
                    str(tmp / f"{side.name}-data"),
                ],
                log,
                env={**os.environ, "RC_TOKENS": RC_TOKENS},
            )
            await wait_listening(port, ctrl, log)
            proxy_port = await nursery.start(serve_proxy, port, side.stamps)
            url = f"http://127.0.0.1:{proxy_port}"
            if side.name == "thin":
                argv = thin_command(url, host)
            else:
                cfg = worker_config(tmp, url, host, verify)
                argv = (
                    [str(rc), "worker", "-c", str(cfg)]
                    if side.name == "go"
                    else fleet_trio_argv(cfg)
                )
            wlog = tmp / f"{side.name}-worker.log"
            worker = start(procs, argv, wlog)
            side.pid = worker.pid
            with trio.move_on_after(30):
                # a child's exit has no event to wait on here: look at both every 50 ms
                while not side.stamps.polls and worker.poll() is None:  # noqa: ASYNC110
                    await trio.sleep(0.05)
            if not side.stamps.polls:
                raise RuntimeError(f"{side.name} worker is not polling: {wlog.read_text()[-500:]}")
        for side in sides:
            for _ in range(args.warmup):
                await rc_run(rc, side)
        for side in sides:
            side.cpu_s, side.child_cpu_s = cpu_seconds(side.pid)
        rounds = args.n if args.mode == "seq" else args.rounds
        for i in range(rounds):
            k = i % len(sides)
            for side in sides[k:] + sides[:k]:
                await go_round(rc, side, args)
        for side in sides:
            own, kids = cpu_seconds(side.pid)
            side.cpu_s, side.child_cpu_s = own - side.cpu_s, kids - side.child_cpu_s
        nursery.cancel_scope.cancel()
    return sides


def go_main(args: argparse.Namespace) -> int:
    path = pathlib.Path(args.go) if args.go else default_go()
    with tempfile.TemporaryDirectory(prefix="bench-hold-go-") as tmpdir:
        tmp = pathlib.Path(tmpdir)
        rc = rc_binary(path, tmp)
        if rc is None:
            print(f"worker hold --go: skipped, no reference rc binary or tarball at {path}")
            return 0
        load0 = os.getloadavg()
        procs: list[subprocess.Popen[bytes]] = []
        try:
            sides = trio.run(go_bench, args, rc, tmp, procs)
        except BaseException as exc:
            leaf: BaseException = exc
            while isinstance(leaf, BaseExceptionGroup) and leaf.exceptions:
                leaf = leaf.exceptions[0]
            if isinstance(leaf, KeyboardInterrupt | Interrupted):
                why = str(leaf) or "SIGINT"
                print(f"worker hold --go: interrupted ({why}), stopping what it started")
                return 130
            if not isinstance(leaf, Exception):
                raise
            print(f"broken run: {describe(leaf)}", file=sys.stderr)
            return 1
        finally:
            stop_all(procs)
        load1 = os.getloadavg()
    loads = " ".join(f"{x:.2f}" for x in load0) + " -> " + " ".join(f"{x:.2f}" for x in load1)
    what = (
        f"{args.n} `true` jobs each, one at a time"
        if args.mode == "seq"
        else f"{args.rounds} round(s) of {args.burst} `true` jobs submitted at once"
    )
    print(
        f"worker hold against the Go rc worker: {what} through `rc run`, interleaved; each worker"
        f" on its own rc controller; go and fleet-trio with one verify script; ms;"
        f" load average {loads}"
    )
    for s in sides:
        print(f"  hold  {s.name:<11} {row(s.hold_ms)}")
    if args.mode == "burst":
        for s in sides:
            print(f"  wall  {s.name:<11} {row(s.per_job_ms)}   (per job)")
    for s in sides:
        print(
            f"  cpu   {s.name:<11} {s.cpu_s * 1000.0 / s.jobs:8.2f} ms/job own (user+sys),"
            f" children {s.child_cpu_s * 1000.0 / s.jobs:8.2f} ms/job"
        )
    go = sides[1]
    for s in (sides[0], sides[2]):
        hold = statistics.median(s.hold_ms) / statistics.median(go.hold_ms)
        cpu = s.cpu_s / go.cpu_s if go.cpu_s > 0 else float("nan")
        line = f"  / go  {s.name:<11} hold {hold:6.2f}  cpu {cpu:6.2f}"
        if args.mode == "burst":
            wall = statistics.median(s.per_job_ms) / statistics.median(go.per_job_ms)
            line += f"  wall/job {wall:6.2f}"
        print(line + "   (target for fleet-trio: <= 1.00)")
    return 0


def row(xs: list[float]) -> str:
    return f"median {statistics.median(xs):8.2f}  p90 {pct(xs, 0.9):8.2f}  max {max(xs):8.2f}"


def main(argv: list[str] | None = None) -> int:
    description = __doc__.split("\n\n")[0].replace("\n", " ")
    parser = job_bench_parser(
        description, n=60, n_help="seq mode: timed jobs per worker; --go: 100 unless given"
    )
    parser.set_defaults(n=None)  # 60, or 100 with --go
    parser.add_argument("--mode", choices=("seq", "burst"), default="seq")
    parser.add_argument("--burst", type=int, default=30, help="burst mode: jobs at once")
    parser.add_argument(
        "--rounds", type=int, default=None, help="burst mode: rounds (default 2; --go: 1)"
    )
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
    parser.add_argument(
        "--go",
        nargs="?",
        const="",
        default=None,
        metavar="PATH",
        help="instead: the thin worker, the Go `rc worker` and fleet-trio worker, each on its own"
        " real rc controller, jobs through the real rc CLI; PATH: the rc binary or its tarball"
        f" (default ../shared/{RC_REF} beside the repository); skips when there is none",
    )
    args = parser.parse_args(argv)
    if args.n is None:
        args.n = 100 if args.go is not None else 60
    if args.rounds is None:
        args.rounds = 1 if args.go is not None else 2
    if args.go is not None:
        return go_main(args)
    sides = trio.run(bench, args)
    thin = sides[0]

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
