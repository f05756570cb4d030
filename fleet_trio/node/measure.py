"""``fleet-trio measure``: seed the footprint store by running each task's probe (node.md §8).

Every configured task with a ``probe:`` payload runs once, in declaration order, through the
node's own executor (:class:`~fleet_trio.node.tasks.TaskRegistry` →
:class:`~fleet_trio.node.tasks.TaskRunner`) with the node's render-sampling hook, so the
recorded footprint is exactly what a fleet job of that task would record. Tasks without a
probe, and tasks with ``footprint: false``, are skipped with a note. One task's failure does
not stop the others.

Progress goes through ``say`` (the CLI prints it on stderr); the caller prints
:attr:`MeasureReport.entries` (the store's entries in ``model_footprints`` shape) on stdout.
"""

from __future__ import annotations

import json
import math
import os
import signal
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs
import trio

from fleet_trio.errors import FleetTrioError, WireError
from fleet_trio.gpu.source import GpuError
from fleet_trio.node.app import FootprintEntryLike
from fleet_trio.node.config import NodeConfig
from fleet_trio.node.jobs import Done
from fleet_trio.node.server import (
    GpuServices,
    NodeOptions,
    NodeStartError,
    footprint_hooks,
    open_gpu,
)
from fleet_trio.node.tasks import PreparedJob, TaskRegistry, TaskRunner
from fleet_trio.nursery import TaskTree, open_task_tree

MEASURE_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class MeasureUsageError(FleetTrioError):
    """A bad selection (``--task`` naming no configured task); the CLI exits 2."""


@attrs.frozen
class MeasureOptions:
    gpu: str = "auto"
    fake_gpu_dir: str | None = None
    fake_gpus: int = 1
    """Multi-GPU: devices of the fake GPU (``--fake-gpus``)."""
    footprints: str | None = None
    tasks: tuple[str, ...] = ()
    """Only these tasks (in declaration order); empty = every configured task."""


@attrs.frozen
class ProbeResult:
    task: str
    status: str
    """``done``, ``failed``, ``skipped`` or ``interrupted``."""
    detail: str = ""
    peak_gb: float | None = None
    """The observed peak (GiB) when one was recorded."""


@attrs.frozen
class MeasureReport:
    results: tuple[ProbeResult, ...]
    entries: tuple[dict[str, Any], ...]
    """The store's entries after the run, as health's ``model_footprints`` lists them."""

    @property
    def ok(self) -> bool:
        """Every probed task succeeded (skips do not count)."""
        return all(r.status in ("done", "skipped") for r in self.results)

    def entries_json(self) -> str:
        return json.dumps(list(self.entries), indent=2)


GPU_CHECK_TIMEOUT = 10.0
"""Seconds the GPU check before measuring may take; a driver that never answers is refused."""


def select_tasks(registry: TaskRegistry, wanted: Sequence[str]) -> list[str]:
    """Configured tasks in declaration order, limited to ``wanted`` when given."""
    unknown = [name for name in wanted if registry.get(name) is None]
    if unknown:
        raise MeasureUsageError(
            f"--task {unknown[0]}: not a configured task "
            f"(configured: {', '.join(registry.supported) or 'none'})"
        )
    return [name for name in registry.supported if not wanted or name in wanted]


async def check_gpu(gpu: GpuServices, *, timeout_s: float = GPU_CHECK_TIMEOUT) -> None:
    """One global sample: refuse a GPU that answers nothing usable (like the node, §7.5).

    The sample runs under ``timeout_s``: a driver that never answers is refused, not waited on.

    Cancellation: cancelling the caller cancels the sample (an NVML call is abandoned in its
    thread) and raises ``Cancelled``.
    """
    if gpu.source is None or gpu.footprints is None:
        raise NodeStartError("no GPU source or footprint store to measure with")
    snap = None
    with trio.move_on_after(timeout_s):
        try:
            snap = await gpu.source.snapshot()
        except GpuError as exc:
            raise NodeStartError(f"GPU probe failed: {exc}") from exc
    if snap is None:
        raise NodeStartError(f"GPU probe failed: no answer within {timeout_s:g}s")
    if not (math.isfinite(snap.total_gb) and snap.total_gb > 0):
        raise NodeStartError("GPU probe returned no usable VRAM (total <= 0)")


@attrs.define
class RunningProbe:
    """The probe running now (``""``: none), for the stop message."""

    name: str = ""


def _wire(entries: Iterable[FootprintEntryLike]) -> list[dict[str, Any]]:
    return [dict(e.to_wire()) for e in entries]


def _wire_key(wire: Mapping[str, Any]) -> tuple[str, str, str]:
    return (wire.get("model_family", ""), wire.get("quant", ""), wire.get("task_type", ""))


async def measure(
    config: NodeConfig,
    options: MeasureOptions = MeasureOptions(),
    *,
    say: Callable[[str], None],
    gpu: GpuServices | None = None,
    work_root: str | None = None,
    handle_signals: bool = False,
) -> MeasureReport:
    """Run the probes; raises :class:`NodeStartError` (no GPU) or :class:`MeasureUsageError`.

    ``gpu=None`` opens the real GPU package (``options.gpu``: auto|nvml|smi|fake) and the
    footprint store (``options.footprints`` or ``node.footprints.path``).

    Everything runs in a task tree (``fleet_trio.nursery``); with ``handle_signals`` it serves
    SIGTERM and SIGINT from the moment it opens: a signal while the GPU opens ends the run
    with every probe ``not run``, one during a probe kills that probe (its process group gets
    the kill grace) and marks it ``interrupted``.

    Cancellation: the running probe's process group is killed; nothing is recorded for it.
    """
    registry = TaskRegistry(config.tasks, base_dir=config.base_dir, work_root=work_root)
    names = select_tasks(registry, options.tasks)
    grace = config.node.timings.kill_grace

    running = RunningProbe()

    def stopping() -> None:
        # a shutdown request while a probe runs; a run that ends by itself, or on an error
        # before any probe, stops nothing and says nothing
        if running.name:
            say(f"stopping (the running probe, {running.name}, is killed)")

    async with open_task_tree(
        drain=0.0,
        kill_grace=grace,
        on_stop_accepting=stopping,
        signals=MEASURE_SIGNALS if handle_signals else (),
    ) as tree:
        return await _measure(
            config, options, registry, names, say=say, gpu=gpu, tree=tree, running=running
        )


async def _measure(
    config: NodeConfig,
    options: MeasureOptions,
    registry: TaskRegistry,
    names: Sequence[str],
    *,
    say: Callable[[str], None],
    gpu: GpuServices | None,
    tree: TaskTree,
    running: RunningProbe,
) -> MeasureReport:
    with trio.CancelScope() as opening:
        tree.cancel_on_shutdown(opening)  # a signal while the GPU opens: nothing runs
        if gpu is None:
            gpu = await open_gpu(
                config,
                NodeOptions(
                    gpu=options.gpu,
                    fake_gpu_dir=options.fake_gpu_dir,
                    fake_gpus=options.fake_gpus,
                    footprints=options.footprints,
                ),
            )
        await check_gpu(gpu)
    if gpu is None or opening.cancelled_caught:
        not_run = tuple(ProbeResult(name, "interrupted", "not run") for name in names)
        for result in not_run:
            say(f"{result.task}: {result.status} ({result.detail})")
        return MeasureReport(results=not_run, entries=())
    footprints = gpu.footprints
    assert footprints is not None
    sample, record = footprint_hooks(gpu)
    assert sample is not None and record is not None
    peaks: dict[str, float] = {}

    async def record_and_keep(job: PreparedJob, peak: float) -> None:
        peaks[job.job_id] = peak
        await record(job, peak)

    # each probe runs pinned to a device of the node's placement (multi-GPU) and is measured
    # on that device; probes run one at a time
    runner = TaskRunner(
        kill_grace=config.node.timings.kill_grace,
        placement=gpu.placement,
        sample_peak=sample,
        record_peak=record_and_keep,
    )
    results: list[ProbeResult] = []

    def note(result: ProbeResult) -> None:
        results.append(result)
        text = f"{result.task}: {result.status}"
        say(f"{text} ({result.detail})" if result.detail else text)

    async def probe_one(name: str) -> None:
        task = registry.get(name)
        assert task is not None
        if task.probe is None:
            note(ProbeResult(name, "skipped", "no probe configured"))
            return
        if task.footprint is None:
            note(ProbeResult(name, "skipped", "footprint: false or absent, never sampled"))
            return
        job_id = f"fleet-measure-{name}-{os.getpid()}"
        try:
            job = registry.prepare(name, json.dumps(task.probe), job_id)
        except WireError as exc:
            note(ProbeResult(name, "failed", f"probe payload refused: {exc}"))
            return
        say(f"{name}: started (footprint key {job.family}/{job.quant or '-'}/{name})")
        started = trio.current_time()
        running.name = name
        try:
            outcome = await runner.execute(job)
        finally:
            running.name = ""
        took = trio.current_time() - started
        if not isinstance(outcome, Done):
            note(ProbeResult(name, "failed", outcome.message))
            return
        peak = peaks.get(job_id)
        if peak is None:
            note(ProbeResult(name, "done", f"{took:.1f}s; no VRAM seen, nothing recorded"))
            return
        key = (job.family, job.quant, name)
        stored = [w for w in _wire(footprints.entries()) if _wire_key(w) == key]
        advertised = stored[0].get("vram_peak_gb") if stored else None
        note(
            ProbeResult(
                name,
                "done",
                f"{took:.1f}s; peak {peak:.2f} GiB, footprint now {advertised} GiB",
                peak_gb=peak,
            )
        )

    current = ""
    with trio.CancelScope() as scope:
        tree.cancel_on_shutdown(scope)  # a signal: the running probe is killed
        for name in names:
            if scope.cancel_called:  # the stop came as the last probe ended: no other starts
                break
            current = name
            await probe_one(name)
            current = ""
    if scope.cancel_called:
        done = {r.task for r in results}
        for name in names:
            if name not in done:
                note(ProbeResult(name, "interrupted", "" if name == current else "not run"))
    try:
        await footprints.reload_if_changed()
    except Exception as exc:  # the in-memory entries are still worth printing
        say(f"footprints: reload failed ({exc}); printing what this run knows")
    entries = tuple(_wire(footprints.entries()))
    return MeasureReport(results=tuple(results), entries=entries)


__all__ = [
    "MeasureOptions",
    "MeasureReport",
    "MeasureUsageError",
    "ProbeResult",
    "check_gpu",
    "measure",
    "select_tasks",
]
