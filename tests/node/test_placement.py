"""GPU placement on the node (``fleet_trio.node.placement``) with the real task runner.

The device goes back on every path a job can end on: done, error, interrupted (cancelled
while running, and while queued), spawn failure; a request the node can never meet fails the
job with a clear message.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from fleet_trio.node.config import config_from_mapping
from fleet_trio.node.jobs import Done, Failed
from fleet_trio.node.placement import Placement, footprint_need, pin_env
from fleet_trio.node.tasks import TaskRegistry, TaskRunner
from tests.helpers import CountingSource, wait_until
from tests.node.conftest import PY

ENV_SCRIPT = (
    "import json, os, sys, time; p = json.loads(sys.stdin.read()); time.sleep(p.get('sleep', 0));"
    " sys.exit(p['exit']) if 'exit' in p else None;"
    " print(json.dumps({k: os.environ.get(k) for k in"
    " ('CUDA_VISIBLE_DEVICES', 'NVIDIA_VISIBLE_DEVICES')}))"
)


def _registry(tmp_path: Path, **task: Any) -> TaskRegistry:
    cfg = config_from_mapping(
        {"tasks": {"t": {"command": [PY, "-c", ENV_SCRIPT], "gpu": True, **task}}},
        path=str(tmp_path / "n.yaml"),
        base_dir=str(tmp_path),
    )
    return TaskRegistry(cfg.tasks, base_dir=cfg.base_dir, work_root=str(tmp_path))


@attrs.frozen
class Dev:
    uuid: str


@attrs.frozen
class Snap:
    total_gb: float
    free_gb: float


def test_pin_env() -> None:
    assert pin_env(["GPU-a", "GPU-b"]) == {
        "CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b",
        "NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b",
    }
    assert pin_env([""]) == {}  # the anonymous device: nothing pinned
    assert pin_env([]) == {}


async def test_a_job_runs_pinned_to_its_device(tmp_path: Path) -> None:
    placement = Placement(["GPU-a", "GPU-b"])
    runner = TaskRunner(kill_grace=1, placement=placement)
    with trio.fail_after(10):
        outcome = await runner.execute(_registry(tmp_path).prepare("t", "{}", "j1"))
    assert isinstance(outcome, Done)
    env = json.loads(outcome.data)
    assert env == {"CUDA_VISIBLE_DEVICES": "GPU-a", "NVIDIA_VISIBLE_DEVICES": "GPU-a"}
    assert placement.allocator.holders() == {}


async def test_gpus_n_takes_n_devices(tmp_path: Path) -> None:
    placement = Placement(["GPU-a", "GPU-b", "GPU-c"])
    runner = TaskRunner(kill_grace=1, placement=placement)
    with trio.fail_after(10):
        outcome = await runner.execute(_registry(tmp_path, gpus=2).prepare("t", "{}", "j1"))
    assert isinstance(outcome, Done)
    assert json.loads(outcome.data)["CUDA_VISIBLE_DEVICES"] == "GPU-a,GPU-b"


async def test_more_gpus_than_the_node_has_fails_the_job(tmp_path: Path) -> None:
    runner = TaskRunner(kill_grace=1, placement=Placement(["GPU-a", "GPU-b"]))
    with trio.fail_after(10):
        outcome = await runner.execute(_registry(tmp_path, gpus=3).prepare("t", "{}", "j1"))
    assert outcome == Failed("t failed: asked for 3 GPUs but this node has 2 device(s)")


@pytest.mark.parametrize("path", ["done", "error", "spawn-failure"])
async def test_the_device_is_released_on_every_ending(tmp_path: Path, path: str) -> None:
    placement = Placement(["GPU-a"])
    runner = TaskRunner(kill_grace=1, placement=placement)
    if path == "spawn-failure":
        cfg = config_from_mapping(
            {"tasks": {"t": {"command": [str(tmp_path / "gone")], "gpu": True}}},
            path=str(tmp_path / "n.yaml"),
        )
        reg = TaskRegistry(cfg.tasks, work_root=str(tmp_path), check_executables=False)
        raw = "{}"
    else:
        reg = _registry(tmp_path)
        raw = '{"exit": 3}' if path == "error" else "{}"
    with trio.fail_after(10):
        outcome = await runner.execute(reg.prepare("t", raw, "j1"))
    assert isinstance(outcome, Done if path == "done" else Failed)
    assert placement.allocator.holders() == {} and placement.queued == 0
    with trio.fail_after(10):  # and the next job gets the device
        assert isinstance(await runner.execute(_registry(tmp_path).prepare("t", "{}", "j2")), Done)


async def test_interrupted_running_and_queued_jobs_release(tmp_path: Path) -> None:
    placement = Placement(["GPU-a"])
    runner = TaskRunner(kill_grace=0.5, placement=placement)
    reg = _registry(tmp_path)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(runner.execute, reg.prepare("t", '{"sleep": 30}', "run"))
            nursery.start_soon(runner.execute, reg.prepare("t", '{"sleep": 30}', "queued"))
            await wait_until(lambda: bool(placement.allocator.holders() and placement.queued == 1))
            nursery.cancel_scope.cancel()  # shutdown: trio cancellation
    assert placement.allocator.holders() == {} and placement.queued == 0


async def test_queued_jobs_get_a_device_in_dispatch_order(tmp_path: Path) -> None:
    """FIFO is the order the node acked (prepared) the jobs, not the order their runners
    reach the queue: released together after their acks, two runners ask in any order."""
    placement = Placement(["GPU-a"])
    runner = TaskRunner(kill_grace=1, placement=placement)
    reg = _registry(tmp_path)
    first = reg.prepare("t", '{"sleep": 30}', "first")
    second = reg.prepare("t", '{"sleep": 30}', "second")
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            async with placement.acquire() as _held:  # the device is busy
                nursery.start_soon(runner.execute, second)  # its runner asks first
                await wait_until(lambda: placement.queued == 1)
                nursery.start_soon(runner.execute, first)
                await wait_until(lambda: placement.queued == 2)
            await wait_until(lambda: bool(first.devices or second.devices))
            assert (first.devices, second.devices) == (("GPU-a",), ())
            nursery.cancel_scope.cancel()


async def test_a_footprint_waits_for_a_device_with_that_much_free(tmp_path: Path) -> None:
    a, b = Dev("GPU-a"), Dev("GPU-b")
    placement = Placement([a.uuid, b.uuid])
    placement.update(a, Snap(80, 10))
    placement.update(b, Snap(80, 20))
    runner = TaskRunner(kill_grace=1, placement=placement, footprint_need=lambda job: 30.0)
    result: list[Any] = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:

            async def run() -> None:
                result.append(await runner.execute(_registry(tmp_path).prepare("t", "{}", "j")))

            nursery.start_soon(run)
            await wait_until(lambda: placement.queued == 1)
            placement.update(b, Snap(80, 40))  # the next sample: GPU-b now fits
    assert isinstance(result[0], Done)
    assert json.loads(result[0].data)["CUDA_VISIBLE_DEVICES"] == "GPU-b"


async def test_a_stale_device_is_skipped(tmp_path: Path) -> None:
    a, b = Dev("GPU-a"), Dev("GPU-b")
    placement = Placement([a.uuid, b.uuid])
    placement.update(a, None)  # GPU-a failed to read for too long
    placement.update(b, Snap(80, 70))
    runner = TaskRunner(kill_grace=1, placement=placement)
    with trio.fail_after(10):
        outcome = await runner.execute(_registry(tmp_path).prepare("t", "{}", "j"))
    assert isinstance(outcome, Done)
    assert json.loads(outcome.data)["CUDA_VISIBLE_DEVICES"] == "GPU-b"


@attrs.frozen
class Entry:
    wire: dict[str, Any]

    def to_wire(self) -> dict[str, Any]:
        return self.wire


class Store:
    def __init__(self, *wires: dict[str, Any]) -> None:
        self._entries = [Entry(w) for w in wires]

    def entries(self) -> list[Entry]:
        return self._entries


def test_footprint_need_exact_key_then_largest_of_the_family() -> None:
    store = Store(
        {"model_family": "sdxl", "quant": "bf16", "task_type": "image-gen", "vram_peak_gb": 9.6},
        {"model_family": "sdxl", "vram_peak_gb": 12.0},
        {"model_family": "other", "vram_peak_gb": 50.0},
    )
    assert footprint_need(store, "sdxl", "bf16", "image-gen") == 9.6
    assert footprint_need(store, "sdxl", "", "video-gen") == 12.0
    assert footprint_need(store, "none", "", "x") is None
    assert footprint_need(store, "", "", "x") is None
    assert footprint_need(None, "sdxl", "", "x") is None


@pytest.mark.parametrize("mode", ["global", "auto"])
async def test_peak_is_measured_on_the_pinned_device_only(tmp_path: Path, mode: str) -> None:
    """Global delta on that device only; per-process attribution on that device only."""
    import os

    from fleet_trio.gpu import GIB, fake
    from fleet_trio.node.server import GpuServices, footprint_hooks

    root = str(tmp_path / "gpu")
    found = fake.open_fake_devices(root, 2)
    counted = CountingSource(found.devices[0].source)
    devices = (attrs.evolve(found.devices[0], source=counted), *found.devices[1:])
    gpu = GpuServices(
        sampler=None,  # type: ignore[arg-type]
        footprints=Store(),  # type: ignore[arg-type]
        source=counted,  # type: ignore[arg-type]
        sampler_mode=mode,
        render_interval=0.05,
        devices=devices,
    )
    sample, _record = footprint_hooks(gpu)
    assert sample is not None
    job = _registry(tmp_path).prepare("t", "{}", "j-peak")
    job.pin((found.devices[0].uuid,))
    me = os.getpid()
    stop = trio.Event()
    peaks: list[float | None] = []
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:

            async def measure() -> None:
                peaks.append(await sample(job, stop, os.getpgid(0)))

            nursery.start_soon(measure)
            await wait_until(lambda: counted.reads >= 1, what="the first sample (the baseline)")
            fake.write_holding(os.path.join(root, "gpu0"), me, 2 * GIB)  # the job's device
            fake.write_holding(os.path.join(root, "gpu1"), me, 5 * GIB)  # another device
            # the read in flight may predate the holdings; the one after it cannot
            seen = counted.reads
            await wait_until(lambda: counted.reads >= seen + 2, what="a sample of the holdings")
            stop.set()
    fake.remove_holding(os.path.join(root, "gpu0"), me)
    fake.remove_holding(os.path.join(root, "gpu1"), me)
    job.cleanup()
    assert peaks == [2.0]
