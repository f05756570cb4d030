"""The GPU source contract: one device's memory snapshot and per-process usage (node.md §5).

Three sources implement :class:`GpuSource`: NVML (:mod:`fleet_trio.gpu.nvml`, preferred),
``nvidia-smi`` (:mod:`fleet_trio.gpu.smi`, the contract's CLI path) and a fake GPU driven by
real processes (:mod:`fleet_trio.gpu.fake`). :func:`open_source` chooses one device;
:func:`open_devices` enumerates every device of the machine (multi-GPU nodes), each a
:class:`GpuDevice` with its own source.
"""

from __future__ import annotations

import math
import time
from typing import Protocol, runtime_checkable

import attrs
import trio

from fleet_trio.errors import FleetTrioError

GIB = 1 << 30
MIB = 1 << 20
SOURCE_KINDS = ("auto", "nvml", "smi", "fake")


class GpuError(FleetTrioError):
    """A GPU query failed (driver missing, command failed, output unparseable, …)."""


@attrs.frozen
class VramSnapshot:
    """One successful global sample of a device. Sizes are GiB (2^30 bytes)."""

    total_gb: float
    used_gb: float
    free_gb: float
    taken_at: float
    """``trio.current_time()`` of the sample: measure staleness with this."""
    wall_time: float
    """``time.time()`` of the sample (for wire timestamps only)."""

    @classmethod
    def now(cls, total_gb: float, used_gb: float) -> VramSnapshot:
        """A snapshot taken at this moment; ``free = total - used`` (not clamped, §11 M)."""
        return cls(
            total_gb=total_gb,
            used_gb=used_gb,
            free_gb=total_gb - used_gb,
            taken_at=trio.current_time(),
            wall_time=time.time(),
        )


def check_memory(total_gb: float, used_gb: float) -> tuple[float, float]:
    """Reject what the contract counts as a failed probe: total ≤ 0, used < 0, non-finite."""
    if not math.isfinite(total_gb) or not math.isfinite(used_gb):
        raise GpuError(f"non-finite memory value (total {total_gb!r}, used {used_gb!r})")
    if total_gb <= 0:
        raise GpuError(f"non-positive total memory: {total_gb!r}")
    if used_gb < 0:
        raise GpuError(f"negative used memory: {used_gb!r}")
    return total_gb, used_gb


@runtime_checkable
class GpuSource(Protocol):
    """One device (index configurable, default 0)."""

    name: str
    """``"nvml"``, ``"smi"`` or ``"fake"``."""

    async def snapshot(self) -> VramSnapshot:
        """The device's memory now; raises :class:`GpuError` on failure."""
        ...

    async def process_used_bytes(self) -> dict[int, int] | None:
        """pid → bytes on the device; ``None`` when per-process accounting is unavailable."""
        ...

    async def device_name(self) -> str:
        """The product name, e.g. ``"NVIDIA H200"`` (``""`` when unknown)."""
        ...


@attrs.frozen
class GpuDevice:
    """One enumerated device: its index (the driver's), UUID, product name and its source."""

    index: int
    uuid: str
    name: str
    source: GpuSource = attrs.field(eq=False, repr=False)


@attrs.frozen
class DeviceSet:
    """Every device a node uses (index order), from one kind of source."""

    kind: str
    """``"nvml"``, ``"smi"`` or ``"fake"``."""
    devices: tuple[GpuDevice, ...]

    def __len__(self) -> int:
        return len(self.devices)

    async def aclose(self) -> None:
        for device in self.devices:
            close = getattr(device.source, "aclose", None)
            if close is not None:
                await close()


def select_devices(
    devices: tuple[GpuDevice, ...], wanted: tuple[int | str, ...]
) -> tuple[GpuDevice, ...]:
    """The devices named in ``wanted`` (an index or a UUID each), in index order; all of them
    when ``wanted`` is empty. :class:`GpuError` names the first entry that matches nothing."""
    if not wanted:
        return devices
    chosen: dict[int, GpuDevice] = {}
    for entry in wanted:
        match = [
            d
            for d in devices
            if (isinstance(entry, int) and d.index == entry)
            or (isinstance(entry, str) and d.uuid == entry)
        ]
        if not match:
            present = ", ".join(f"{d.index} ({d.uuid})" for d in devices) or "none"
            raise GpuError(f"no device {entry!r} on this machine (devices: {present})")
        chosen[match[0].index] = match[0]
    return tuple(chosen[i] for i in sorted(chosen))


async def open_devices(
    kind: str = "auto",
    *,
    fake_dir: str | None = None,
    fake_gpus: int = 1,
    smi_timeout: float = 5.0,
) -> DeviceSet:
    """Enumerate every device of the machine (NVML first, then ``nvidia-smi``'s 5-field
    per-device query, or the fake GPU) as a :class:`DeviceSet`; :class:`GpuError` when none
    is usable.

    ``fake`` with ``fake_gpus == 1`` is today's single device at ``fake_dir``; with more, the
    devices are ``fake_dir/gpu0`` … ``gpu{N-1}`` (made when missing, each with its own UUID).
    """
    # A limiter of its own: an enumeration that hangs (and is abandoned on cancel: it cannot
    # hold a shutdown) keeps this token, never one of trio's default limiter.
    limiter = trio.CapacityLimiter(1)
    if kind == "fake":
        from fleet_trio.gpu.fake import open_fake_devices

        return await trio.to_thread.run_sync(
            open_fake_devices,
            _fake_dir(fake_dir),
            fake_gpus,
            limiter=limiter,
            abandon_on_cancel=True,
        )
    if kind == "smi":
        from fleet_trio.gpu.smi import open_smi_devices

        return await open_smi_devices(smi_timeout=smi_timeout)
    if kind in ("nvml", "auto"):
        from fleet_trio.gpu.nvml import open_nvml_devices

        try:
            return await trio.to_thread.run_sync(
                open_nvml_devices, limiter=limiter, abandon_on_cancel=True
            )
        except GpuError as nvml_error:
            if kind == "nvml":
                raise
            from fleet_trio.gpu.smi import open_smi_devices

            _smi_fallback(nvml_error)
            return await open_smi_devices(smi_timeout=smi_timeout)
    raise GpuError(f"unknown gpu source {kind!r} (expected one of {', '.join(SOURCE_KINDS)})")


def _fake_dir(fake_dir: str | None) -> str:
    from fleet_trio.gpu.fake import default_fake_dir

    directory = fake_dir or default_fake_dir()
    if not directory:
        raise GpuError("fake gpu: no directory (pass fake_dir or set FLEET_TRIO_FAKE_GPU_DIR)")
    return directory


def _smi_fallback(nvml_error: GpuError) -> None:
    """``auto`` after NVML failed: nvidia-smi must be on ``PATH``, else :class:`GpuError`."""
    from fleet_trio.gpu.smi import find_nvidia_smi

    if find_nvidia_smi() is None:
        raise GpuError(
            f"no GPU source: NVML did not initialise ({nvml_error}) and nvidia-smi is not "
            "on PATH; install the NVIDIA driver, or use the fake GPU (--gpu fake)"
        ) from nvml_error


def open_source(
    kind: str = "auto",
    *,
    index: int = 0,
    fake_dir: str | None = None,
    smi_timeout: float = 5.0,
) -> GpuSource:
    """Open a source.

    ``auto``: NVML if it initialises, else ``nvidia-smi`` if it is on ``PATH``, else
    :class:`GpuError`. ``nvml`` / ``smi`` / ``fake`` force one. ``fake`` uses ``fake_dir``, or
    ``$FLEET_TRIO_FAKE_GPU_DIR``.

    This is synchronous and, for NVML, calls ``nvmlInit`` (usually a few ms, occasionally
    more on a cold driver): call it before ``trio.run`` or through ``trio.to_thread.run_sync``.
    """
    if index < 0:
        raise GpuError(f"gpu index must be >= 0, got {index}")
    if kind == "fake":
        from fleet_trio.gpu.fake import FakeGpu

        return FakeGpu(_fake_dir(fake_dir))
    if kind == "smi":
        from fleet_trio.gpu.smi import SmiSource

        return SmiSource(index=index, timeout=smi_timeout)
    if kind in ("nvml", "auto"):
        from fleet_trio.gpu.nvml import NvmlSource

        nvml_source = NvmlSource(index=index)
        try:
            nvml_source.init_sync()
        except GpuError as nvml_error:
            if kind == "nvml":
                raise
            from fleet_trio.gpu.smi import SmiSource

            _smi_fallback(nvml_error)
            return SmiSource(index=index, timeout=smi_timeout)
        return nvml_source
    raise GpuError(f"unknown gpu source {kind!r} (expected one of {', '.join(SOURCE_KINDS)})")


__all__ = [
    "GIB",
    "MIB",
    "SOURCE_KINDS",
    "DeviceSet",
    "GpuDevice",
    "GpuError",
    "GpuSource",
    "VramSnapshot",
    "check_memory",
    "open_devices",
    "open_source",
    "select_devices",
]
