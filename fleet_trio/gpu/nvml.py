"""The NVML source (node.md §5.6): the only module that imports ``pynvml`` (nvidia-ml-py).

``pynvml`` is imported lazily, on first use, so the package imports on a machine without a
GPU or driver. Every NVML call runs in a worker thread behind the source's
``CapacityLimiter(1)``; calls are abandonable on cancel, so a hung driver (a reset, §10.4)
cannot hold up shutdown; the caller's timeout turns it into a failed sample.

Tests inject a ``pynvml``-like object through the ``nvml`` parameter.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import trio

from fleet_trio.gpu.source import GIB, DeviceSet, GpuDevice, GpuError, VramSnapshot, check_memory

log = logging.getLogger(__name__)

T = TypeVar("T")


def _load_pynvml() -> Any:
    try:
        import pynvml
    except ImportError as exc:  # nvidia-ml-py is a dependency, but be clear if it is missing
        raise GpuError(f"nvml: the nvidia-ml-py package is not installed ({exc})") from exc
    return pynvml


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


MIB = 1 << 20


def _init(nvml: Any | None) -> Any:
    """``nvml`` (the module when ``None``), initialised; :class:`GpuError` if it cannot be."""
    lib = nvml if nvml is not None else _load_pynvml()
    try:
        lib.nvmlInit()
    except Exception as exc:
        raise GpuError(f"nvml: init failed: {exc}") from exc
    return lib


def gpu_rows_sync(nvml: Any | None = None) -> list[tuple[str, int, int, str]]:
    """Every GPU NVML sees, in index order: ``(name, total MiB, free MiB, driver version)`` —
    the rows of the worker's ``nvidia-smi --query-gpu=name,memory.total,memory.free,
    driver_version`` label query (worker-process.md §6.3), read from the driver library
    instead of a subprocess. :class:`GpuError` when NVML cannot be used. Blocking.
    """
    lib = _init(nvml)
    try:
        driver = _text(lib.nvmlSystemGetDriverVersion()).strip()
        rows = []
        for index in range(int(lib.nvmlDeviceGetCount())):
            handle = lib.nvmlDeviceGetHandleByIndex(index)
            memory = lib.nvmlDeviceGetMemoryInfo(handle)
            name = _text(lib.nvmlDeviceGetName(handle)).strip()
            # nvidia-smi rounds to the nearest MiB (143155.94 MiB free prints as 143156)
            rows.append(
                (name, round(int(memory.total) / MIB), round(int(memory.free) / MIB), driver)
            )
        return rows
    except GpuError:
        raise
    except Exception as exc:
        raise GpuError(f"nvml: device query failed: {exc}") from exc
    finally:
        with contextlib.suppress(Exception):
            lib.nvmlShutdown()


class NvmlSource:
    """A :class:`~fleet_trio.gpu.source.GpuSource` backed by NVML, for device ``index``."""

    name = "nvml"

    def __init__(
        self,
        *,
        index: int = 0,
        nvml: Any | None = None,
        limiter: trio.CapacityLimiter | None = None,
    ) -> None:
        self.index = index
        self.limiter = limiter if limiter is not None else trio.CapacityLimiter(1)
        self._lib = nvml
        self._handle: Any = None
        self._initialised = False
        self._closed = False

    # -- thread side ----------------------------------------------------------------------
    def _nvml(self) -> Any:
        if self._lib is None:
            self._lib = _load_pynvml()
        return self._lib

    def init_sync(self) -> None:
        """``nvmlInit`` (once per source) and the device handle; :class:`GpuError` on failure.

        Blocking: :func:`~fleet_trio.gpu.source.open_source` calls it directly; the async
        methods call it in the worker thread when needed.
        """
        if self._closed:
            raise GpuError("nvml: source is closed")
        if self._initialised:
            return
        lib = _init(self._nvml())
        try:
            handle = lib.nvmlDeviceGetHandleByIndex(self.index)
        except Exception as exc:
            with contextlib.suppress(Exception):
                lib.nvmlShutdown()
            raise GpuError(f"nvml: no device at index {self.index}: {exc}") from exc
        self._handle = handle
        self._initialised = True

    def _memory_sync(self) -> tuple[float, float]:
        self.init_sync()
        try:
            info = self._nvml().nvmlDeviceGetMemoryInfo(self._handle)
        except Exception as exc:
            raise GpuError(f"nvml: memory query failed: {exc}") from exc
        return check_memory(int(info.total) / GIB, int(info.used) / GIB)

    def _not_supported(self, exc: Exception) -> bool:
        code = getattr(self._nvml(), "NVML_ERROR_NOT_SUPPORTED", 3)
        return getattr(exc, "value", None) == code

    def _processes_sync(self) -> dict[int, int] | None:
        self.init_sync()
        lib = self._nvml()
        try:
            compute = list(lib.nvmlDeviceGetComputeRunningProcesses(self._handle))
        except Exception as exc:
            if self._not_supported(exc):
                return None
            raise GpuError(f"nvml: process query failed: {exc}") from exc
        try:
            graphics = list(lib.nvmlDeviceGetGraphicsRunningProcesses(self._handle))
        except Exception:
            graphics = []  # optional: compute processes are what jobs are
        out: dict[int, int] = {}
        unknown = 0
        for proc in compute + graphics:
            used = getattr(proc, "usedGpuMemory", None)
            if used is None:  # NVML_VALUE_NOT_AVAILABLE (WDDM, MIG, no privilege)
                unknown += 1
                continue
            pid = int(proc.pid)
            # A process listed as both compute and graphics has one allocation: take the max.
            out[pid] = max(out.get(pid, 0), int(used))
        if unknown and not out:
            return None
        return out

    def _name_sync(self) -> str:
        self.init_sync()
        return _text(self._nvml().nvmlDeviceGetName(self._handle)).strip()

    def _shutdown_sync(self) -> None:
        if self._initialised:
            self._initialised = False
            self._handle = None
            self._nvml().nvmlShutdown()

    async def _call(self, fn: Callable[[], T]) -> T:
        return await trio.to_thread.run_sync(fn, limiter=self.limiter, abandon_on_cancel=True)

    # -- the GpuSource API ----------------------------------------------------------------
    async def snapshot(self) -> VramSnapshot:
        total, used = await self._call(self._memory_sync)
        return VramSnapshot.now(total, used)

    async def process_used_bytes(self) -> dict[int, int] | None:
        return await self._call(self._processes_sync)

    async def device_name(self) -> str:
        try:
            return await self._call(self._name_sync)
        except Exception:
            return ""

    async def aclose(self) -> None:
        """``nvmlShutdown`` (once); later calls raise :class:`GpuError`."""
        self._closed = True
        with (
            trio.CancelScope(shield=True),
            trio.move_on_after(5),
            contextlib.suppress(Exception),
        ):
            await trio.to_thread.run_sync(self._shutdown_sync, limiter=self.limiter)


def open_nvml_devices(nvml: Any | None = None) -> DeviceSet:
    """Every device NVML sees, in index order, each an :class:`NvmlSource` of its own (own
    limiter: a device whose calls hang does not hold up the others). A device whose handle,
    UUID or name cannot be read is left out with a warning; none left is a :class:`GpuError`.
    Blocking (``nvmlInit``).
    """
    lib = _init(nvml)
    devices: list[GpuDevice] = []
    try:
        try:
            count = int(lib.nvmlDeviceGetCount())
        except Exception as exc:
            raise GpuError(f"nvml: device count failed: {exc}") from exc
        for index in range(count):
            source = NvmlSource(index=index, nvml=lib)
            try:
                source.init_sync()
                uuid = _text(lib.nvmlDeviceGetUUID(source._handle)).strip()
                name = _text(lib.nvmlDeviceGetName(source._handle)).strip()
            except Exception as exc:
                log.warning("nvml: device %d left out: %s", index, exc)
                with contextlib.suppress(Exception):
                    source._shutdown_sync()
                continue
            devices.append(GpuDevice(index=index, uuid=uuid, name=name, source=source))
    finally:
        with contextlib.suppress(Exception):
            lib.nvmlShutdown()  # the enumeration's own init; each source holds its own
    if not devices:
        raise GpuError("nvml: no usable device")
    return DeviceSet("nvml", tuple(devices))


__all__ = ["NvmlSource", "gpu_rows_sync", "open_nvml_devices"]
