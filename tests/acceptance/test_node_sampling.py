"""node.md §9, items 91–95 and 99: the render-sampling hook of the task runner."""

from __future__ import annotations

from pathlib import Path

import trio

from fleet_trio.node.config import config_from_mapping
from fleet_trio.node.jobs import Done, Failed
from fleet_trio.node.tasks import PreparedJob, TaskRegistry, TaskRunner
from tests.helpers import scenario_pause
from tests.node.conftest import PY, TASK_SCRIPT


def registry(tmp_path: Path, footprint: object = True) -> TaskRegistry:
    (tmp_path / "task.py").write_text(TASK_SCRIPT)
    task: dict[str, object] = {"command": [PY, "task.py"], "family": "sdxl"}
    if footprint:
        task["footprint"] = {"family": "sdxl", "quant": "bf16"}
    cfg = config_from_mapping({"tasks": {"image-gen": task}}, base_dir=str(tmp_path))
    return TaskRegistry(cfg.tasks, base_dir=str(tmp_path), work_root=str(tmp_path))


class Hooks:
    def __init__(self, samples: list[float]) -> None:
        self.samples = samples
        self.sampled = 0
        self.pids: list[int] = []
        self.recorded: list[tuple[str, str, str, float]] = []

    async def sample(self, job: PreparedJob, stop: trio.Event, pgid: int) -> float | None:
        self.sampled += 1
        self.pids.append(pgid)
        peak: float | None = None
        for value in self.samples:
            peak = value if peak is None else max(peak, value)
            await scenario_pause(0.01, why="the fake sampler takes one sample per 10 ms")
        await stop.wait()
        return peak

    async def record(self, job: PreparedJob, peak: float) -> None:
        self.recorded.append((job.family, job.quant, job.task.name, peak))


async def run_one(reg: TaskRegistry, runner: TaskRunner, payload: str) -> object:
    with trio.fail_after(10):
        return await runner.execute(reg.prepare("image-gen", payload, "j"))


async def test_node_091_largest_sample_reported_once(tmp_path: Path) -> None:
    hooks = Hooks([1.5, 3.25, 2.0])
    runner = TaskRunner(kill_grace=1, sample_peak=hooks.sample, record_peak=hooks.record)
    outcome = await run_one(registry(tmp_path), runner, '{"sleep": 0.1}')
    assert isinstance(outcome, Done)
    assert hooks.recorded == [("sdxl", "bf16", "image-gen", 3.25)]
    assert hooks.sampled == 1
    assert len(hooks.pids) == 1 and hooks.pids[0] > 0


async def test_node_092_exit_0_no_output_is_error_no_footprint(tmp_path: Path) -> None:
    hooks = Hooks([2.0])
    runner = TaskRunner(kill_grace=1, sample_peak=hooks.sample, record_peak=hooks.record)
    outcome = await run_one(registry(tmp_path), runner, '{"stdout": ""}')
    assert isinstance(outcome, Failed) and hooks.recorded == []


async def test_node_093_nonzero_exit_no_footprint(tmp_path: Path) -> None:
    hooks = Hooks([2.0])
    runner = TaskRunner(kill_grace=1, sample_peak=hooks.sample, record_peak=hooks.record)
    outcome = await run_one(registry(tmp_path), runner, '{"exit": 1}')
    assert isinstance(outcome, Failed) and hooks.recorded == []


async def test_node_094_sampling_off_never_calls_hooks(tmp_path: Path) -> None:
    hooks = Hooks([2.0])
    runner = TaskRunner(kill_grace=1, sample_peak=hooks.sample, record_peak=hooks.record)
    outcome = await run_one(registry(tmp_path, footprint=False), runner, "{}")
    assert isinstance(outcome, Done) and hooks.sampled == 0 and hooks.recorded == []


async def test_node_095_sampling_on_without_callbacks(tmp_path: Path) -> None:
    hooks = Hooks([2.0])
    for runner in (
        TaskRunner(kill_grace=1),
        TaskRunner(kill_grace=1, sample_peak=hooks.sample),
    ):
        assert isinstance(await run_one(registry(tmp_path), runner, "{}"), Done)


async def test_node_099_hook_records_exact_key_with_margin(tmp_path: Path) -> None:
    from fleet_trio.gpu import FootprintKey, FootprintStore
    from fleet_trio.node.server import GpuServices, footprint_hooks

    store = await FootprintStore.open(str(tmp_path / "fp.json"), margin=1.2)

    class Sampler:
        def status(self, now: float) -> tuple[None, str]:
            return None, "no snapshot"

        async def serve(self, *, task_status: trio.TaskStatus[None]) -> None:
            task_status.started()

    gpu = GpuServices(sampler=Sampler(), footprints=store, source=object())
    sample, record = footprint_hooks(gpu)
    assert sample is not None and record is not None
    job = registry(tmp_path).prepare("image-gen", "{}", "j")
    await record(job, 3.0)
    job.cleanup()
    rec = store.get(FootprintKey("sdxl", "bf16", "image-gen"))
    assert rec is not None and rec.entry().vram_peak_gb == 3.6
