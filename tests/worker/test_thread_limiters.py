"""Every thread is bounded by a limiter of its own (docs/task-tree.md, "Threads").

A driver call that never returns is abandoned when its deadline passes, but its thread — and
the limiter token it holds — lives on. Were it trio's default limiter (40 tokens, shared by
every other ``to_thread`` call), about 40 hung passes would starve the sheet reads, the host
facts and the labels pass, which holds the registration lock. Here a hung NVML, a hung sheet
directory and a hung probe directory each exhaust only their own limiter: 100 passes later the
labels pass, the sheets and the GPU sampler still work.

The hung calls wait on an event the test sets at its end, so no thread outlives the test.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from fleet_trio.gpu.fake import FakeGpu, init_device
from fleet_trio.gpu.sampler import GlobalSampler
from fleet_trio.worker import probes, sheets
from fleet_trio.worker.config import config_from_mapping
from fleet_trio.worker.probes import Prober
from fleet_trio.worker.sheets import read_sheets
from fleet_trio.worker.worker import Worker

PASSES = 100


@pytest.fixture
def hang() -> Iterator[threading.Event]:
    """Set at the test's end: every hung call returns then, and its thread ends."""
    release = threading.Event()
    yield release
    release.set()


def _config(tmp_path: Path, *, probe_timeout: str = "20ms") -> Any:
    (tmp_path / "sheets" / "host.d").mkdir(parents=True)
    (tmp_path / "sheets" / "host.md").write_text("the host\n")
    (tmp_path / "probes").mkdir()
    return config_from_mapping(
        {
            "controller_url": "http://127.0.0.1:1",
            "token": "t",
            "sheet_dir": str(tmp_path / "sheets"),
            "probe_dir": str(tmp_path / "probes"),
            "probe_timeout": probe_timeout,
            "devices": ["gpu0"],
        },
        path="worker.yaml",
        environ={},
        hostname=lambda: "gpubox",
    )


def _hung_nvml(release: threading.Event, calls: list[int]) -> Any:
    def rows(nvml: Any = None) -> list[tuple[str, int, int, str]]:
        calls.append(1)
        release.wait()  # a driver that never answers (until the test ends)
        return []

    return rows


async def test_a_hung_driver_starves_nothing_after_100_passes(
    tmp_path: Path, hang: threading.Event, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    monkeypatch.setattr(probes, "gpu_rows_sync", _hung_nvml(hang, calls))
    cfg = _config(tmp_path)
    # nvidia-smi is looked for in an empty directory: NVML is the only GPU source
    worker = Worker(cfg, prober=Prober(cfg, path=str(tmp_path / "probes"), nvml=True))
    default = trio.to_thread.current_default_thread_limiter()
    with trio.fail_after(60):
        for _ in range(PASSES):
            async with worker._register_lock:  # what the labels pass holds
                registration = await worker.build_registration(with_proof=False)
            assert registration.sheet == "the host\n"
        # the hung driver holds its own limiter's one token, not trio's default ones
        assert default.borrowed_tokens == 0
        assert len(calls) == 1
        sheet, _ = await read_sheets(cfg)
        assert sheet == "the host\n"
        gpu = tmp_path / "gpu"
        await trio.to_thread.run_sync(init_device, str(gpu))
        sampler = GlobalSampler(FakeGpu(str(gpu)), interval=1.0)
        await sampler.sample_once()
        assert sampler.samples == 1


async def test_a_hung_sheet_dir_is_an_unreadable_sheet_and_starves_nothing(
    tmp_path: Path, hang: threading.Event, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []

    def hung_read(path: str) -> bytes:
        calls.append(1)
        hang.wait(30)  # a sheet dir on a dead network mount (30 s: the old code's way out)
        raise OSError("gone")

    monkeypatch.setattr(sheets, "read_sheet_head", hung_read)
    monkeypatch.setattr(sheets, "SHEET_TIMEOUT", 0.02)
    cfg = _config(tmp_path)
    worker = Worker(cfg, prober=Prober(cfg, path=str(tmp_path / "probes"), nvml=False))
    default = trio.to_thread.current_default_thread_limiter()
    with trio.fail_after(60):
        for _ in range(PASSES):
            async with worker._register_lock:  # what the labels pass holds
                registration = await worker.build_registration(with_proof=False)
            assert registration.sheet is None and registration.device_sheets == {}
        assert default.borrowed_tokens == 0
        assert len(calls) == 1  # one thread hangs; the next reads time out waiting for its token
