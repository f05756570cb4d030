"""node.md §9 — footprint store (44–55), VRAM parsing and sampler (56–60, 101, 108), gpu_arch (82).

Real files in ``tmp_path``; the sampler runs against a scripted source under ``autojump_clock``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import trio

from fleet_trio.gpu import (
    NO_SNAPSHOT,
    STALE_SNAPSHOT,
    FootprintKey,
    FootprintStore,
    GlobalDelta,
    GlobalSampler,
    GpuError,
    VramSnapshot,
    gpu_arch,
    parse_smi_memory,
)
from tests.helpers import StubGpuSource, elapse, serving

SDXL = FootprintKey("sdxl", "", "image-gen")
ACESTEP = FootprintKey("acestep", "", "audio-gen")


def _fp(tmp_path: Path) -> str:
    return str(tmp_path / "footprints.json")


async def _reopen(path: str) -> FootprintStore:
    return await FootprintStore.open(path)


def _peak(store: FootprintStore, key: FootprintKey) -> float | None:
    for e in store.entries():
        if (e.model_family, e.quant, e.task_type) == (key.family, key.quant, key.task):
            return e.vram_peak_gb
    return None


# -- footprint store ------------------------------------------------------------------------


async def test_node_044_record_applies_margin_and_keeps_max(tmp_path: Path) -> None:
    store = await FootprintStore.open(_fp(tmp_path))
    e = await store.record(SDXL, 2.0)
    assert e is not None and e.vram_peak_gb == 2.4
    e = await store.record(SDXL, 1.5)
    assert e is not None and e.vram_peak_gb == 2.4
    e = await store.record(SDXL, 3.0)
    assert e is not None and e.vram_peak_gb == 3.6
    rec = store.get(SDXL)
    assert rec is not None and rec.samples == 3 and rec.observed_peak_gb == 3.0


@pytest.mark.parametrize(
    ("observed", "want"), [(3.333, 4.0), (1.04, 1.2), (10.0, 12.0), (0.51, 0.6), (13.29, 15.9)]
)
async def test_node_045_rounding(tmp_path: Path, observed: float, want: float) -> None:
    store = await FootprintStore.open(_fp(tmp_path))
    e = await store.record(SDXL, observed)
    assert e is not None and e.vram_peak_gb == want


async def test_node_046_non_positive_observation_creates_nothing(tmp_path: Path) -> None:
    path = _fp(tmp_path)
    store = await FootprintStore.open(path)
    assert await store.record(SDXL, 0) is None
    assert await store.record(SDXL, -1.5) is None
    assert await store.record(SDXL, float("nan")) is None
    assert store.entries() == []
    assert store.get(SDXL) is None
    if os.path.exists(path):
        assert json.loads(Path(path).read_text()) == []


async def test_node_047_wire_omits_empty_quant_and_task(tmp_path: Path) -> None:
    store = await FootprintStore.open(_fp(tmp_path))
    await store.record(FootprintKey("whisper"), 1.0)
    await store.record(FootprintKey("sdxl", "bf16", "image-gen"), 2.0)
    wire = [e.to_wire() for e in store.entries()]
    assert wire == [
        {"model_family": "sdxl", "quant": "bf16", "task_type": "image-gen", "vram_peak_gb": 2.4},
        {"model_family": "whisper", "vram_peak_gb": 1.2},
    ]


async def _seeded_then_reopened(tmp_path: Path) -> tuple[str, FootprintStore]:
    """A footprint file with sdxl (6.5 then 7.0 GB) and ace-step (4.25 GB) recorded, and a
    store opened on it afresh (items 48-50)."""
    path = _fp(tmp_path)
    store = await FootprintStore.open(path)
    await store.record(SDXL, 6.5)
    await store.record(SDXL, 7.0)
    await store.record(ACESTEP, 4.25)
    return path, await _reopen(path)


async def test_node_048_reopen_restores_entries(tmp_path: Path) -> None:
    _, again = await _seeded_then_reopened(tmp_path)
    assert len(again.entries()) == 2
    assert _peak(again, SDXL) == 8.4
    assert _peak(again, ACESTEP) == 5.1


async def test_node_049_lower_observation_never_lowers_across_reopen(tmp_path: Path) -> None:
    path, again = await _seeded_then_reopened(tmp_path)
    await again.record(SDXL, 5.0)
    third = await _reopen(path)
    assert _peak(third, SDXL) == 8.4


async def test_node_050_no_temp_files_left(tmp_path: Path) -> None:
    path, again = await _seeded_then_reopened(tmp_path)
    await again.record(SDXL, 5.0)
    assert sorted(os.listdir(tmp_path)) == ["footprints.json"]
    text = Path(path).read_text()
    assert text.startswith("[\n  {") and not text.endswith("\n")


async def test_node_051_corrupt_file_opens_empty_then_recovers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _fp(tmp_path)
    Path(path).write_text("{not json")
    store = await FootprintStore.open(path)
    assert store.entries() == []
    assert len([r for r in caplog.records if "footprints" in r.getMessage()]) == 1
    await store.record(SDXL, 5.0)
    again = await _reopen(path)
    assert _peak(again, SDXL) == 6.0


async def test_node_051b_unreadable_path_opens_empty(tmp_path: Path) -> None:
    (tmp_path / "footprints.json").mkdir()  # reading a directory fails with EISDIR
    store = await FootprintStore.open(_fp(tmp_path))
    assert store.entries() == []


async def test_node_052_zero_disk_entry_never_listed(tmp_path: Path) -> None:
    path = _fp(tmp_path)
    Path(path).write_text(
        json.dumps(
            [
                {"model_family": "broken", "vram_peak_gb": 0, "observed_peak_gb": 0},
                {
                    "model_family": "sdxl",
                    "task_type": "image-gen",
                    "vram_peak_gb": 2.4,
                    "observed_peak_gb": 2,
                    "samples": 1,
                    "updated": "2026-07-17T05:31:29Z",
                },
            ]
        )
    )
    store = await FootprintStore.open(path)
    assert [e.to_wire() for e in store.entries()] == [
        {"model_family": "sdxl", "task_type": "image-gen", "vram_peak_gb": 2.4}
    ]
    assert store.families() == ["sdxl"]


def _values(writer: int) -> list[float]:
    # 20 values per writer; the largest over all writers is 8.0 (writer 7's last value).
    return [round(0.1 + (writer * 20 + i) * (7.9 / 159), 6) for i in range(20)]


async def test_node_053_concurrent_writers_one_store(tmp_path: Path) -> None:
    path = _fp(tmp_path)
    store = await FootprintStore.open(path)
    assert max(max(_values(w)) for w in range(8)) == 8.0

    async def writer(w: int) -> None:
        for v in _values(w):
            await store.record(SDXL, v)

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for w in range(8):
                nursery.start_soon(writer, w)
    assert [e.vram_peak_gb for e in store.entries()] == [9.6]
    disk = json.loads(Path(path).read_text())
    assert len(disk) == 1 and disk[0]["vram_peak_gb"] == 9.6
    assert disk[0]["samples"] == 160
    assert sorted(os.listdir(tmp_path)) == ["footprints.json"]


async def test_node_053b_concurrent_writers_separate_stores_keep_the_max(tmp_path: Path) -> None:
    """8 stores on one path (as 8 processes would be): §11 D says the reference loses records
    here; the directory lock plus merge-before-write keeps the max."""
    path = _fp(tmp_path)
    stores = [await FootprintStore.open(path) for _ in range(8)]
    other = FootprintKey("hidream-o1", "bf16", "image-gen")

    async def writer(w: int) -> None:
        for v in _values(w):
            await stores[w].record(SDXL, v)
        await stores[w].record(FootprintKey(f"fam{w}"), 1.0)

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for w in range(8):
                nursery.start_soon(writer, w)
    await stores[0].record(other, 12.5)
    disk = {d["model_family"]: d for d in json.loads(Path(path).read_text())}
    assert disk["sdxl"]["vram_peak_gb"] == 9.6
    assert all(disk[f"fam{w}"]["vram_peak_gb"] == 1.2 for w in range(8))
    assert disk["hidream-o1"]["vram_peak_gb"] == 15.0
    for s in stores:
        await s.reload_if_changed()
        assert _peak(s, SDXL) == 9.6
        assert len(s.entries()) == 10
    assert sorted(os.listdir(tmp_path)) == ["footprints.json"]


async def test_node_053c_separate_processes_keep_every_record(tmp_path: Path) -> None:
    """The cross-process case with real processes: 4 children record at once."""
    import sys

    path = _fp(tmp_path)
    code = (
        "import sys, trio\n"
        "from fleet_trio.gpu import FootprintKey, FootprintStore\n"
        "async def main():\n"
        "    s = await FootprintStore.open(sys.argv[1])\n"
        "    w = int(sys.argv[2])\n"
        "    for i in range(10):\n"
        "        await s.record(FootprintKey('sdxl'), 1.0 + w + i / 10)\n"
        "        await s.record(FootprintKey(f'p{w}'), 1.0)\n"
        "trio.run(main)\n"
    )
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for w in range(4):
                nursery.start_soon(trio.run_process, [sys.executable, "-c", code, path, str(w)])
    store = await FootprintStore.open(path)
    assert _peak(store, FootprintKey("sdxl")) == advertised_of(4.9)
    assert [_peak(store, FootprintKey(f"p{w}")) for w in range(4)] == [1.2] * 4


def advertised_of(v: float) -> float:
    from fleet_trio.gpu.footprints import advertised

    return advertised(v)


async def test_node_054_reload_merges_another_writer(tmp_path: Path) -> None:
    path = _fp(tmp_path)
    mine = await FootprintStore.open(path)
    assert await mine.reload_if_changed() is False  # nothing on disk yet
    theirs = await FootprintStore.open(path)
    key = FootprintKey("hidream-o1", "bf16", "image-gen")
    await theirs.record(key, 12.5)
    assert _peak(mine, key) is None
    assert await mine.reload_if_changed() is True
    assert _peak(mine, key) == 15.0
    assert await mine.reload_if_changed() is False  # unchanged file: one stat, no merge


async def test_node_055_reload_of_older_file_never_lowers(tmp_path: Path) -> None:
    path = _fp(tmp_path)
    key = FootprintKey("hidream-o1", "bf16", "image-gen")
    writer = await FootprintStore.open(path)
    await writer.record(key, 12.5)
    older = Path(path).read_text()
    mine = await FootprintStore.open(path)
    await mine.record(key, 14.0)
    assert _peak(mine, key) == 16.8
    Path(path).write_text(older)  # another writer puts the older copy back
    await mine.reload_if_changed()
    assert _peak(mine, key) == 16.8


async def test_node_055b_reload_skips_a_torn_file_and_retries(tmp_path: Path) -> None:
    """§11 B: the gate advances only after a successful parse."""
    path = _fp(tmp_path)
    mine = await FootprintStore.open(path)
    Path(path).write_text('[{"model_family": "sdxl", "vram_')
    assert await mine.reload_if_changed() is False
    theirs = await FootprintStore.open(path)
    await theirs.record(SDXL, 2.0)
    assert await mine.reload_if_changed() is True
    assert _peak(mine, SDXL) == 2.4


# -- VRAM parsing and the global sampler ----------------------------------------------------


# §5.1's table: what the parser returns for each input, None where it refuses the input
ITEM_056_TABLE: list[tuple[str, tuple[float, float] | None]] = [
    ("16384, 1234", (16.0, 1234 / 1024)),
    ("16384, 1234\r\n", (16.0, 1.205078125)),
    ("16384, 2048\n", (16.0, 2.0)),
    ("  16384 ,  512  ", (16.0, 0.5)),
    ("8192, 0", (8.0, 0.0)),
    ("16384, 1024\r\n8192, 512\r\n", (16.0, 1.0)),
    ("", None),
    ("16384", None),
    ("16384, 1, 2", None),
    ("N/A, 1234", None),
    ("16384, [N/A]", None),
    ("0, 0", None),
    ("16384, -5", None),
    # fleet-trio also rejects non-finite values (§5.1 observation)
    ("NaN, 1", None),
    ("16384, nan", None),
    ("inf, 1", None),
    ("16384, -Infinity", None),
    ("\n16384, 1", None),
]


@pytest.mark.parametrize(("text", "want"), ITEM_056_TABLE)
def test_node_056_smi_parser_returns_the_table(text: str, want: tuple[float, float] | None) -> None:
    if want is None:
        with pytest.raises(GpuError):
            parse_smi_memory(text)
    else:
        assert parse_smi_memory(text) == want


class ScriptedSource(StubGpuSource):
    """A source that returns canned ``nvidia-smi`` outputs (or failures) in order; the last
    script entry repeats. ``None`` in the script is a failure."""

    name = "scripted"
    product = "Scripted GPU"

    def __init__(self, *script: str | None) -> None:
        self.script = list(script)
        self.calls = 0

    async def snapshot(self) -> VramSnapshot:
        await trio.lowlevel.checkpoint()
        item = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        if item is None:
            raise GpuError("nvidia-smi: exit status 1")
        total, used = parse_smi_memory(item)
        return VramSnapshot.now(total, used)


async def test_node_057_snapshot_readable_once_started(autojump_clock: trio.abc.Clock) -> None:
    source = ScriptedSource("16384, 4096")
    sampler = GlobalSampler(source, interval=0.01)
    async with serving(sampler.serve):
        snap = sampler.snapshot()
        assert snap is not None
        assert (snap.total_gb, snap.free_gb, snap.used_gb) == (16.0, 12.0, 4.0)
        assert snap.wall_time > 0
        await elapse(0.035)
        assert source.calls >= 3
    assert sampler.samples == source.calls and sampler.failures == 0


async def test_node_058_failures_keep_the_last_snapshot(autojump_clock: trio.abc.Clock) -> None:
    source = ScriptedSource("16384, 1024", None)
    sampler = GlobalSampler(source, interval=0.01)
    async with serving(sampler.serve):
        first = sampler.snapshot()
        await elapse(0.1)
        assert sampler.snapshot() == first  # exactly, timestamp included
        assert first is not None and (first.total_gb, first.free_gb) == (16.0, 15.0)
        calls = source.calls
        await elapse(0.1)
        assert source.calls > calls  # sampling continues
        assert sampler.failures >= 2


async def test_node_059_always_failing_sampler_has_no_snapshot(
    autojump_clock: trio.abc.Clock,
) -> None:
    sampler = GlobalSampler(ScriptedSource(None), interval=0.01)
    async with serving(sampler.serve):
        await elapse(0.05)
        assert sampler.snapshot() is None
        assert sampler.status(trio.current_time()) == (None, NO_SNAPSHOT)


async def test_node_060_at_most_one_more_sample_after_stop(
    autojump_clock: trio.abc.Clock,
) -> None:
    source = ScriptedSource("16384, 1024")
    sampler = GlobalSampler(source, interval=0.01)
    async with serving(sampler.serve):
        await elapse(0.05)
    stopped_at = source.calls
    await elapse(0.1)
    assert source.calls <= stopped_at + 1


async def test_node_023_024_108_staleness(autojump_clock: trio.abc.Clock) -> None:
    """The sampler side of 23, 24 and 108: 60 s stale, 5 s fresh, exactly 30 s fresh."""
    source = ScriptedSource("16384, 1024", None)
    sampler = GlobalSampler(source, interval=2.0)
    async with serving(sampler.serve):
        snap = sampler.snapshot()
        assert snap is not None
        t0 = snap.taken_at
        assert sampler.status(t0 + 5) == (snap, None)
        assert sampler.status(t0 + 30) == (snap, None)
        assert sampler.status(t0 + 30.000001) == (None, STALE_SNAPSHOT)
        await trio.sleep(60)
        assert sampler.status(trio.current_time()) == (None, STALE_SNAPSHOT)


async def test_node_101_global_delta_sampler() -> None:
    delta = GlobalDelta(ScriptedSource("16384, 1024", "16384, 5120", "16384, 512"))
    assert await delta.sample() == 0.0
    assert await delta.sample() == 4.0
    assert await delta.sample() == 0.0


async def test_node_101b_global_delta_baseline_waits_for_a_success() -> None:
    delta = GlobalDelta(ScriptedSource(None, "16384, 2048", "16384, 3072"))
    with pytest.raises(GpuError):
        await delta.sample()
    assert await delta.sample() == 0.0
    assert await delta.sample() == 1.0


# -- identity -------------------------------------------------------------------------------


ITEM_082_VECTORS = [
    ("RTX 5090", "blackwell"),
    ("RTX 5060 Ti", "blackwell"),
    ("RTX PRO 5000 Blackwell", "blackwell"),
    ("RTX PRO 6000", "blackwell"),
    ("RTX 4000 Blackwell", "blackwell"),
    ("RTX 4090", "ada"),
    ("RTX 4060 Laptop", "ada"),
    ("RTX 3070 Laptop", "ampere"),
    ("RTX 3090 Ti", "ampere"),
    ("nvidia geforce rtx 3070", "ampere"),
    ("RTX 2080 Ti", "turing"),
    ("GTX 1660 SUPER", "turing"),
    ("Tesla V100-SXM2-16GB", "volta"),
    ("TITAN X (Pascal)", "nvidia"),
    ("", "nvidia"),
]
# beyond item 82's vectors: the data-centre names, classified by the extended rules
DATA_CENTRE_NAMES = [
    ("NVIDIA H200", "hopper"),
    ("NVIDIA H100 80GB HBM3", "hopper"),
    ("NVIDIA GH200 480GB", "hopper"),
    ("NVIDIA A100-SXM4-80GB", "ampere"),
    ("NVIDIA A10G", "ampere"),
    ("NVIDIA RTX A6000", "ampere"),
    ("NVIDIA B200", "blackwell"),
    ("NVIDIA GB200", "blackwell"),
    ("NVIDIA L4", "ada"),
    ("NVIDIA L40S", "ada"),
    ("NVIDIA RTX 6000 Ada Generation", "ada"),
    ("Tesla T4", "turing"),
    ("Quadro RTX 8000", "turing"),
    ("NVIDIA TITAN V", "volta"),
    ("Tesla P100-PCIE-16GB", "nvidia"),
]


@pytest.mark.parametrize(("name", "arch"), ITEM_082_VECTORS + DATA_CENTRE_NAMES)
def test_node_082_gpu_arch_vectors(name: str, arch: str) -> None:
    assert gpu_arch(name) == arch


@pytest.mark.skipif(not os.environ.get("FLEET_TRIO_LIVE_NVML"), reason="set FLEET_TRIO_LIVE_NVML=1")
async def test_node_062_live_nvml_smoke() -> None:
    """Item 62's NVML equivalent (the design note; the PDH original is Windows-only), opt-in on
    a machine with a GPU: every device NVML enumerates reads a total > 0 and a used value
    within it, has a name, and the per-process query (the tree sum's source) answers without
    an error, with no negative holding."""
    from fleet_trio.gpu.nvml import open_nvml_devices

    found = await trio.to_thread.run_sync(open_nvml_devices)
    assert found.devices
    for device in found.devices:
        snap = await device.source.snapshot()
        assert snap.total_gb > 0 and 0 <= snap.used_gb <= snap.total_gb, device
        assert device.name and device.uuid.startswith(("GPU-", "MIG-"))
        used = await device.source.process_used_bytes()
        assert used is None or all(v >= 0 for v in used.values())
