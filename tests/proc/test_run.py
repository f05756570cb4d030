"""run(): behaviour beyond the checklist (completion rule, Q1 bound, trio cancellation)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from fleet_trio.proc import BufferSink, JobSpec, Result
from fleet_trio.proc.procfs import pid_alive
from fleet_trio.proc.run import resolve_argv, run
from tests.helpers import (
    PidWatcher,
    cancel_when_output,
    gone_within,
    run_stopped_once_seen,
    scenario_pause,
)


async def test_run_background_child_holding_stdout_keeps_job_running() -> None:
    """§2.4: the job completes only when every holder of its stdout is gone."""
    started = time.monotonic()
    with trio.fail_after(10):
        res = await run(JobSpec(command=["sh", "-c", "sleep 0.4 & exit 0"]), BufferSink())
    assert res.exit_code == 0
    assert res.killed is False
    assert time.monotonic() - started >= 0.35


async def test_run_setsid_pipe_holder_does_not_hang_stop() -> None:
    """§15 Q1 (b): a setsid'd child keeping stdout open cannot hang run() after a stop."""
    sink = BufferSink()
    watcher = PidWatcher(sink)
    script = "setsid sh -c 'echo child:$$; exec sleep 300' & sleep 300"
    started = time.monotonic()
    with trio.fail_after(20):
        res = await run_stopped_once_seen(JobSpec(["sh", "-c", script], grace_ceiling=0.3), watcher)
    elapsed = time.monotonic() - started
    try:
        assert res.killed is True
        assert res.reason.startswith("cancelled")
        assert elapsed < 8
    finally:
        pid = watcher.pid()
        if pid_alive(pid):
            os.kill(pid, 9)


async def test_run_trio_cancellation_still_tears_the_group_down() -> None:
    """Program shutdown (trio cancellation) never leaks a live group."""
    sink = BufferSink()
    watcher = PidWatcher(sink)
    script = "trap '' TERM; sleep 300 & echo child:$!; while :; do sleep 0.05; done"
    with trio.fail_after(15):
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(cancel_when_output, watcher, scope)
                await run(JobSpec(command=["sh", "-c", script], grace_ceiling=0.2), watcher)
        assert scope.cancelled_caught
        assert await gone_within(watcher.pid(), 2)


def test_finish_maps_wait_statuses() -> None:
    from fleet_trio.proc.supervisor import finish

    assert finish(0).killed is False
    assert finish(3).exit_code == 3
    killed = finish(-9)
    assert (killed.exit_code, killed.killed, killed.reason) == (137, True, "signal: killed")
    assert finish(-15).reason == "signal: terminated"
    assert finish(None).exit_code == -1


async def run_swept(script: str, sink: BufferSink) -> Result:
    """Run ``sh -c script`` marked with a fresh ``RC_JOB_ID`` that is also swept at its end."""
    job_id = f"fleet-trio-test-swept-{os.getpid()}-{time.monotonic_ns()}"
    spec = JobSpec(command=["sh", "-c", script], env={"RC_JOB_ID": job_id}, sweep_job_id=job_id)
    with trio.fail_after(20):
        return await run(spec, sink)


async def test_run_swept_job_does_not_wait_for_an_escapee_holding_stdout() -> None:
    """Only escapees hold the pipes: the swept job completes and the sweep reaps them."""
    sink = BufferSink()
    started = time.monotonic()
    res = await run_swept("setsid sleep 300 & echo child:$!; exit 0", sink)
    pid = int(sink.text().split("child:")[1].split()[0])
    try:
        assert time.monotonic() - started < 10
        assert (res.exit_code, res.killed, res.reason, res.err) == (0, False, "", None)
        assert pid in res.sweep.found
        assert not pid_alive(pid)
    finally:
        if pid_alive(pid):
            os.kill(pid, 9)


async def test_run_unswept_job_still_waits_for_a_background_child_in_its_group() -> None:
    """The escape rule never shortens the wait while the group itself holds a live process."""
    started = time.monotonic()
    res = await run_swept("sleep 1.5 & exit 0", BufferSink())
    assert time.monotonic() - started >= 1.4
    assert (res.exit_code, res.killed, res.reason) == (0, False, "")


def test_parse_proc_stat_reads_the_exiting_flag() -> None:
    from fleet_trio.proc.procfs import PF_EXITING, parse_proc_stat

    line = b"42 (sh) R 1 42 42 0 -1 %d 0 0" % (0x400000 | PF_EXITING)
    st = parse_proc_stat(line)
    assert st is not None and st.exiting
    plain = parse_proc_stat(b"42 (sh) R 1 42 42 0 -1 4194304 0 0")
    assert plain is not None and not plain.exiting
    short = parse_proc_stat(b"42 (sh) S 1 42 42")
    assert short is not None and short.flags == 0


class _ExitingTarget:
    """A group whose last member is already exiting and goes away by itself."""

    def __init__(self, polls_until_gone: int, exiting: bool) -> None:
        self.left = polls_until_gone
        self.exiting = exiting
        self.signals: list[int] = []

    def signal(self, sig: int) -> bool:
        self.signals.append(sig)
        self.left = 0
        return True

    def alive(self) -> bool:
        if self.left <= 0:
            return False
        self.left -= 1
        return True

    def settling(self) -> bool:
        return self.exiting


async def test_reap_stragglers_leaves_an_exiting_member_alone(
    autojump_clock: trio.testing.MockClock,
) -> None:
    from fleet_trio.proc.supervisor import reap_stragglers

    exiting = _ExitingTarget(polls_until_gone=3, exiting=True)
    assert await reap_stragglers(exiting) == (False, True)
    assert exiting.signals == []

    live = _ExitingTarget(polls_until_gone=10**6, exiting=False)
    assert await reap_stragglers(live) == (True, True)
    assert live.signals == [9]

    # Not yet exiting, but gone within the settle moment (it closed its output just before
    # exiting): not a straggler either.
    leaving = _ExitingTarget(polls_until_gone=3, exiting=False)
    assert await reap_stragglers(leaving) == (False, True)
    assert leaving.signals == []


async def test_run_bare_name_is_looked_up_on_the_workers_path() -> None:
    """§2.3.2: a job that sets its own PATH still finds a bare command on the worker's PATH."""
    sink = BufferSink()
    with trio.fail_after(10):
        res = await run(JobSpec(command=["sh", "-c", "echo $PATH"], env={"PATH": "/nowhere"}), sink)
        missing = await run(JobSpec(command=["no-such-cmd-ft"], env={"PATH": "/usr/bin"}), sink)
    assert res.exit_code == 0
    assert sink.text().startswith("/nowhere")
    assert missing.err == 'start: exec: "no-such-cmd-ft": executable file not found in $PATH'


def test_bare_name_is_resolved_in_the_parent_without_a_job_path() -> None:
    """A bare name is looked up here on the worker's PATH even when the job's env does not set
    PATH (Popen's own walk would try an execve per PATH entry in the child); a path is kept."""
    found = shutil.which("sh", path=os.environ.get("PATH", os.defpath))
    assert found is not None
    assert resolve_argv(("sh", "-c", "true"), None) == ([found, "-c", "true"], None)
    assert resolve_argv(("sh",), {"LANG": "C"}) == ([found], None)
    assert resolve_argv(("/bin/sh",), None) == (["/bin/sh"], None)
    _argv, err = resolve_argv(("no-such-cmd-ft",), None)
    assert err == 'exec: "no-such-cmd-ft": executable file not found in $PATH'


async def test_run_bare_name_without_a_job_path_runs_and_a_missing_one_is_a_start_error() -> None:
    sink = BufferSink()
    with trio.fail_after(10):
        res = await run(JobSpec(command=["sh", "-c", "echo ok"]), sink)
        missing = await run(JobSpec(command=["no-such-cmd-ft"]), sink)
    assert res.exit_code == 0 and sink.text() == "ok\n"
    assert missing.exit_code == -1
    assert missing.err == 'start: exec: "no-such-cmd-ft": executable file not found in $PATH'


async def test_spawn_limiter_bounds_spawns_in_flight(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs that share a spawn limiter of 1 never have two spawns in flight; all still run."""
    real_open = trio.lowlevel.open_process
    in_flight = 0
    most = 0

    async def counting_open(*args: Any, **kwargs: Any) -> Any:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        try:
            await scenario_pause(0.01, why="widen the window a concurrent spawn would overlap in")
            return await real_open(*args, **kwargs)
        finally:
            in_flight -= 1

    monkeypatch.setattr(trio.lowlevel, "open_process", counting_open)
    limiter = trio.CapacityLimiter(1)
    results: list[Result] = []

    async def one() -> None:
        results.append(
            await run(JobSpec(command=("sh", "-c", "true")), BufferSink(), spawn_limiter=limiter)
        )

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for _ in range(6):
                nursery.start_soon(one)
    assert most == 1
    assert [r.exit_code for r in results] == [0] * 6


async def test_run_cancelled_while_waiting_for_a_spawn_slot_never_spawns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spawned: list[object] = []
    real_open = trio.lowlevel.open_process

    async def recording_open(*args: Any, **kwargs: Any) -> Any:
        spawned.append(args)
        return await real_open(*args, **kwargs)

    monkeypatch.setattr(trio.lowlevel, "open_process", recording_open)
    limiter = trio.CapacityLimiter(1)
    release = trio.Event()

    async def hold_the_only_slot(task_status: trio.TaskStatus[None]) -> None:
        async with limiter:
            task_status.started()
            await release.wait()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(hold_the_only_slot)
            with trio.move_on_after(0.2) as scope:
                await run(
                    JobSpec(command=("sh", "-c", "true")), BufferSink(), spawn_limiter=limiter
                )
            release.set()
    assert scope.cancelled_caught
    assert spawned == []


@pytest.mark.parametrize(
    "spec",
    [
        JobSpec(command=("echo", "a\0b")),
        JobSpec(command=("echo", "x"), env={"X": "a\0b"}),
        JobSpec(command=("echo", "x"), env={"A\0B": "1"}),
        JobSpec(command=("echo", "x"), cwd="/tmp/\0x"),
    ],
    ids=["argv", "env-value", "env-key", "cwd"],
)
async def test_a_nul_byte_is_a_start_error_not_a_traceback(spec: JobSpec) -> None:
    """A job from a hostile submitter: Python raises ValueError for a NUL in an exec string,
    which reached the task tree as a traceback; Go answers a start error."""
    with trio.fail_after(10):
        result = await run(spec, BufferSink())
    assert result.exit_code == -1
    assert result.err == "start: fork/exec echo: invalid argument"


@pytest.mark.parametrize(
    ("spec", "name"),
    [
        (JobSpec(command=("echo", "a\ud800")), "echo"),
        (JobSpec(command=("echo", "x"), env={"X": "a\udfff"}), "echo"),
        (JobSpec(command=("echo", "x"), env={"A\ud800": "1"}), "echo"),
        (JobSpec(command=("echo", "x"), cwd="/tmp/\ud800"), "echo"),
        (JobSpec(command=("ec\ud800ho",)), "'ec\\ud800ho'"),
        (JobSpec(command=("echo", "x"), env={"A=B": "x"}), "echo"),
    ],
    ids=["argv", "env-value", "env-key", "cwd", "name", "env-key-with-equals"],
)
async def test_text_the_kernel_cannot_take_is_a_start_error_not_a_traceback(
    spec: JobSpec, name: str
) -> None:
    """A lone surrogate (not ``surrogateescape``'s) cannot be encoded for the kernel, and Python
    refuses an environment name with ``=``: both raised from the spawn (UnicodeEncodeError,
    ValueError). A Go string cannot hold the one and Go passes the other on mangled: the
    nearest is the NUL case's start error."""
    with trio.fail_after(10):
        result = await run(spec, BufferSink())
    assert result.exit_code == -1
    assert result.err == f"start: fork/exec {name}: invalid argument"


async def test_surrogateescaped_bytes_still_run(tmp_path: Path) -> None:
    """A file name that is not UTF-8 comes from the OS as ``surrogateescape`` text: still a
    valid argument."""
    name = os.fsdecode(b"f\xff")
    with trio.fail_after(10):
        result = await run(JobSpec(command=("touch", name), cwd=str(tmp_path)), BufferSink())
    assert result.exit_code == 0 and (tmp_path / name).exists()


def test_a_command_found_through_a_relative_path_entry_is_refused_as_go_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Go (1.19+) refuses a bare name that ``LookPath`` finds through an empty or relative PATH
    entry (``ErrDot``): the job would run whatever ``./NAME`` is relative to its *own* cwd, not
    the file that was found."""
    (tmp_path / "ft-dot-cmd").write_text("#!/bin/sh\necho found\n")
    (tmp_path / "ft-dot-cmd").chmod(0o755)
    monkeypatch.chdir(tmp_path)
    refused = 'exec: "ft-dot-cmd": cannot run executable found relative to current directory'
    for path in (":/usr/bin", ".:/usr/bin", "/usr/bin::", "./:/usr/bin"):
        monkeypatch.setenv("PATH", path)
        assert resolve_argv(("ft-dot-cmd",), None) == (["ft-dot-cmd"], refused), path
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin")  # absolute: found and run
    assert resolve_argv(("ft-dot-cmd",), None) == ([f"{tmp_path}/ft-dot-cmd"], None)
