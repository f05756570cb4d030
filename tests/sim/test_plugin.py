"""The pytest fixtures of ``fleet_trio.sim.pytest_plugin`` and the harness under them.

Each fixture is used as a user's test would use it; every real child process is bounded by
``trio.fail_after``. The cleanup tests record the pids of jobs left running when the test
ends; a plain (sync) fixture checks them after every async fixture has been torn down.
"""

from __future__ import annotations

import ast
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

import fleet_trio.sim.pytest_plugin as plugin
from fleet_trio.errors import ConfigError
from fleet_trio.gpu.fake import ENV_DIR
from fleet_trio.proc.procfs import pid_alive
from fleet_trio.sim import INSTANCE_HEADER, SimController
from fleet_trio.sim.dispatcher import SimDispatcher
from fleet_trio.sim.harness import (
    FakeGpuDir,
    HarnessError,
    NodeHandle,
    WorkerHandle,
    open_controller,
    open_node,
    open_worker,
)
from tests.helpers import wait_until

PY = sys.executable
EXAMPLE_NODE = "../../examples/sim/node.yaml"
EXAMPLE_WORKER = "../../examples/sim/worker.yaml"


# --------------------------------------------------------------------------------------------
# The plugin itself
# --------------------------------------------------------------------------------------------


def test_plugin_is_registered_through_its_entry_point(pytestconfig: pytest.Config) -> None:
    assert pytestconfig.pluginmanager.get_plugin("fleet_trio") is plugin


def test_plugin_module_imports_nothing_heavy() -> None:
    """Only pytest and the standard library at import time; the harness is imported by the
    fixtures when a test asks for one."""
    tree = ast.parse(Path(plugin.__file__).read_text())
    allowed = {"__future__", "os", "collections.abc", "pathlib", "typing", "pytest"}
    for node in tree.body:
        if isinstance(node, ast.Import):
            assert {a.name for a in node.names} <= allowed, ast.dump(node)
        elif isinstance(node, ast.ImportFrom):
            assert node.module in allowed, node.module
        elif isinstance(node, ast.If):
            assert ast.unparse(node.test) == "TYPE_CHECKING"


PLAIN_TEST = """
def test_plain(pytestconfig):
    assert pytestconfig.pluginmanager.has_plugin("fleet_trio")
    assert not pytestconfig.pluginmanager.has_plugin("trio")
"""


@pytest.mark.slow
async def test_a_session_without_pytest_trio_still_runs(tmp_path: Path) -> None:
    """The plugin loads in a session where pytest-trio is off, and plain tests run as before."""
    (tmp_path / "test_plain.py").write_text(PLAIN_TEST)
    cmd = [PY, "-m", "pytest", "-q", "-p", "no:trio", "-p", "no:cacheprovider", "test_plain.py"]
    with trio.fail_after(60):
        ran = await trio.run_process(cmd, cwd=tmp_path, capture_stdout=True, check=False)
    assert ran.returncode == 0 and b"1 passed" in ran.stdout, ran.stdout


# --------------------------------------------------------------------------------------------
# fake_gpu, rc_controller
# --------------------------------------------------------------------------------------------


async def test_fake_gpu_fixture(fake_gpu: FakeGpuDir, tmp_path: Path) -> None:
    assert fake_gpu.dir == tmp_path / "fake-gpu" / "gpu0"
    assert json.loads((fake_gpu.dir / "device.json").read_text())["total_gib"] == 80.0
    assert fake_gpu.env == {ENV_DIR: str(fake_gpu.dir)}
    assert await fake_gpu.used_gib() == 0.0
    pid = await fake_gpu.hold("2G")
    assert pid == os.getpid()
    assert await fake_gpu.holdings() == {pid: 2 << 30}
    assert await fake_gpu.used_gib() == 2.0
    await fake_gpu.free()
    assert await fake_gpu.holdings() == {}
    await fake_gpu.fail("scripted")
    assert (fake_gpu.dir / "fail").read_text() == "scripted"
    await fake_gpu.recover()
    assert not (fake_gpu.dir / "fail").exists()
    with pytest.raises(HarnessError, match="no device 1"):
        await fake_gpu.hold("1G", device=1)


async def test_rc_controller_fixture(rc_controller: SimController) -> None:
    assert rc_controller.base_url.startswith("http://127.0.0.1:")
    async with httpx.AsyncClient(base_url=rc_controller.base_url) as client:
        r = await client.post("/v1/workers/register", headers={"Authorization": "Bearer no"})
    assert r.status_code == 401
    assert r.headers[INSTANCE_HEADER] == rc_controller.instance


# --------------------------------------------------------------------------------------------
async def has_footprints(node: NodeHandle) -> bool:
    return bool((await node.health())["model_footprints"])


# fleet_node
# --------------------------------------------------------------------------------------------


async def test_fleet_node_default_config_runs_echo(fleet_node: NodeHandle) -> None:
    assert fleet_node.url.startswith("http://127.0.0.1:")
    health = await fleet_node.health()
    assert health["supported_task_types"] == ["echo"]
    assert health["node_id"] == "sim-node"
    assert health["vram_total_gb"] == 80.0
    with trio.fail_after(20):
        job = await fleet_node.run("echo", {"a": 1})
    assert job["state"] == "done"
    assert job["data"] == {"echo": {"a": 1}}
    r = await fleet_node.dispatch("nope", {})
    assert r.status_code == 400
    with pytest.raises(HarnessError, match="refused: 400"):
        await fleet_node.submit("nope", {})
    assert fleet_node.work_dirs() == []


@pytest.mark.parametrize("fleet_node_config", [EXAMPLE_NODE])
async def test_fleet_node_from_a_yaml_path_relative_to_the_test_file(
    fleet_node: NodeHandle,
) -> None:
    assert fleet_node.config.path.endswith("examples/sim/node.yaml")
    with trio.fail_after(20):
        job = await fleet_node.run("upper", {"text": "abc"})
    assert job["data"] == {"text": "ABC"}


HOLDING_TASK = (
    "import json, subprocess, sys; json.load(sys.stdin); "
    "subprocess.run([sys.executable, '-m', 'fleet_trio.gpu.fake', 'hold', '1G', '--for', '0.6'],"
    " check=True); print(json.dumps({'held': True}))"
)


class TestConfigFromTheUsersFile:
    """``fleet_node_config`` overridden for a group of tests: the user's own YAML file."""

    @pytest.fixture
    def fleet_node_config(self, tmp_path: Path) -> Path:
        path = tmp_path / "my-node.yaml"
        path.write_text(
            "node:\n"
            "  timings: {render_sample_interval: 100ms, health_sample_interval: 100ms}\n"
            "tasks:\n"
            "  holder:\n"
            "    family: fake-model\n"
            "    footprint: {family: fake-model}\n"
            f"    command: [{json.dumps(PY)}, -c, {json.dumps(HOLDING_TASK)}]\n"
        )
        return path

    async def test_jobs_see_the_fake_gpu_and_get_measured(
        self, fleet_node: NodeHandle, fake_gpu: FakeGpuDir, tmp_path: Path
    ) -> None:
        assert fleet_node.config.path == str(tmp_path / "my-node.yaml")
        with trio.fail_after(20):
            job_id = await fleet_node.submit("holder", {})
            await wait_until(fake_gpu.holdings, what="the job's helper holding 1 GiB")
            job = await fleet_node.wait(job_id)
            assert job["data"] == {"held": True}
            assert await fake_gpu.holdings() == {}
            await wait_until(lambda: has_footprints(fleet_node), what="model_footprints in health")
        (entry,) = (await fleet_node.health())["model_footprints"]
        assert entry["model_family"] == "fake-model"
        assert entry["task_type"] == "holder"
        assert entry["vram_peak_gb"] >= 1.0  # 1 GiB measured, times the 1.2 margin
        assert fleet_node.footprints_path.parent == tmp_path / "fleet-node"


async def test_a_bad_node_yaml_names_the_key_and_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad-node.yaml"
    path.write_text("tasks:\n  t:\n    command: [x]\n    timeout: soon\n")
    with pytest.raises(ConfigError) as err:
        async with open_node(path, workdir=tmp_path / "n"):
            pytest.fail("the node started with a bad config")
    assert str(path) in str(err.value)
    assert "tasks.t.timeout" in str(err.value)


# --------------------------------------------------------------------------------------------
# fleet_worker
# --------------------------------------------------------------------------------------------


async def test_fleet_worker_default_config(
    fleet_worker: WorkerHandle, rc_controller: SimController, fake_gpu: FakeGpuDir, tmp_path: Path
) -> None:
    assert fleet_worker.controller is rc_controller
    (reg,) = rc_controller.registrations()
    assert reg["host"] == "sim-host"
    assert [d["name"] for d in reg["devices"]] == ["gpu0", "gpu1"]
    scratch = tmp_path / "fleet-worker" / "rc"
    assert fleet_worker.config.probe_dir == str(scratch / "probe.d")
    assert fleet_worker.config.verify_dir == str(scratch / "verify.d")
    assert fleet_worker.config.sheet_dir == str(scratch / "sheets")
    show = ["sh", "-c", f'echo "$RC_DEVICE ${ENV_DIR}"']
    with trio.fail_after(20):
        job = await fleet_worker.run("gpu1", show)
    assert job.state == "succeeded" and job.exit_code == 0
    assert fleet_worker.statuses(job.job_id) == ["running", "succeeded"]
    assert fleet_worker.logs(job.job_id) == f"sim-host:gpu1 {fake_gpu.dir}\n".encode()


@pytest.mark.parametrize("fleet_worker_config", [EXAMPLE_WORKER])
async def test_fleet_worker_from_a_users_worker_yaml(
    fleet_worker: WorkerHandle, rc_controller: SimController
) -> None:
    cfg = fleet_worker.config
    assert cfg.path.endswith("examples/sim/worker.yaml")
    assert cfg.controller_url == rc_controller.base_url
    assert cfg.token == "wtok"
    assert cfg.devices[0].max_runtime_seconds == 600
    (reg,) = rc_controller.registrations()
    assert reg["host"] == "example-box"
    assert rc_controller.device("example-box:gpu0").max_runtime_seconds == 600


async def test_a_bad_worker_yaml_names_the_key_and_the_file(tmp_path: Path) -> None:
    path = tmp_path / "worker.yaml"
    path.write_text("controller_url: http://x\ndevices:\n  - name: gpu0\n    max_runtime: 30\n")
    async with open_controller() as ctrl:
        with pytest.raises(ConfigError) as err:
            async with open_worker(path, ctrl, workdir=tmp_path / "w"):
                pytest.fail("the worker started with a bad config")
    assert str(path) in str(err.value)
    assert "devices[0].max_runtime" in str(err.value)


# --------------------------------------------------------------------------------------------
# dispatcher
# --------------------------------------------------------------------------------------------


async def test_dispatcher_fixture_places_jobs_on_fleet_node(
    dispatcher: SimDispatcher, fleet_node: NodeHandle
) -> None:
    assert dispatcher.nodes == [fleet_node.url]
    assert dispatcher.healthy(fleet_node.url)
    with trio.fail_after(20):
        record = await dispatcher.submit("echo", payload={"n": 7})
        record = await dispatcher.wait(record.job_id, timeout=15)
    assert record.state == "done"
    assert record.node == fleet_node.url
    assert record.result == {"echo": {"n": 7}}


# --------------------------------------------------------------------------------------------
# Cleanup: nothing a test leaves running survives its fixtures
# --------------------------------------------------------------------------------------------


@pytest.fixture
def left_running() -> Iterator[list[int]]:
    """Pids the test leaves running; checked after every async fixture is torn down."""
    pids: list[int] = []
    yield pids
    assert pids, "the test recorded no pid"
    deadline = time.monotonic() + 5
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [p for p in pids if pid_alive(p)] == []


SLEEPER = (
    "import json, os, sys, time; p = json.load(sys.stdin); "
    "open(p['pidfile'], 'w').write(str(os.getpid())); time.sleep(60)"
)


async def _read_pid(path: Path) -> int:
    await wait_until(lambda: path.exists() and path.read_text(), timeout=15)
    return int(path.read_text())


class TestNodeCleanup:
    @pytest.fixture
    def fleet_node_config(self) -> dict[str, Any]:
        return {
            "node": {"timings": {"drain_timeout": "30s", "kill_grace": "1s"}},
            "tasks": {"sleeper": {"command": [PY, "-c", SLEEPER]}},
        }

    async def test_a_job_left_running_is_killed_at_teardown(
        self, fleet_node: NodeHandle, left_running: list[int], tmp_path: Path
    ) -> None:
        pidfile = tmp_path / "pid"
        await fleet_node.submit("sleeper", {"pidfile": str(pidfile)})
        left_running.append(await _read_pid(pidfile))
        assert pid_alive(left_running[0])


async def test_a_worker_job_left_running_is_killed_at_teardown(
    fleet_worker: WorkerHandle, left_running: list[int], tmp_path: Path
) -> None:
    pidfile = tmp_path / "pid"
    fleet_worker.submit("gpu0", ["sh", "-c", f"echo $$ > {pidfile}; exec sleep 60"])
    left_running.append(await _read_pid(pidfile))
    assert pid_alive(left_running[0])


async def test_harness_managers_stop_what_they_started(tmp_path: Path) -> None:
    """Outside pytest fixtures: the context managers stop what they started."""
    with trio.fail_after(30):
        async with open_controller() as ctrl:
            async with open_worker(None, ctrl, workdir=tmp_path / "w") as worker:
                job = worker.submit("gpu0", ["sleep", "60"])
                await ctrl.wait_for(lambda: ctrl.statuses(job) == ["running"], timeout=10)
            assert ctrl.statuses(job) == ["running", "killed"]
            assert worker.worker.supervised() == []


async def test_open_node_with_a_token_sends_it(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with open_node(token="s3cret", workdir=tmp_path / "n") as node:
            assert (await node.client.get("/fleet/health")).status_code == 200
            async with httpx.AsyncClient(base_url=node.url) as anonymous:
                r = await anonymous.post("/fleet/dispatch", json={"job_id": "j"})
            assert r.status_code == 401
            job = await node.run("echo", {"ok": 1})
            assert job["data"] == {"echo": {"ok": 1}}
