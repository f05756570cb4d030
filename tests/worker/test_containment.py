"""Worker jobs under the cgroup backend (docs/containment.md): every escape variant, markers
stripped, is killed at the job's end and named in the worker's log; the job cgroup is
removed; ``--check`` and the config say which backend."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
import trio

from fleet_trio.errors import ConfigError
from fleet_trio.proc.containment import AGENT_LEAF, JOBS_DIR, CgroupContainment, ContainmentError
from fleet_trio.proc.procfs import pid_alive
from fleet_trio.proc.scripts import ScriptKind, run_scripts
from fleet_trio.sim import serve_controller
from fleet_trio.worker.config import hook_env
from fleet_trio.worker.config.loader import config_from_mapping
from fleet_trio.worker.hooks import run_hook
from fleet_trio.worker.verify import run_verify
from fleet_trio.worker.worker import Worker
from tests.helpers import (
    dev,
    gone_within,
    running,
    sim,
    until_terminal,
    wait_until,
    write_worker_yaml,
)
from tests.proc.escapes import STRIP, VARIANTS, escape_command


@pytest.mark.parametrize("variant", VARIANTS)
async def test_a_worker_jobs_escapee_dies_with_it(
    variant: str, cgroup_parent: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="fleet_trio.worker")
    pidfile = tmp_path / "pid"

    def contained(c):  # type: ignore[no-untyped-def]
        return attrs.evolve(c, containment="cgroup", cgroup_base=cgroup_parent)

    with trio.fail_after(60):
        async with running(configure=contained) as (ctrl, worker):
            assert worker.containment is not None and worker.containment.name == "cgroup"
            job = ctrl.submit(dev("gpu0"), ["sh", "-c", escape_command(variant, pidfile)])
            assert await until_terminal(ctrl, job) == ["running", "succeeded"]
            pid = int(pidfile.read_text())
            assert await gone_within(pid, 10)
    lines = [r.getMessage() for r in caplog.records if "outlived the group" in r.getMessage()]
    assert lines == [f"job {job}: processes [{pid}] outlived the group and were reaped by job id"]
    scope = [r.getMessage() for r in caplog.records if "(scope cgroup)" in r.getMessage()]
    assert scope == [
        f"job {job}: (scope cgroup) those processes were found in the job's cgroup and"
        " killed with it, whatever their environment"
    ]
    assert any(r.getMessage().startswith("containment: cgroup") for r in caplog.records)
    jobs = Path(cgroup_parent, JOBS_DIR)
    assert [p for p in jobs.iterdir() if p.is_dir()] == []
    assert os.path.isdir(jobs)


def test_an_unknown_containment_names_its_key() -> None:
    raw = {"controller_url": "http://c:1", "devices": ["gpu0"], "containment": "jail"}
    with pytest.raises(ConfigError, match="containment"):
        config_from_mapping(raw)
    ok = config_from_mapping({**raw, "containment": "marker"})
    assert ok.containment == "marker"


def _script(path: Path, body: str) -> str:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def _escapee_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "killed with its cgroup" in r.getMessage()]


async def test_a_hooks_escapee_is_killed_and_reported(
    cgroup_parent: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A hook that leaves a stripped-environment setsid process behind: the hook's own cgroup
    (``hook-<event>-<device>-<job>``) kills it at the hook's end and a WARN names it."""
    pidfile = tmp_path / "pid"
    hook = _script(tmp_path / "acquire.sh", escape_command("setsid", pidfile))
    with trio.fail_after(30):
        error, _ = await run_hook(
            hook,
            hook_env("acquire", "gpu0", "j7", "alice"),
            20.0,
            containment=CgroupContainment(jobs_dir=cgroup_parent),
        )
    pid = int(pidfile.read_text())
    assert error is None
    assert await gone_within(pid, 10)
    assert _escapee_lines(caplog) == [
        f"hook {hook}: processes [{pid}] outlived it and were killed with its cgroup"
    ]
    assert not [n for n in os.listdir(cgroup_parent) if n.startswith("hook-")]


async def test_a_verify_scripts_escapee_is_killed_and_reported(
    cgroup_parent: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pidfile = tmp_path / "pid"
    vdir = tmp_path / "verify.d"
    vdir.mkdir()
    script = _script(vdir / "10-leak", escape_command("double_fork", pidfile))
    with trio.fail_after(30):
        outcome = await run_verify(
            str(vdir),
            device_id="gpu0",
            job_id="j8",
            submitter="bob",
            timeout=20.0,
            pass_budget=0,
            containment=CgroupContainment(jobs_dir=cgroup_parent),
        )
    pid = int(pidfile.read_text())
    assert outcome.ok
    assert await gone_within(pid, 10)
    assert _escapee_lines(caplog) == [
        f"{script}: processes [{pid}] outlived it and were killed with its cgroup"
    ]


async def test_a_probes_escapee_is_killed_and_reported(
    cgroup_parent: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pidfile = tmp_path / "pid"
    pdir = tmp_path / "probe.d"
    pdir.mkdir()
    _script(pdir / "facts", escape_command("renamed_argv0", pidfile) + "\n")
    with trio.fail_after(30):
        result = await run_scripts(
            str(pdir),
            max_runtime=20.0,
            budget=0,
            containment=CgroupContainment(jobs_dir=cgroup_parent),
            cgroup_prefix="probe",
        )
    pid = int(pidfile.read_text())
    assert [o.kind for o in result.outcomes] == [ScriptKind.OK]
    assert result.outcomes[0].result.sweep.scope == "cgroup"
    assert pid in result.outcomes[0].result.sweep.found
    assert await gone_within(pid, 10)
    assert len(_escapee_lines(caplog)) == 1


async def test_the_worker_hands_its_containment_to_hooks_and_probes(cgroup_parent: str) -> None:
    raw = {"controller_url": "http://c:1", "devices": ["gpu0"], "containment": "cgroup"}
    cfg = attrs.evolve(config_from_mapping(raw), cgroup_base=cgroup_parent)
    worker = Worker(cfg)
    await worker.open_containment()
    assert isinstance(worker.containment, CgroupContainment)
    assert worker.hooks.containment is worker.containment  # type: ignore[attr-defined]
    assert worker.prober.containment is worker.containment


@pytest.mark.slow
async def test_kill_9_of_the_worker_then_restart_kills_the_contained_survivors(
    cgroup_parent: str, tmp_path: Path
) -> None:
    """A real ``fleet-trio worker`` started inside a delegated cgroup runs a job that leaves a
    stripped-environment ``setsid`` escapee; after ``kill -9`` of the worker both live on in
    the job's cgroup; the restarted worker kills them, removes the cgroup and logs it."""
    pidfile = tmp_path / "escapee"
    escaper = (
        f"setsid {STRIP} sh -c 'echo $$ > {pidfile}; exec sleep 4321' </dev/null >/dev/null 2>&1 &"
        "\nexec sleep 600"
    )
    procs = os.path.join(cgroup_parent, "cgroup.procs")
    ctrl = sim()
    logs = [tmp_path / "first.log", tmp_path / "second.log"]
    workers: list[trio.Process] = []

    async def start(log: Path) -> trio.Process:
        env = {k: v for k, v in os.environ.items() if k != "RC_REQUIRE_MANUAL_CLEAR"}
        with log.open("wb") as out:
            proc = await trio.lowlevel.open_process(
                ["sh", "-c", 'echo 0 > "$0" && exec "$@"', procs, sys.executable, "-m",
                 "fleet_trio", "worker", "-c", str(cfg)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
            )  # fmt: skip
        workers.append(proc)
        return proc

    try:
        with trio.fail_after(90):
            async with trio.open_nursery() as nursery:
                url = await nursery.start(serve_controller, ctrl)
                cfg = write_worker_yaml(tmp_path, url)
                first = await start(logs[0])
                await ctrl.wait_for(lambda: ctrl.polls(), timeout=30)
                agent = Path(cgroup_parent, AGENT_LEAF, "cgroup.procs").read_text().split()
                assert str(first.pid) in agent  # the worker moved itself into agent/
                job = ctrl.submit(dev("gpu0"), ["sh", "-c", escaper])
                await wait_until(
                    lambda: pidfile.exists() and pidfile.read_text().strip(), timeout=30
                )
                escapee = int(pidfile.read_text())
                job_cgroup = Path(cgroup_parent, JOBS_DIR, job)
                assert str(escapee) in (job_cgroup / "cgroup.procs").read_text().split()
                first.send_signal(signal.SIGKILL)  # no shutdown path: the job outlives it
                await first.wait()
                assert pid_alive(escapee)  # the crash left it behind

                before = len(ctrl.registrations())
                second = await start(logs[1])
                await ctrl.wait_for(lambda: len(ctrl.registrations()) > before, timeout=30)
                assert await gone_within(escapee, 10)
                assert not job_cgroup.exists()
                log = logs[1].read_text()
                line = rf"recovery: job cgroup {job}: killed 2 process\(es\) \[\d+, \d+\], removed"
                assert re.search(line, log) and str(escapee) in log, log
                second.send_signal(signal.SIGTERM)
                with trio.move_on_after(20):
                    await second.wait()
                nursery.cancel_scope.cancel()
    finally:
        for proc in workers:
            if proc.returncode is None:
                proc.kill()
                with trio.move_on_after(10):
                    await proc.wait()


async def test_a_worker_jobs_cpu_time_is_logged_and_counted(
    cgroup_parent: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="fleet_trio.worker")
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"

    def contained(c):  # type: ignore[no-untyped-def]
        return attrs.evolve(c, containment="cgroup", cgroup_base=cgroup_parent)

    with trio.fail_after(60):
        async with running(configure=contained) as (ctrl, worker):
            job = ctrl.submit(dev("gpu0"), [sys.executable, "-c", burn])
            assert await until_terminal(ctrl, job) == ["running", "succeeded"]

            def counted() -> float:
                registry = worker.metrics.registry
                value = registry.get_sample_value(
                    "fleet_trio_worker_job_cpu_seconds_total", {"device": dev("gpu0")}
                )
                return value or 0.0

            await wait_until(lambda: counted() > 0, timeout=20)
            assert counted() >= 0.3
            ended = worker.bus.get(job)
            assert ended is not None and ended.ended is not None
            assert (ended.ended.cpu_seconds or 0) >= 0.3  # the tail's end frame
    assert any(
        re.match(rf"job {job}: used cpu \d+\.\d\d s \(user ", r.getMessage())
        for r in caplog.records
    ), caplog.text


def test_a_devices_limits_are_its_own_keys_checked_at_load(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """fleet-trio's own device keys: read (not "unknown key ignored"), and checked."""
    device = {"name": "gpu0", "memory_max": "8GiB", "pids_max": 64, "cpu_weight": 200}
    raw = {"controller_url": "http://c:1", "devices": [device]}
    cfg = config_from_mapping(raw, path="/etc/rc/worker.yaml")
    assert cfg.ignored_keys == () and "unknown key" not in caplog.text
    limits = cfg.devices[0].limits
    assert (limits.memory_max, limits.memory_max_text) == (8 << 30, "8GiB")
    assert (limits.pids_max, limits.cpu_weight) == (64, 200)
    for key, bad in (("memory_max", "1K"), ("pids_max", 0), ("cpu_weight", 0), ("pids_max", "x")):
        bad_raw = {**raw, "devices": [{"name": "gpu0", key: bad}]}
        with pytest.raises(ConfigError) as caught:
            config_from_mapping(bad_raw, path="/etc/rc/worker.yaml")
        assert caught.value.key == f"devices[0].{key}"
        assert "/etc/rc/worker.yaml" in str(caught.value)


async def test_a_devices_limit_under_the_marker_backend_fails_the_start() -> None:
    raw = {"controller_url": "http://c:1", "devices": [{"name": "gpu0", "cpu_weight": 50}]}
    cfg = config_from_mapping({**raw, "containment": "marker"}, path="/w.yaml")
    with pytest.raises(ContainmentError) as caught:
        await Worker(cfg).open_containment()
    assert str(caught.value) == (
        "devices[0] (gpu0) in /w.yaml: cpu_weight needs the cgroup backend (containment is"
        " marker; docs/containment.md)"
    )


async def test_a_devices_limit_without_its_controller_fails_the_start(cgroup_parent: str) -> None:
    """Real: this cgroup v2 subtree lacks the controller (skipped where it has them all)."""
    offered = Path(cgroup_parent, "cgroup.controllers").read_text().split()
    missing = [
        (k, c)
        for k, c in (("memory_max", "memory"), ("pids_max", "pids"), ("cpu_weight", "cpu"))
        if c not in offered
    ]
    if not missing:
        pytest.skip(f"the cgroup v2 subtree offers every limit's controller ({offered})")
    key, controller = missing[0]
    value: object = "1GiB" if key == "memory_max" else 64
    device = {"name": "gpu0", key: value}
    raw = {"controller_url": "http://c:1", "devices": ["gpu1", device], "containment": "cgroup"}
    cfg = attrs.evolve(config_from_mapping(raw, path="/w.yaml"), cgroup_base=cgroup_parent)
    with pytest.raises(ContainmentError) as caught:
        await Worker(cfg).open_containment()
    assert str(caught.value).startswith(
        f"devices[1] (gpu0) in /w.yaml: {key} needs the {controller} controller, which is not"
        " enabled for the job cgroups ("
    ), str(caught.value)


def test_a_devices_limits_reach_its_jobs_spec() -> None:
    from fleet_trio.worker.client import Assignment

    raw = {"controller_url": "http://c:1", "devices": [{"name": "gpu0", "pids_max": 7}, "gpu1"]}
    worker = Worker(config_from_mapping(raw))
    spec = worker.job_spec(
        Assignment(job_id="j", device_id=worker.config.device_id("gpu0"), command=("x",))
    )
    assert spec.limits is not None and spec.limits.pids_max == 7
    other = worker.job_spec(
        Assignment(job_id="k", device_id=worker.config.device_id("gpu1"), command=("x",))
    )
    assert other.limits is not None and other.limits.empty
