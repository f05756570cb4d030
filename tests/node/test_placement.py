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


@pytest.mark.parametrize("busy", [True, False], ids=["device-busy", "device-free"])
async def test_jobs_get_a_device_in_ack_order(tmp_path: Path, busy: bool) -> None:
    """FIFO is the order the node acked the jobs (each takes its place in line at its ack:
    ``reserve``), not the order their runners ask: released together after their acks, two
    runners ask in any order. Whether the device is busy or free when they ask."""
    placement = Placement(["GPU-a"])
    runner = TaskRunner(kill_grace=1, placement=placement)
    reg = _registry(tmp_path)
    first = reg.prepare("t", '{"sleep": 30}', "first")
    second = reg.prepare("t", '{"sleep": 30}', "second")
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            hold = placement.reserve() if busy else None  # somebody else's job on the device
            runner.reserve(first)  # acked first
            runner.reserve(second)
            nursery.start_soon(runner.execute, second)  # its runner asks first
            await wait_until(lambda: placement.queued >= 1)
            if hold is not None:
                placement.release(hold)
            nursery.start_soon(runner.execute, first)
            await wait_until(lambda: bool(first.devices or second.devices))
            assert (first.devices, second.devices) == (("GPU-a",), ())
            nursery.cancel_scope.cancel()
    assert placement.allocator.holders() == {} and placement.queued == 0


@pytest.mark.parametrize("journal", [True, False], ids=["journal", "no-journal"])
async def test_dispatched_jobs_get_the_device_in_ack_order(tmp_path: Path, journal: bool) -> None:
    """Through the dispatch route: "first" is acked, then "second"; the only device (free)
    goes to "first" every time. Before places in line were taken at the ack, the runners'
    order decided (in about one round in four without the journal, one in twenty with it)."""
    import httpx

    from fleet_trio.node.app import create_app
    from fleet_trio.node.journal import Journal, JournalWriter
    from tests.node.harness import make_ctx
    from tests.node.store_tree import store_in_tree

    cfg = config_from_mapping({"tasks": {"t": {"command": ["true"], "gpu": True}}})
    for round_ in range(12):
        where = tmp_path / str(round_)
        where.mkdir()
        runner = TaskRunner(kill_grace=1, placement=Placement(["GPU-a"]))
        ran: list[str] = []

        async def run(job: Any, tee: Any = None, ran: list[str] = ran) -> Done:
            ran.append(job.job_id)
            return Done(b"{}")

        runner._run = run  # type: ignore[method-assign]
        writer = None
        if journal:
            db = Journal(str(where / "j.sqlite"))
            db.open()
            writer = JournalWriter(db)
        with trio.fail_after(20):
            async with store_in_tree(journal=writer, janitor=False) as (store, _tree):
                ctx = make_ctx(where, store)
                ctx.registry = TaskRegistry(cfg.tasks, work_root=str(where))
                ctx.runner = runner
                app = httpx.ASGITransport(app=create_app(ctx))
                async with httpx.AsyncClient(transport=app, base_url="http://127.0.0.1") as client:
                    for job_id in ("first", "second"):
                        body = {"job_id": job_id, "task_type": "t"}
                        r = await client.post("/fleet/dispatch", json=body)
                        assert r.status_code == 202, r.text
                    await wait_until(lambda ran=ran: len(ran) == 2)  # type: ignore[misc]
        assert ran == ["first", "second"], f"round {round_}"


async def test_a_place_in_line_is_given_back_when_the_job_never_runs(tmp_path: Path) -> None:
    """A job acked but never run (its ack refused by the journal, a shutdown before it
    started, its work dir not made) gives its place back: the next job is not stuck."""
    placement = Placement(["GPU-a"])
    runner = TaskRunner(kill_grace=1, placement=placement)
    reg = _registry(tmp_path)
    never = reg.prepare("t", "{}", "never")
    runner.reserve(never)
    assert placement.allocator.holders() != {}  # granted at its ack: the device was free
    runner.discard(never)
    runner.discard(never)  # idempotent
    assert placement.allocator.holders() == {} and placement.queued == 0
    gone = reg.prepare("t", "{}", "gone")
    runner.reserve(gone)
    gone.work_dir = str(tmp_path / "no" / "such" / "dir")  # its deferred dir cannot be made
    gone.deferred_dir = True
    with trio.fail_after(10):
        outcome = await runner.execute(gone)
    assert isinstance(outcome, Failed) and "cannot create its work dir" in outcome.message
    assert placement.allocator.holders() == {} and placement.queued == 0
    with trio.fail_after(10):  # and the next job gets the device
        assert isinstance(await runner.execute(reg.prepare("t", "{}", "next")), Done)


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
