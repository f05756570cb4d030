"""Stand-ins for the GPU tools, for the GPU source tests: :func:`install_smi` puts a scripted
``nvidia-smi`` in ``tmp_path/bin``; :class:`FakeNvml` (with :class:`FakeNVMLError`) is just
enough of the ``pynvml`` module for :class:`~fleet_trio.gpu.nvml.NvmlSource`."""

from __future__ import annotations

import stat
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from fleet_trio.gpu import GIB


class FakeNVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"nvml error {value}")
        self.value = value


class FakeNvml:
    """Just enough of ``pynvml`` for :class:`NvmlSource`."""

    NVMLError = FakeNVMLError
    NVML_ERROR_NOT_SUPPORTED = 3

    def __init__(self) -> None:
        self.inits = 0
        self.shutdowns = 0
        self.fail_init = False
        self.compute: Any = [SimpleNamespace(pid=10, usedGpuMemory=GIB)]
        self.graphics: Any = [SimpleNamespace(pid=10, usedGpuMemory=GIB)]
        self.memory = SimpleNamespace(total=80 * GIB, used=3 * GIB, free=77 * GIB)

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise FakeNVMLError(12)
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> object:
        if index != 0:
            raise FakeNVMLError(2)
        return ("handle", index)

    def nvmlDeviceGetMemoryInfo(self, handle: object) -> Any:
        return self.memory

    def nvmlDeviceGetComputeRunningProcesses(self, handle: object) -> Any:
        if isinstance(self.compute, Exception):
            raise self.compute
        return self.compute

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: object) -> Any:
        if isinstance(self.graphics, Exception):
            raise self.graphics
        return self.graphics

    def nvmlDeviceGetName(self, handle: object) -> bytes:
        return b"NVIDIA H200"


def install_smi(tmp_path: Path, body: str) -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    exe = bin_dir / "nvidia-smi"
    exe.write_text(body)
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(exe)
