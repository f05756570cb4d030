"""GPU facts for labels from NVML first, nvidia-smi when NVML is not usable."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import trio

from fleet_trio.gpu.nvml import MIB, gpu_rows_sync
from fleet_trio.worker.config import DeviceConfig, WorkerConfig
from fleet_trio.worker.probes import Prober, nvidia_labels


class FakeNvml:
    """A pynvml stand-in: two H200-like devices (numbers as seen on a real H200)."""

    def __init__(self, *, init_fails: bool = False) -> None:
        self.init_fails = init_fails
        self.shutdowns = 0

    def nvmlInit(self) -> None:
        if self.init_fails:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return "580.159.04"

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return b"NVIDIA H200"

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        return SimpleNamespace(total=150754820096, free=150109880320 - handle * 1024 * MIB)


def test_rows_match_the_nvidia_smi_query_units() -> None:
    lib = FakeNvml()
    assert gpu_rows_sync(lib) == [
        ("NVIDIA H200", 143771, 143156, "580.159.04"),
        ("NVIDIA H200", 143771, 142132, "580.159.04"),
    ]
    assert lib.shutdowns == 1


async def test_facts_come_from_nvml_when_usable(tmp_path: Path) -> None:
    with trio.fail_after(10):
        nv = await nvidia_labels(path=str(tmp_path), nvml=True, nvml_lib=FakeNvml())
    assert nv.found and not nv.broken
    assert nv.facts == {
        "gpu0.vendor": "nvidia",
        "gpu0.model": "NVIDIA H200",
        "gpu0.vram": "143771M",
        "gpu0.vram_free": "143156M",
        "gpu0.driver": "580.159.04",
        "gpu1.vendor": "nvidia",
        "gpu1.model": "NVIDIA H200",
        "gpu1.vram": "143771M",
        "gpu1.vram_free": "142132M",
        "gpu1.driver": "580.159.04",
    }


async def test_falls_back_to_nvidia_smi_when_nvml_is_not_usable(tmp_path: Path) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA A100-SXM4-80GB, 81920, 80000, 550.54.15'\n")
    smi.chmod(0o755)
    with trio.fail_after(10):
        nv = await nvidia_labels(path=str(tmp_path), nvml=True, nvml_lib=FakeNvml(init_fails=True))
    assert nv.found and not nv.broken
    assert nv.facts is not None and nv.facts["gpu0.vram"] == "81920M"
    assert nv.facts["gpu0.model"] == "NVIDIA A100-SXM4-80GB"


async def test_no_nvml_and_no_nvidia_smi_is_no_facts_without_error(tmp_path: Path) -> None:
    with trio.fail_after(10):
        nv = await nvidia_labels(path=str(tmp_path), nvml=True, nvml_lib=FakeNvml(init_fails=True))
    assert (nv.facts, nv.found, nv.broken) == (None, False, False)


def test_prober_uses_nvml_only_without_an_explicit_nvidia_smi_path() -> None:
    cfg = WorkerConfig(controller_url="http://x", host="h", devices=(DeviceConfig(name="gpu0"),))
    assert Prober(cfg).nvml is True
    assert Prober(cfg, path="/opt/fake-bin").nvml is False
    assert Prober(cfg, path="/opt/fake-bin", nvml=True).nvml is True
