"""The health sampler of a multi-GPU node: one :class:`~fleet_trio.gpu.sampler.GlobalSampler`
per device, the headline device, and ``gpu_devices`` (docs/node.md, "Multi-GPU nodes").

Each device keeps its own last good snapshot and ages into "stale" on its own: a device that
fails to read does not touch the others. The headline (health's ``vram_total_gb`` /
``vram_free_gb``, and its 503 rule) is the device pinned by ``primary_gpu_uuid``, else the
fresh device with the largest total (ties: more free, then the lower index). With a single
device everything is exactly that device's ``GlobalSampler``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import trio

from fleet_trio.gpu.sampler import (
    DEFAULT_INTERVAL,
    DEFAULT_MAX_AGE,
    DEFAULT_SAMPLE_TIMEOUT,
    NO_SNAPSHOT,
    STALE_SNAPSHOT,
    GlobalSampler,
    tick_every,
)
from fleet_trio.gpu.source import GpuDevice, GpuError, VramSnapshot

DeviceListener = Callable[[GpuDevice, "VramSnapshot | None"], None]
"""Called after every sampling round for each device: its fresh snapshot, or ``None``."""


class DeviceSampler:
    """Samples every device every ``interval`` (concurrently, each with ``sample_timeout``)."""

    def __init__(
        self,
        devices: Sequence[GpuDevice],
        *,
        interval: float = DEFAULT_INTERVAL,
        max_age: float = DEFAULT_MAX_AGE,
        sample_timeout: float = DEFAULT_SAMPLE_TIMEOUT,
        primary_uuid: str = "",
    ) -> None:
        if not devices:
            raise GpuError("no GPU device to sample")
        if interval <= 0:
            raise ValueError(f"sampler interval must be positive, got {interval!r}")
        self.devices = tuple(devices)
        self.samplers = tuple(
            GlobalSampler(
                d.source, interval=interval, max_age=max_age, sample_timeout=sample_timeout
            )
            for d in self.devices
        )
        if primary_uuid and not any(d.uuid == primary_uuid for d in self.devices):
            present = ", ".join(d.uuid for d in self.devices)
            raise GpuError(
                f"primary_gpu_uuid {primary_uuid!r} is not one of this node's devices ({present})"
            )
        self.primary_uuid = primary_uuid
        self.interval = interval
        self.max_age = max_age
        self.listeners: list[DeviceListener] = []

    @property
    def multi(self) -> bool:
        return len(self.devices) > 1

    def sampler_of(self, uuid: str) -> GlobalSampler | None:
        for device, sampler in zip(self.devices, self.samplers, strict=True):
            if device.uuid == uuid:
                return sampler
        return None

    # -- what health reads (never blocks) ---------------------------------------------------
    def device_status(self, now: float) -> list[tuple[GpuDevice, VramSnapshot | None]]:
        """Every device with its fresh snapshot, or ``None`` (never sampled, or stale)."""
        return [(d, s.status(now)[0]) for d, s in zip(self.devices, self.samplers, strict=True)]

    def headline(self, now: float) -> tuple[GpuDevice | None, VramSnapshot | None, str | None]:
        """``(device, snapshot, None)``, or ``(device or None, None, reason)`` when the
        headline device has no fresh snapshot."""
        if len(self.samplers) == 1:
            snap, reason = self.samplers[0].status(now)
            return self.devices[0], snap, reason
        if self.primary_uuid:
            for device, sampler in zip(self.devices, self.samplers, strict=True):
                if device.uuid == self.primary_uuid:
                    snap, reason = sampler.status(now)
                    return device, snap, reason
        best: tuple[GpuDevice, VramSnapshot] | None = None
        for device, snap in self.device_status(now):
            if snap is None:
                continue
            if best is None or (snap.total_gb, snap.free_gb) > (best[1].total_gb, best[1].free_gb):
                best = (device, snap)
        if best is not None:
            return best[0], best[1], None
        ever = any(s.snapshot() is not None for s in self.samplers)
        return None, None, STALE_SNAPSHOT if ever else NO_SNAPSHOT

    # -- what /metrics reads (the GlobalSampler surface) ---------------------------------------
    def snapshot(self) -> VramSnapshot | None:
        """The headline device's last good snapshot, even a stale one (the pinned device,
        else the largest of those ever sampled); ``None`` before any success."""
        if len(self.samplers) == 1:
            return self.samplers[0].snapshot()
        if self.primary_uuid:
            sampler = self.sampler_of(self.primary_uuid)
            return sampler.snapshot() if sampler is not None else None
        best: VramSnapshot | None = None
        for sampler in self.samplers:
            snap = sampler.snapshot()
            if snap is not None and (
                best is None or (snap.total_gb, snap.free_gb) > (best.total_gb, best.free_gb)
            ):
                best = snap
        return best

    def device_snapshots(self) -> list[tuple[GpuDevice, VramSnapshot | None]]:
        """Multi-GPU ``/metrics``: every device with its last good snapshot (even stale),
        ``[]`` for a single device (the headline gauges already are that device)."""
        if not self.multi:
            return []
        return [(d, s.snapshot()) for d, s in zip(self.devices, self.samplers, strict=True)]

    @property
    def samples(self) -> int:
        """Successful samples, all devices together."""
        return sum(s.samples for s in self.samplers)

    @property
    def failures(self) -> int:
        """Failed samples, all devices together."""
        return sum(s.failures for s in self.samplers)

    def status(self, now: float) -> tuple[VramSnapshot | None, str | None]:
        """The headline device's ``(snapshot, None)`` or ``(None, reason)``: health's 503
        rule applies to it (the ``GlobalSampler.status`` contract)."""
        _device, snap, reason = self.headline(now)
        return snap, reason

    def gpu_devices(self, now: float) -> list[dict[str, Any]] | None:
        """Health's ``gpu_devices``: ``None`` (the member is absent) for a single device;
        else every device with a fresh snapshot, in index order, exactly ``index``, ``uuid``,
        ``name``, ``vram_total_gb``, ``vram_free_gb`` (GiB, not rounded). A device with no
        fresh snapshot is left out: its numbers are not known."""
        if not self.multi:
            return None
        out: list[dict[str, Any]] = []
        for device, snap in self.device_status(now):
            if snap is None or not (math.isfinite(snap.total_gb) and snap.total_gb > 0):
                continue
            if not math.isfinite(snap.free_gb):
                continue
            out.append(
                {
                    "index": device.index,
                    "uuid": device.uuid,
                    "name": device.name,
                    "vram_total_gb": snap.total_gb,
                    "vram_free_gb": snap.free_gb,
                }
            )
        return out

    # -- the service --------------------------------------------------------------------------
    async def sample_once(self) -> None:
        """One round: every device at once, then the listeners."""
        if len(self.samplers) == 1:
            await self.samplers[0].sample_once()
        else:
            async with trio.open_nursery() as nursery:
                for sampler in self.samplers:
                    nursery.start_soon(sampler.sample_once)
        self._notify()

    def _notify(self) -> None:
        now = trio.current_time()
        for device, snap in self.device_status(now):
            for listener in self.listeners:
                listener(device, snap)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Sample every device now, report started, then every ``interval`` until cancelled."""
        await self.sample_once()
        task_status.started()
        await tick_every(self.interval, self.sample_once)


__all__ = ["DeviceListener", "DeviceSampler"]
