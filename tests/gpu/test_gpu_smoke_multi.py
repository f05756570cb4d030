"""``scripts/gpu_smoke.py``'s multi-GPU section, run against the fake GPU (two devices): the
node's ``gpu_devices`` matches the enumeration and each pinned job sees its own device. On a
GPU machine the same section runs against NVML (``scripts/gpu-smoke``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import trio

from fleet_trio.sim.fleet import free_port

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_smoke.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_smoke", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gpu_smoke", module)
    spec.loader.exec_module(module)
    return module


async def test_multi_gpu_section_on_two_fake_devices(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    smoke = _load()
    args = ("--gpu", "fake", "--fake-gpu-dir", str(tmp_path / "gpu"), "--fake-gpus", "2")
    with trio.fail_after(120):
        ok = await smoke.multi_gpu_section(None, gpu_args=args, port=free_port())
    out = capsys.readouterr().out
    assert ok, out
    assert "FAIL" not in out
    assert "torch pinning check is skipped" in out


def test_compare_devices() -> None:
    smoke = _load()
    one = [{"index": 0, "uuid": "GPU-a", "name": "X", "vram_total_gb": 80.0}]
    two = [*one, {"index": 1, "uuid": "GPU-b", "name": "X", "vram_total_gb": 80.0}]
    assert smoke.compare_devices(None, one) == []
    assert smoke.compare_devices([], one) == ["gpu_devices is present on a one-device machine"]
    listed = [{**d, "vram_free_gb": 1.0} for d in two]
    assert smoke.compare_devices(listed, two) == []
    assert smoke.compare_devices(listed[:1], two) != []
    assert smoke.compare_devices(None, two) != []


async def test_multi_gpu_section_on_a_one_gpu_machine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fleet_trio.gpu.fake import init_device

    smoke = _load()
    init_device(str(tmp_path / "gpu"))
    args = ("--gpu", "fake", "--fake-gpu-dir", str(tmp_path / "gpu"))
    with trio.fail_after(120):
        ok = await smoke.multi_gpu_section(None, gpu_args=args, port=free_port())
    out = capsys.readouterr().out
    assert ok, out
    assert "gpu_devices: null" in out and "pinned to: ['']" in out
