"""nvidia-smi (with a scripted ``nvidia-smi`` on PATH), NVML (with an injected fake module),
and ``open_source``. The ``gpu_arch`` rules, the spec's vectors and the data-centre names beyond
them, are one table with node.md item 82 (``tests/acceptance/test_node_gpu.py``)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import trio

from fleet_trio.gpu import GIB, GpuError, open_source
from fleet_trio.gpu.nvml import NvmlSource
from fleet_trio.gpu.smi import SmiSource, parse_compute_apps, parse_smi_name
from tests.gpu.fakes import FakeNvml, FakeNVMLError, install_smi

FAKE_SMI = r"""#!/bin/sh
echo "$*" >> "{log}"
case "$*" in
  *memory.total*) printf '16384, 4096\r\n8192, 1\r\n' ;;
  *compute-apps*) printf '1234, 2048\n5678, 512\n' ;;
  *name*) printf 'NVIDIA H200\n' ;;
esac
"""


async def test_smi_source_queries(tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    exe = install_smi(tmp_path, FAKE_SMI.format(log=log))
    smi = SmiSource(command=exe)
    with trio.fail_after(20):
        snap = await smi.snapshot()
        assert (snap.total_gb, snap.used_gb, snap.free_gb) == (16.0, 4.0, 12.0)
        assert await smi.process_used_bytes() == {1234: 2 * GIB, 5678: GIB // 2}
        assert await smi.device_name() == "NVIDIA H200"
    calls = log.read_text().splitlines()
    assert calls[0] == "--query-gpu=memory.total,memory.used --format=csv,noheader,nounits"
    assert calls[1] == "--query-compute-apps=pid,used_memory --format=csv,noheader,nounits"
    assert calls[2] == "--query-gpu=name --format=csv,noheader"


async def test_smi_source_selects_a_device(tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    exe = install_smi(tmp_path, FAKE_SMI.format(log=log))
    with trio.fail_after(20):
        await SmiSource(command=exe, index=1).snapshot()
    assert log.read_text().split()[-1] == "--id=1"


async def test_smi_timeout_kills_a_hung_query(tmp_path: Path) -> None:
    exe = install_smi(tmp_path, "#!/bin/sh\nsleep 30\n")
    smi = SmiSource(command=exe, timeout=0.3)
    with trio.fail_after(10):
        with pytest.raises(GpuError, match="nvidia-smi"):
            await smi.snapshot()
        assert await smi.process_used_bytes() is None
        assert await smi.device_name() == ""


async def test_smi_failure_carries_stderr(tmp_path: Path) -> None:
    exe = install_smi(tmp_path, "#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    with trio.fail_after(10), pytest.raises(GpuError, match="NVIDIA-SMI has failed"):
        await SmiSource(command=exe).snapshot()


async def test_smi_missing_binary(tmp_path: Path) -> None:
    with trio.fail_after(10), pytest.raises(GpuError, match="not found"):
        await SmiSource(command="nvidia-smi-does-not-exist").snapshot()


def test_parse_compute_apps() -> None:
    assert parse_compute_apps("") == {}
    assert parse_compute_apps("No running processes found\n") == {}
    assert parse_compute_apps("1, 1\r\n1, 1\n") == {1: 2 << 20}
    assert parse_compute_apps("1234, [N/A]\n") is None
    assert parse_compute_apps("garbage\n") is None
    assert parse_smi_name("NVIDIA H200\r\nNVIDIA H200\n") == "NVIDIA H200"


def test_open_source_auto_uses_smi_when_nvml_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    probe = NvmlSource()
    try:
        probe.init_sync()
    except GpuError:
        pass
    else:
        pytest.skip("NVML works here")
    install_smi(tmp_path, FAKE_SMI.format(log=tmp_path / "log"))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert open_source("auto", smi_timeout=2.0).name == "smi"
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(GpuError, match="nvidia-smi is not on PATH"):
        open_source("auto")
    with pytest.raises(GpuError):
        open_source("nvml")


def test_open_source_kinds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert open_source("smi").name == "smi"
    assert open_source("fake", fake_dir=str(tmp_path)).name == "fake"
    monkeypatch.setenv("FLEET_TRIO_FAKE_GPU_DIR", str(tmp_path))
    assert open_source("fake").name == "fake"
    monkeypatch.delenv("FLEET_TRIO_FAKE_GPU_DIR")
    with pytest.raises(GpuError, match="FLEET_TRIO_FAKE_GPU_DIR"):
        open_source("fake")
    with pytest.raises(GpuError, match="unknown gpu source"):
        open_source("pdh")
    with pytest.raises(GpuError):
        open_source("smi", index=-1)


# -- NVML with an injected module ------------------------------------------------------------


async def test_nvml_source_with_injected_module() -> None:
    lib = FakeNvml()
    src = NvmlSource(nvml=lib)
    snap = await src.snapshot()
    assert (snap.total_gb, snap.used_gb, snap.free_gb) == (80.0, 3.0, 77.0)
    assert await src.device_name() == "NVIDIA H200"
    assert await src.process_used_bytes() == {10: GIB}  # compute+graphics: counted once
    lib.graphics = [SimpleNamespace(pid=11, usedGpuMemory=2 * GIB)]
    assert await src.process_used_bytes() == {10: GIB, 11: 2 * GIB}
    assert lib.inits == 1
    await src.aclose()
    assert lib.shutdowns == 1
    with pytest.raises(GpuError, match="closed"):
        await src.snapshot()


async def test_nvml_per_process_unavailable() -> None:
    lib = FakeNvml()
    src = NvmlSource(nvml=lib)
    lib.compute = [SimpleNamespace(pid=10, usedGpuMemory=None)]
    lib.graphics = FakeNVMLError(3)
    assert await src.process_used_bytes() is None
    lib.compute = FakeNVMLError(3)
    assert await src.process_used_bytes() is None
    lib.compute = FakeNVMLError(15)  # a real failure, not "unsupported"
    with pytest.raises(GpuError):
        await src.process_used_bytes()
    lib.compute = []
    assert await src.process_used_bytes() == {}


async def test_nvml_init_and_device_failures() -> None:
    lib = FakeNvml()
    lib.fail_init = True
    with pytest.raises(GpuError, match="init failed"):
        NvmlSource(nvml=lib).init_sync()
    lib = FakeNvml()
    with pytest.raises(GpuError, match="no device at index 1"):
        NvmlSource(nvml=lib, index=1).init_sync()
    assert lib.shutdowns == 1
    lib.memory = SimpleNamespace(total=0, used=0, free=0)
    with pytest.raises(GpuError):
        await NvmlSource(nvml=lib).snapshot()
