"""The cgroup backend (docs/containment.md): every escape variant is in the job's cgroup, dead
at the job's end and listed in the sweep report; the cgroup is removed. Real cgroups, made
under the test's own parent (``cgroup_parent``); skipped where none can be had."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import attrs
import pytest
import trio

from fleet_trio.proc.containment import (
    CgroupContainment,
    CgroupUsage,
    ContainmentError,
    JobCgroup,
    MarkerContainment,
    cgroup2_mount,
    cgroup_name,
    choose_for_agent,
    own_cgroup,
    read_usage,
    recover_leftovers,
)
from fleet_trio.proc.limits import (
    JobLimits,
    check_cpu_weight,
    check_limits,
    check_pids_max,
    oom_result,
    parse_memory_max,
)
from fleet_trio.proc.procfs import pid_alive
from fleet_trio.proc.pty import start_pty
from fleet_trio.proc.run import run
from fleet_trio.proc.sinks import CappedBuffer
from fleet_trio.proc.spec import JobSpec, Result
from fleet_trio.proc.stop import StopToken
from tests.helpers import gone_within, wait_until
from tests.proc.escapes import VARIANTS, escape_command


def spec(command: str, parent: str, **kw: object) -> JobSpec:
    return JobSpec(
        command=("sh", "-c", command),
        containment=CgroupContainment(jobs_dir=parent),
        sweep_job_id=kw.pop("job", "j1"),  # type: ignore[arg-type]
        env={"RC_JOB_ID": "j1"},
        **kw,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("variant", VARIANTS)
async def test_every_escape_variant_is_killed_and_listed(
    variant: str, cgroup_parent: str, tmp_path: Path
) -> None:
    pidfile = tmp_path / "pid"
    with trio.fail_after(30):
        result = await run(
            spec(escape_command(variant, pidfile), cgroup_parent), CappedBuffer(1 << 16)
        )
    pid = int(pidfile.read_text())
    assert result.exit_code == 0 and not result.killed, result
    assert result.sweep.scope == "cgroup"
    assert pid in result.sweep.found, result.sweep.to_json()
    assert result.sweep.remaining == () and result.sweep.clean()
    assert await gone_within(pid, 10)
    assert os.listdir(cgroup_parent) == [
        n for n in os.listdir(cgroup_parent) if not os.path.isdir(os.path.join(cgroup_parent, n))
    ]


async def test_the_marker_backend_misses_the_stripped_escapee(tmp_path: Path) -> None:
    """What the cgroup backend fixes: the same job under the marker backend is reported clean
    while its escapee lives on (kept as the documented limit of ``marker``)."""
    pidfile = tmp_path / "pid"
    job = JobSpec(
        command=("sh", "-c", escape_command("setsid", pidfile)),
        containment=MarkerContainment(),
        sweep_job_id="j-marker",
        env={"RC_JOB_ID": "j-marker"},
    )
    with trio.fail_after(30):
        result = await run(job, CappedBuffer(1 << 16))
    pid = int(pidfile.read_text())
    try:
        assert result.sweep.scope == "marker" and result.sweep.clean()
        assert pid not in result.sweep.found and pid_alive(pid)
    finally:
        os.kill(pid, 9)


async def test_a_stopped_job_lists_its_escapee_and_kills_it(
    cgroup_parent: str, tmp_path: Path
) -> None:
    pidfile = tmp_path / "pid"
    command = escape_command("setsid", pidfile).replace("exit 0", "exec sleep 600")
    stop = StopToken()

    async def stop_once_escaped() -> None:
        await wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), timeout=20)
        stop.set()

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stop_once_escaped)
            result = await run(
                spec(command, cgroup_parent, grace_ceiling=2.0), CappedBuffer(1 << 16), stop
            )
    pid = int(pidfile.read_text())
    assert result.killed and result.reason == "cancelled", result
    assert pid in result.sweep.found and result.sweep.clean(), result.sweep.to_json()
    assert await gone_within(pid, 10)


async def test_a_pty_job_is_contained(cgroup_parent: str, tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    job = spec(escape_command("setsid", pidfile), cgroup_parent)
    with trio.fail_after(30):
        async with await start_pty(job) as session:
            while await session.read():
                pass
            result = await session.wait()
    pid = int(pidfile.read_text())
    assert pid in result.sweep.found and result.sweep.scope == "cgroup", result
    assert await gone_within(pid, 10)


async def test_the_environment_is_passed_as_given(cgroup_parent: str) -> None:
    """The spawn shim changes nothing the job sees: PWD absent or odd, IFS, names a shell
    drops."""
    for env in ({"IFS": "q", "X": "1"}, {"PWD": "/nowhere", "a-b": "1", "1X": "2"}):
        outs = []
        for containment in (None, CgroupContainment(jobs_dir=cgroup_parent)):
            job = JobSpec(
                command=("/usr/bin/env",),
                env=env,
                containment=containment,
                env_unset=("PWD",),
                cgroup_key="envcheck",
            )
            out = CappedBuffer(1 << 20)
            with trio.fail_after(20):
                result = await run(job, out)
            assert result.exit_code == 0, result
            outs.append(sorted(out.getvalue().decode().splitlines()))
        assert outs[0] == outs[1]


async def test_start_errors_are_the_same(cgroup_parent: str, tmp_path: Path) -> None:
    (tmp_path / "noexec").write_text("#!/bin/sh\n")
    for command in (("/nonexistent/x",), (str(tmp_path / "noexec"),), (str(tmp_path),)):
        errs = []
        for containment in (None, CgroupContainment(jobs_dir=cgroup_parent)):
            with trio.fail_after(20):
                result = await run(
                    JobSpec(command=command, containment=containment), CappedBuffer(1024)
                )
            errs.append(result.err)
        assert errs[0] == errs[1] and errs[0], errs


async def test_a_file_the_kernel_refuses_is_the_same_start_error(
    cgroup_parent: str, tmp_path: Path
) -> None:
    """A command file without ``#!`` that is no binary: ``execve`` refuses it (ENOEXEC). The
    shim's ``exec`` (dash) would run it as a shell script; the cgroup backend refuses it too."""
    ran = tmp_path / "ran"
    for name, text in (("script", f"touch {ran}\n"), ("empty", "")):
        path = tmp_path / name
        path.write_text(text)
        path.chmod(0o755)
        results = []
        for containment in (None, CgroupContainment(jobs_dir=cgroup_parent)):
            with trio.fail_after(20):
                results.append(
                    await run(
                        JobSpec(command=(str(path),), containment=containment), CappedBuffer(1024)
                    )
                )
        assert results[0] == results[1], results
        assert results[0].exit_code == -1
        assert results[0].err == f"start: fork/exec {path}: exec format error"
        assert not ran.exists()
    for command in ((sys.executable, "-c", "pass"), ("sh", "-c", "exit 0")):
        with trio.fail_after(20):
            ok = await run(
                JobSpec(command=command, containment=CgroupContainment(jobs_dir=cgroup_parent)),
                CappedBuffer(1024),
            )
        assert ok.exit_code == 0 and ok.err is None, ok


class VanishingCgroups(CgroupContainment):
    """Makes the job's cgroup, then removes it before the spawn: the shim cannot enter it."""

    def create(self, key: str) -> JobCgroup:
        cg = super().create(key)
        os.rmdir(cg.path)
        return cg


async def test_a_shim_that_cannot_enter_its_cgroup_is_a_start_error(cgroup_parent: str) -> None:
    backend = VanishingCgroups(jobs_dir=cgroup_parent)
    path = os.path.join(cgroup_parent, "gone")
    with trio.fail_after(20):
        result = await run(
            JobSpec(command=("true",), containment=backend, cgroup_key="gone"), CappedBuffer(1024)
        )
    assert result.exit_code == -1 and not result.killed, result
    assert result.err == f"start: cgroup {path}: cannot enter: no such file or directory"
    with trio.fail_after(20):
        async with await start_pty(
            JobSpec(command=("true",), containment=backend, cgroup_key="gone")
        ) as session:
            while await session.read():
                pass
            pty_result = await session.wait()
    assert pty_result.err == f"start pty: cgroup {path}: cannot enter: no such file or directory"


async def test_a_job_that_exits_125_itself_is_no_start_error(cgroup_parent: str) -> None:
    job = JobSpec(
        command=("sh", "-c", "echo 'cannot create x: No such file or directory' >&2; exit 125"),
        containment=CgroupContainment(jobs_dir=cgroup_parent),
    )
    out = CappedBuffer(1024)
    with trio.fail_after(20):
        result = await run(job, out)
    assert result.exit_code == 125 and result.err is None, result
    assert b"cannot create" in out.getvalue()


async def test_recovery_kills_and_removes_a_crashed_runs_cgroups(cgroup_parent: str) -> None:
    backend = CgroupContainment(jobs_dir=cgroup_parent)
    cg = backend.create("crashed")
    proc = await trio.lowlevel.open_process(
        ["sh", "-c", f"echo 0 > {cg.procs_file}; exec sleep 600"]
    )
    await wait_until(lambda: cg.procs() == [proc.pid], timeout=10)
    with trio.fail_after(20):
        lines = await recover_leftovers(backend)
        await proc.wait()
    assert lines == [f"job cgroup crashed: killed 1 process(es) [{proc.pid}], removed"]
    assert not os.path.exists(cg.path)


def test_the_v2_mount_is_found_in_a_hybrid_mountinfo() -> None:
    text = (
        "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
        "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
        "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
    )
    assert cgroup2_mount(text) == ("/sys/fs/cgroup/unified", "/")
    assert cgroup2_mount("1 2 0:1 / /x\\040y rw shared:1 - cgroup2 none rw\n") == ("/x y", "/")
    assert cgroup2_mount(text.splitlines()[0]) is None
    assert own_cgroup("4:memory:/a\n0::/system.slice/fleet-trio-node.service\n") == (
        "/system.slice/fleet-trio-node.service"
    )
    assert own_cgroup("1:cpu:/\n") is None
    assert cgroup_name("../a/b") == "_a_b" and cgroup_name("") == "job"


def test_cgroup_mode_names_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(
        ContainmentError, match=r"^containment: cgroup: .*not a cgroup v2 directory"
    ):
        choose_for_agent("cgroup", base=str(tmp_path))
    fallback = choose_for_agent("auto", base=str(tmp_path))
    assert fallback.name == "marker" and "not a cgroup v2 directory" in fallback.reason


async def test_a_jobs_cpu_time_is_read_from_its_cgroup(cgroup_parent: str) -> None:
    """``cpu.stat`` needs no controller: a job that burns CPU reports its seconds."""
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
    job = JobSpec(
        command=(sys.executable, "-c", burn),
        containment=CgroupContainment(jobs_dir=cgroup_parent),
        sweep_job_id="cpu1",
    )
    with trio.fail_after(30):
        result = await run(job, CappedBuffer(1024))
    assert result.exit_code == 0, result
    usage = result.usage
    assert usage is not None and usage.cpu_seconds >= 0.3, usage
    assert usage.user_usec + usage.system_usec <= usage.cpu_usec + 1000
    assert usage.text().startswith("cpu ") and " s (user " in usage.text()
    with trio.fail_after(30):
        marker = await run(attrs.evolve(job, containment=None), CappedBuffer(1024))
    assert marker.usage is None


def test_usage_is_parsed_from_the_cgroup_files(tmp_path: Path) -> None:
    (tmp_path / "cpu.stat").write_text(
        "usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\n"
    )
    usage = read_usage(str(tmp_path))
    assert usage is not None and usage.cpu_seconds == 1.5 and usage.memory_peak is None
    assert usage.text() == "cpu 1.50 s (user 1.00 s, system 0.50 s)"
    (tmp_path / "memory.peak").write_text("1048576\n")
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    usage = read_usage(str(tmp_path))
    assert usage is not None and usage.memory_peak == 1 << 20 and usage.oom_kills == 1
    assert usage.text().endswith(", memory peak 1048576 bytes, oom kills 1")
    assert read_usage(str(tmp_path / "gone")) is None


@pytest.fixture
def memory_parent(cgroup_parent: str) -> str:
    """``cgroup_parent`` with the memory controller enabled for its children; skips (saying
    so) where the cgroup v2 subtree does not offer it."""
    controllers = Path(cgroup_parent, "cgroup.controllers").read_text().split()
    if "memory" not in controllers:
        pytest.skip(f"no memory controller in the cgroup v2 subtree (only: {controllers})")
    Path(cgroup_parent, "cgroup.subtree_control").write_text("+memory")
    return cgroup_parent


async def test_a_jobs_memory_peak_is_read_where_the_memory_controller_is(
    memory_parent: str,
) -> None:
    cgroup_parent = memory_parent
    job = JobSpec(
        command=(sys.executable, "-c", "b = bytearray(64 << 20)"),
        containment=CgroupContainment(jobs_dir=cgroup_parent),
    )
    with trio.fail_after(30):
        result = await run(job, CappedBuffer(1024))
    assert result.usage is not None and (result.usage.memory_peak or 0) >= 64 << 20, result
    assert result.usage.oom_kills == 0


# -- limits (docs/containment.md, "Limits") -----------------------------------------------------


def test_limit_values_are_checked() -> None:
    assert parse_memory_max("8GiB") == (8 << 30, "8GiB")
    assert parse_memory_max("8G") == (8 * 10**9, "8G")  # the project's one size notation
    assert parse_memory_max(1 << 30) == (1 << 30, str(1 << 30))
    for bad in ("1K", "lots", True, -5, 1.5):
        with pytest.raises(ValueError):
            parse_memory_max(bad)
    assert check_pids_max(64) == 64 and check_cpu_weight(10000) == 10000
    for value in (0, -1, True, "5", 1 << 23):
        with pytest.raises(ValueError):
            check_pids_max(value)
    for value in (0, 10001, True, "100"):
        with pytest.raises(ValueError):
            check_cpu_weight(value)


def _limits() -> JobLimits:
    return JobLimits(memory_max=8 * 10**9, memory_max_text="8G", pids_max=64, cpu_weight=200)


def test_the_limit_files_are_written(tmp_path: Path) -> None:
    """A fake cgroup directory: each limit lands in its cgroup file, as cgroup v2 reads it."""
    _limits().write(str(tmp_path))
    assert (tmp_path / "memory.max").read_text() == "8000000000"
    assert (tmp_path / "memory.oom.group").read_text() == "1"
    assert (tmp_path / "pids.max").read_text() == "64"
    assert (tmp_path / "cpu.weight").read_text() == "200"
    with pytest.raises(OSError) as caught:
        _limits().write(str(tmp_path / "gone"))
    assert caught.value.filename == str(tmp_path / "gone" / "memory.max")
    JobLimits().write(str(tmp_path / "gone"))  # nothing configured: nothing written


def test_a_missing_controller_is_named_with_its_key_and_where(tmp_path: Path) -> None:
    """A fake delegated cgroup offering memory and pids only: cpu_weight cannot be had."""
    (tmp_path / "cgroup.controllers").write_text("memory pids\n")
    (tmp_path / "cgroup.subtree_control").write_text("")
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "cgroup.subtree_control").write_text("")
    only_memory = [("tasks.t in /n.yaml", JobLimits(memory_max=1 << 30, memory_max_text="1GiB"))]
    assert check_limits(str(jobs), only_memory) is None
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+memory"
    assert (jobs / "cgroup.subtree_control").read_text() == "+memory"
    problem = check_limits(str(jobs), [*only_memory, ("tasks.u in /n.yaml", _limits())])
    assert problem == (
        "tasks.u in /n.yaml: cpu_weight needs the cpu controller, which is not enabled for the"
        f" job cgroups ({tmp_path}/cgroup.controllers offers memory pids)"
    )
    assert check_limits(str(jobs), [("tasks.v", JobLimits())]) is None  # none configured


def test_a_limit_under_the_marker_backend_is_a_start_error() -> None:
    problem = check_limits(None, [("devices[0] (gpu0) in /w.yaml", JobLimits(pids_max=5))])
    assert problem == (
        "devices[0] (gpu0) in /w.yaml: pids_max needs the cgroup backend (containment is"
        " marker; docs/containment.md)"
    )
    assert check_limits(None, [("devices[0] (gpu0)", JobLimits())]) is None


def _missing_controller(cgroup_parent: str) -> str:
    offered = Path(cgroup_parent, "cgroup.controllers").read_text().split()
    for key, name in (("memory_max", "memory"), ("pids_max", "pids"), ("cpu_weight", "cpu")):
        if name not in offered:
            return key
    pytest.skip(f"the cgroup v2 subtree offers every limit's controller ({offered})")


def _one_limit(key: str) -> JobLimits:
    values = {"memory_max": 1 << 30, "pids_max": 64, "cpu_weight": 200}
    return JobLimits(**{key: values[key]}, memory_max_text="1GiB")  # type: ignore[arg-type]


def test_a_real_cgroup_without_the_controller_fails_the_check(cgroup_parent: str) -> None:
    key = _missing_controller(cgroup_parent)
    jobs = os.path.join(cgroup_parent, "jobs")
    os.mkdir(jobs)
    try:
        problem = check_limits(jobs, [("tasks.t in /n.yaml", _one_limit(key))])
    finally:
        os.rmdir(jobs)
    assert problem is not None and problem.startswith(f"tasks.t in /n.yaml: {key} needs the ")
    assert "controller, which is not enabled for the job cgroups" in problem


async def test_a_limit_the_cgroup_refuses_is_a_start_error(cgroup_parent: str) -> None:
    """Without the controller the limit file is not there: the job never runs, and its cgroup
    is removed."""
    key = _missing_controller(cgroup_parent)
    job = attrs.evolve(spec("echo ran", cgroup_parent), limits=_one_limit(key))
    out = CappedBuffer(1024)
    with trio.fail_after(30):
        result = await run(job, out)
    assert result.exit_code == -1 and result.err is not None, result
    assert "cannot set limit" in result.err and cgroup_parent in result.err, result.err
    assert out.getvalue() == b""
    assert [n for n in os.listdir(cgroup_parent) if os.path.isdir(Path(cgroup_parent, n))] == []


def test_an_oom_kill_is_the_jobs_reason() -> None:
    usage = CgroupUsage(cpu_usec=1, user_usec=1, system_usec=0, memory_peak=1, oom_kills=1)
    killed = Result(exit_code=137, killed=True, reason="signal: killed")
    result = oom_result(killed, usage, _limits())
    assert result.reason == "killed: out of memory (memory_max 8G)" and result.killed
    assert result.exit_code == 137 and result.usage == usage
    assert oom_result(killed, usage, None).reason == "killed: out of memory"
    clean = attrs.evolve(usage, oom_kills=0)
    assert oom_result(Result(exit_code=0), clean, _limits()).reason == ""
    assert oom_result(Result(exit_code=0), attrs.evolve(usage, oom_kills=None), None).reason == ""
    start = Result(exit_code=-1, err="start: no such file")
    assert oom_result(start, usage, _limits()).reason == ""


async def test_a_supervised_jobs_oom_kill_becomes_its_reason(
    cgroup_parent: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The supervisor's end, with the memory controller faked: the limits are written
    nowhere and the cgroup's ``memory.events`` says ``oom_kill 1``."""
    import fleet_trio.proc.containment as containment
    import fleet_trio.proc.supervisor as supervisor

    real = containment.read_usage

    def with_oom(path: str) -> CgroupUsage | None:
        usage = real(path)
        return None if usage is None else attrs.evolve(usage, memory_peak=1, oom_kills=1)

    monkeypatch.setattr(containment, "read_usage", with_oom)
    monkeypatch.setattr(supervisor, "read_usage", with_oom)
    monkeypatch.setattr(JobLimits, "write", lambda self, path: None)
    job = attrs.evolve(spec("kill -9 $$", cgroup_parent), limits=_limits())
    with trio.fail_after(30):
        result = await run(job, CappedBuffer(1024))
    assert result.reason == "killed: out of memory (memory_max 8G)", result
    assert result.killed and result.exit_code == 137


async def test_a_real_oom_kill_is_the_jobs_reason(memory_parent: str) -> None:
    job = JobSpec(
        command=(sys.executable, "-c", 'b = b"x" * (256 << 20)'),
        containment=CgroupContainment(jobs_dir=memory_parent),
        limits=JobLimits(memory_max=32 << 20, memory_max_text="32MiB"),
    )
    with trio.fail_after(30):
        result = await run(job, CappedBuffer(1024))
    assert result.reason == "killed: out of memory (memory_max 32MiB)", result


async def test_an_escapee_in_a_sub_cgroup_of_its_job_is_killed_listed_and_removed(
    cgroup_parent: str, tmp_path: Path
) -> None:
    """A job may make cgroups inside its own (it owns that subtree): an escapee moved into one
    is still the job's. ``cgroup.procs`` lists only the cgroup's own processes, so the sweep
    must read the whole subtree, kill it (``cgroup.kill`` does) and remove it deepest first."""
    pidfile = tmp_path / "pid"
    sub = os.path.join(cgroup_parent, "j1", "inner", "deeper")
    command = (
        f"mkdir -p {sub} && mkdir {cgroup_parent}/j1/empty-sibling && "
        f"setsid sh -c 'echo 0 > {sub}/cgroup.procs; echo $$ > {pidfile}; exec sleep 4321' "
        "</dev/null >/dev/null 2>&1 &\n"
        f"while [ ! -s {pidfile} ]; do sleep 0.01; done; exit 0"
    )
    with trio.fail_after(30):
        result = await run(spec(command, cgroup_parent), CappedBuffer(1 << 16))
    pid = int(pidfile.read_text())
    try:
        assert result.exit_code == 0, result
        assert pid in result.sweep.found, result.sweep.to_json()
        assert result.sweep.clean(), result.sweep.to_json()
        assert await gone_within(pid, 10)
        assert not os.path.exists(os.path.join(cgroup_parent, "j1"))
    finally:
        if pid_alive(pid):
            os.kill(pid, 9)


async def test_recovery_kills_and_removes_a_crashed_jobs_sub_cgroups(cgroup_parent: str) -> None:
    backend = CgroupContainment(jobs_dir=cgroup_parent)
    cg = backend.create("crashed")
    sub = os.path.join(cg.path, "sub")
    os.mkdir(sub)
    os.mkdir(os.path.join(cg.path, "empty"))
    proc = await trio.lowlevel.open_process(
        ["sh", "-c", f"echo 0 > {sub}/cgroup.procs; exec sleep 600"]
    )
    await wait_until(lambda: JobCgroup(sub).procs() == [proc.pid], timeout=10)
    with trio.fail_after(20):
        lines = await recover_leftovers(backend)
        await proc.wait()
    assert lines == [f"job cgroup crashed: killed 1 process(es) [{proc.pid}], removed"]
    assert not os.path.exists(cg.path)


@pytest.mark.parametrize("how", ["frozen_sub_cgroup", "sigstopped"])
async def test_a_frozen_or_stopped_escapee_is_killed(
    how: str, cgroup_parent: str, tmp_path: Path
) -> None:
    """SIGTERM does nothing to a frozen or stopped process; the kill that follows does."""
    pidfile = tmp_path / "pid"
    sub = os.path.join(cgroup_parent, "j1", "ice")
    if how == "frozen_sub_cgroup":
        start = (
            f"mkdir {sub} && setsid sh -c 'echo 0 > {sub}/cgroup.procs; echo $$ > {pidfile};"
            " exec sleep 4321' </dev/null >/dev/null 2>&1 &\n"
            f"while [ ! -s {pidfile} ]; do sleep 0.01; done; echo 1 > {sub}/cgroup.freeze\n"
            f"until grep -q 'frozen 1' {sub}/cgroup.events; do sleep 0.01; done; exit 0"
        )
    else:
        start = (
            f"setsid sh -c 'echo $$ > {pidfile}; kill -STOP $$; exec sleep 4321' "
            "</dev/null >/dev/null 2>&1 &\n"
            f"while [ ! -s {pidfile} ]; do sleep 0.01; done\n"
            f"until grep -q '^State:.*T' /proc/$(cat {pidfile})/status; do sleep 0.01; done; exit 0"
        )
    with trio.fail_after(40):
        result = await run(spec(start, cgroup_parent), CappedBuffer(1 << 16))
    pid = int(pidfile.read_text())
    try:
        assert result.exit_code == 0, result
        assert pid in result.sweep.found and result.sweep.clean(), result.sweep.to_json()
        assert await gone_within(pid, 10)
        assert not os.path.exists(os.path.join(cgroup_parent, "j1"))
    finally:
        if pid_alive(pid):
            os.kill(pid, 9)


ODD_ARGS = (
    "a\nb",
    "'",
    '"',
    "$(touch /tmp/x)",
    "`id`",
    "\\",
    "",
    " lead",
    "*",
    "-",
    "--",
    "é\udcff",
)
ODD_ENV = {"Q": 'it\'s "$(x)"\n`y`', "A-B": "1", "1X": "2", "E": ""}


@pytest.mark.parametrize("env", [{"Q": ODD_ENV["Q"]}, ODD_ENV], ids=["names_ok", "names_dropped"])
async def test_odd_argv_and_env_reach_the_program_byte_for_byte(
    env: dict[str, str], cgroup_parent: str, tmp_path: Path
) -> None:
    """The shim's shell must not reinterpret anything: the same bytes as the marker backend."""
    code = (
        "import os, sys; sys.stdout.buffer.write(repr((sys.argv[1:], "
        "sorted((k, v) for k, v in os.environb.items() if k != b'PWD'))).encode())"
    )
    outs = []
    for containment in (MarkerContainment(), CgroupContainment(jobs_dir=cgroup_parent)):
        job = JobSpec(
            command=(sys.executable, "-c", code, *ODD_ARGS),
            env=env,
            containment=containment,
            cgroup_key="odd",
        )
        out = CappedBuffer(1 << 20)
        with trio.fail_after(20):
            result = await run(job, out)
        assert result.exit_code == 0, (result, out.getvalue())
        outs.append(out.getvalue())
    assert outs[0] == outs[1]
    assert not os.path.exists("/tmp/x")


@pytest.mark.parametrize("odd_name", [False, True], ids=["names_ok", "names_dropped"])
async def test_a_huge_environment_starts_as_under_the_marker_backend(
    odd_name: bool, cgroup_parent: str
) -> None:
    """An environment near ARG_MAX that starts without the shim starts with it: the shim must
    not pass it twice (in its environment and again on ``env -i``'s command line)."""
    limit = os.sysconf("SC_ARG_MAX")
    count = limit * 6 // 10 // 24  # each "Vnnnnnn=xxxxxxxx" + its pointer: 24 bytes
    env = {f"V{i:07d}": "x" * 7 for i in range(count)}
    if odd_name:
        env["A-B"] = "1"
    for containment in (MarkerContainment(), CgroupContainment(jobs_dir=cgroup_parent)):
        job = JobSpec(
            command=("/bin/sh", "-c", "exit 0"),
            env=env,
            containment=containment,
            cgroup_key="huge",
        )
        with trio.fail_after(30):
            result = await run(job, CappedBuffer(1 << 16))
        assert result.exit_code == 0 and result.err is None, (containment.name, result)
