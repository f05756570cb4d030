"""Multi-GPU: every device enumerated (NVML, nvidia-smi's 5-field query, the fake), selection
by index or UUID, and the per-device health sampler (headline, staleness, ``gpu_devices``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio

from fleet_trio.gpu import GIB, GpuError, fake
from fleet_trio.gpu.devices import DeviceSampler
from fleet_trio.gpu.nvml import open_nvml_devices
from fleet_trio.gpu.sampler import NO_SNAPSHOT, STALE_SNAPSHOT
from fleet_trio.gpu.smi import DEVICES_QUERY, open_smi_devices, parse_smi_devices
from fleet_trio.gpu.source import GpuDevice, VramSnapshot, open_devices, select_devices
from tests.gpu.fakes import FakeNvml, FakeNVMLError, install_smi
from tests.helpers import StubGpuSource, elapse, serving

# -- nvidia-smi: the 5-field per-device query -------------------------------------------------


def test_parse_smi_devices() -> None:
    text = (
        "0, GPU-aaa, NVIDIA H200, 143771, 1024\r\n"
        "1, GPU-bbb, NVIDIA H100 80GB HBM3, 81559, [N/A]\n"
        "2, GPU-ccc, Odd, Name, 0, 0\n"
    )
    rows = parse_smi_devices(text)
    assert [(r.index, r.uuid) for r in rows] == [(0, "GPU-aaa"), (1, "GPU-bbb"), (2, "GPU-ccc")]
    assert rows[0].name == "NVIDIA H200" and rows[0].memory == (143771 / 1024, 1.0)
    assert isinstance(rows[1].memory, GpuError)  # that device alone failed
    assert rows[2].name == "Odd, Name" and isinstance(rows[2].memory, GpuError)  # total 0


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\n",
        "0, GPU-a, X, 1",
        "x, GPU-a, X, 1, 1",
        "0, [N/A], X, 1, 1",
        "-1, G, X, 1, 1",
        "0, GPU-a, X, 1, 1\n0, GPU-b, X, 1, 1",
        "0, GPU-a, X, 1, 1\n1, GPU-a, X, 1, 1",
    ],
)
def test_parse_smi_devices_rejects(text: str) -> None:
    with pytest.raises(GpuError):
        parse_smi_devices(text)


SMI_TWO = r"""#!/bin/sh
echo "$*" >> "{log}"
case "$*" in
  *index,uuid*) printf '0, GPU-aaa, NVIDIA H200, 16384, 4096\n'
                printf '1, GPU-bbb, NVIDIA H200, 8192, [N/A]\n' ;;
  *compute-apps*) printf '1234, 2048\n' ;;
esac
"""


async def test_smi_devices_share_one_query(tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    exe = install_smi(tmp_path, SMI_TWO.format(log=log))
    with trio.fail_after(20):
        found = await open_smi_devices(command=exe)
        assert [(d.index, d.uuid, d.name) for d in found.devices] == [
            (0, "GPU-aaa", "NVIDIA H200"),
            (1, "GPU-bbb", "NVIDIA H200"),
        ]
        sampler = DeviceSampler(found.devices)
        await sampler.sample_once()
        snap0, _ = sampler.samplers[0].status(trio.current_time())
        assert snap0 is not None and (snap0.total_gb, snap0.used_gb) == (16.0, 4.0)
        assert sampler.samplers[1].snapshot() is None  # [N/A]: device 1 failed on its own
        assert sampler.samplers[1].failures == 1
        # per-process on one device goes through --id
        assert await found.devices[1].source.process_used_bytes() == {1234: 2 * GIB}
    calls = log.read_text().splitlines()
    assert calls[0] == " ".join(DEVICES_QUERY)
    assert calls[1] == " ".join(DEVICES_QUERY)  # one run for both devices' samples
    assert calls[2].endswith("--id=1")
    assert len(calls) == 3


# -- NVML ---------------------------------------------------------------------------------------


class MultiNvml(FakeNvml):
    def __init__(self, count: int, lost: int | None = None) -> None:
        super().__init__()
        self.count = count
        self.lost = lost

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> object:
        if index >= self.count or index == self.lost:
            raise FakeNVMLError(2)
        return ("handle", index)

    def nvmlDeviceGetUUID(self, handle: Any) -> bytes:
        return f"GPU-{handle[1]}".encode()

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        total = (80 + 10 * handle[1]) * GIB
        return SimpleNamespace(total=total, used=GIB, free=total - GIB)


async def test_nvml_enumerates_every_device() -> None:
    lib = MultiNvml(3, lost=1)
    found = await trio.to_thread.run_sync(open_nvml_devices, lib)
    assert [(d.index, d.uuid) for d in found.devices] == [(0, "GPU-0"), (2, "GPU-2")]
    snap = await found.devices[1].source.snapshot()
    assert snap.total_gb == 100.0  # device 2's own memory
    assert found.devices[0].source.limiter is not found.devices[1].source.limiter
    with pytest.raises(GpuError, match="no usable device"):
        await trio.to_thread.run_sync(open_nvml_devices, MultiNvml(0))


# -- the fake -----------------------------------------------------------------------------------


def test_fake_devices_single_and_multi(tmp_path: Path) -> None:
    (tmp_path / "one").mkdir()
    one = fake.open_fake_devices(str(tmp_path / "one"), 1)  # the directory is the device
    assert len(one) == 1
    assert one.devices[0].uuid == fake.fake_uuid(str(tmp_path / "one"))
    root = str(tmp_path / "multi")
    three = fake.open_fake_devices(root, 3)
    assert [d.index for d in three.devices] == [0, 1, 2]
    assert len({d.uuid for d in three.devices}) == 3
    assert fake.open_fake_devices(root, 3).devices == three.devices  # stable UUIDs
    with pytest.raises(GpuError, match="--fake-gpus"):
        fake.open_fake_devices(root, 0)


def test_fake_helper_holds_on_the_pinned_device(tmp_path: Path) -> None:
    root = str(tmp_path / "multi")
    devices = fake.open_fake_devices(root, 2).devices
    assert fake.resolve_device_dir(root, devices[1].uuid) == os.path.join(root, "gpu1")
    assert fake.resolve_device_dir(root, "1") == os.path.join(root, "gpu1")
    assert fake.resolve_device_dir(root, None) == os.path.join(root, "gpu0")
    with pytest.raises(GpuError):
        fake.resolve_device_dir(root, "GPU-nope")
    single = str(tmp_path / "single")
    fake.init_device(single)
    assert fake.resolve_device_dir(single, devices[1].uuid) == single
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": devices[1].uuid}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "fleet_trio.gpu.fake",
            "alloc",
            "1G",
            "--pid",
            str(os.getpid()),
            "--dir",
            root,
        ],
        env=env,
        check=True,
        timeout=30,
    )
    assert fake.read_holdings(os.path.join(root, "gpu1")) == {os.getpid(): GIB}
    assert fake.read_holdings(os.path.join(root, "gpu0")) == {}


async def test_open_devices_fake(tmp_path: Path) -> None:
    found = await open_devices("fake", fake_dir=str(tmp_path), fake_gpus=2)
    assert found.kind == "fake" and len(found) == 2
    assert len({d.uuid for d in found.devices}) == 2


def test_select_devices() -> None:
    devs = tuple(GpuDevice(i, f"GPU-{i}", "x", source=None) for i in range(3))  # type: ignore[arg-type]
    assert select_devices(devs, ()) == devs
    assert select_devices(devs, ("GPU-2", 0)) == (devs[0], devs[2])
    assert select_devices(devs, (1, "GPU-1")) == (devs[1],)
    with pytest.raises(GpuError, match="no device 7"):
        select_devices(devs, (7,))
    with pytest.raises(GpuError, match="no device 'GPU-x'"):
        select_devices(devs, ("GPU-x",))


# -- the device sampler (autojump clock) -------------------------------------------------------


class Scripted(StubGpuSource):
    name = "fake"
    product = "X"

    def __init__(self, total: float, used: float) -> None:
        self.total, self.used = total, used
        self.fail = False

    async def snapshot(self) -> VramSnapshot:
        await trio.lowlevel.checkpoint()
        if self.fail:
            raise GpuError("scripted")
        return VramSnapshot.now(self.total, self.used)


def _devices(*specs: tuple[float, float]) -> tuple[tuple[GpuDevice, ...], list[Scripted]]:
    sources = [Scripted(t, u) for t, u in specs]
    return tuple(GpuDevice(i, f"GPU-{i}", "X", s) for i, s in enumerate(sources)), sources


async def test_headline_largest_then_most_free(autojump_clock: Any) -> None:
    devices, sources = _devices((40, 0), (80, 30), (80, 10))
    sampler = DeviceSampler(devices, interval=1, max_age=5)
    async with serving(sampler.serve):
        now = trio.current_time()
        dev, snap, _ = sampler.headline(now)
        assert dev is devices[2] and snap is not None and snap.free_gb == 70  # tie: more free
        sources[2].fail = True  # device 2 goes stale on its own
        await trio.sleep(6.5)
        now = trio.current_time()
        dev, snap, _ = sampler.headline(now)
        assert dev is devices[1]
        rows = sampler.gpu_devices(now)
        assert rows is not None and [r["index"] for r in rows] == [0, 1]
        for s in sources:
            s.fail = True
        await elapse(6)
        assert sampler.status(trio.current_time()) == (None, STALE_SNAPSHOT)


async def test_primary_uuid_and_single_device(autojump_clock: Any) -> None:
    devices, _sources = _devices((40, 0), (80, 0))
    with pytest.raises(GpuError, match="primary_gpu_uuid"):
        DeviceSampler(devices, primary_uuid="GPU-9")
    sampler = DeviceSampler(devices, interval=1, max_age=5, primary_uuid="GPU-0")
    seen: list[tuple[str, bool]] = []
    sampler.listeners.append(lambda d, s: seen.append((d.uuid, s is not None)))
    await sampler.sample_once()
    snap, _ = sampler.status(trio.current_time())
    assert snap is not None and snap.total_gb == 40
    assert seen == [("GPU-0", True), ("GPU-1", True)]
    assert sampler.snapshot() is not None and sampler.snapshot().total_gb == 40  # type: ignore[union-attr]
    assert (sampler.samples, sampler.failures) == (2, 0)  # /metrics reads these
    single = DeviceSampler(devices[:1])
    assert single.gpu_devices(trio.current_time()) is None  # absent for a single device
    assert single.status(trio.current_time()) == (None, NO_SNAPSHOT)
    assert single.snapshot() is None and single.samples == 0


def test_fake_devices_refuse_bad_or_duplicate_uuids(tmp_path: Path) -> None:
    root = str(tmp_path / "multi")
    fake.open_fake_devices(root, 2)
    fake.init_device(os.path.join(root, "gpu1"), uuid="GPU-a\nCUDA=0")
    with pytest.raises(GpuError, match="not a device id"):
        fake.open_fake_devices(root, 2)
    fake.init_device(os.path.join(root, "gpu0"), uuid="GPU-same")
    fake.init_device(os.path.join(root, "gpu1"), uuid="GPU-same")
    with pytest.raises(GpuError, match="share a uuid"):
        fake.open_fake_devices(root, 2)
