"""The footprint file is outside input (issue 14, items 4 and 6): a corrupt, hostile or odd file
is a warning and an empty store at start, the last good table while running; never a crash, a
traceback, a hang or unbounded memory."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet_trio.gpu import FootprintKey, FootprintStore
from fleet_trio.gpu.fake import init_device
from fleet_trio.gpu.footprints import MAX_FILE_BYTES, FootprintFileError, parse_records
from fleet_trio.sim.fleet import free_port
from tests.helpers import answer, fleet_trio_process, json_values, wait_until

GOOD = '[{"model_family": "sdxl", "vram_peak_gb": 2.4, "observed_peak_gb": 2, "samples": 1}]'

HOSTILE = {
    "samples 1e400": '[{"model_family": "sdxl", "vram_peak_gb": 2.4, "samples": 1e400}]',
    "peak 1e400": '[{"model_family": "sdxl", "vram_peak_gb": 1e400}]',
    "peak -1e400": '[{"model_family": "sdxl", "vram_peak_gb": -1e400}]',
    "NaN": '[{"model_family": "sdxl", "vram_peak_gb": NaN}]',
    "Infinity": '[{"model_family": "sdxl", "vram_peak_gb": Infinity}]',
    "negative": '[{"model_family": "sdxl", "vram_peak_gb": -2}]',
    "huge peak": '[{"model_family": "sdxl", "vram_peak_gb": 1e300}]',
    "400-digit int": '[{"model_family": "sdxl", "vram_peak_gb": ' + "9" * 400 + "}]",
    "5000-digit int": '[{"model_family": "sdxl", "samples": ' + "9" * 5000 + "}]",
    "samples over int64": '[{"model_family": "sdxl", "samples": 9223372036854775808}]',
    "5000 deep": "[" * 5000 + "]" * 5000,
    "deep member": '[{"model_family": "sdxl", "x": ' + "[" * 3000 + "]" * 3000 + "}]",
    "lone surrogate": '[{"model_family": "\\ud800", "vram_peak_gb": 1}]',
    "control char": '[{"model_family": "a\\u001b[2Jb", "vram_peak_gb": 1}]',
    "newline": '[{"model_family": "a\\nb", "vram_peak_gb": 1}]',
    "long family": '[{"model_family": "' + "a" * 300 + '", "vram_peak_gb": 1}]',
    "wrong type": '[{"model_family": 3}]',
    "object": '{"model_family": "sdxl"}',
    "not utf-8": b'[{"model_family": "\xff"}]',
    "bad time": '[{"model_family": "sdxl", "updated": "99999-01-01T00:00:00Z"}]',
}


def no_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    assert all(r.exc_info is None for r in caplog.records)


@pytest.mark.parametrize("text", HOSTILE.values(), ids=HOSTILE.keys())
async def test_a_hostile_file_starts_empty_with_one_warning(
    tmp_path: Path, text: str | bytes, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "fp.json"
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    with pytest.raises(FootprintFileError):
        parse_records(path.read_bytes())
    caplog.set_level(logging.WARNING)
    store = await FootprintStore.open(str(path))
    assert store.entries() == []
    warnings = [r for r in caplog.records if "starting empty" in r.getMessage()]
    assert len(warnings) == 1
    assert "\n" not in warnings[0].getMessage() and "\x1b" not in warnings[0].getMessage()
    no_tracebacks(caplog)
    # it records again over the corrupt file (a fresh, valid table)
    assert await store.record(FootprintKey("sdxl"), 1.0) is not None
    assert [r.key.family for r in parse_records(path.read_bytes())] == ["sdxl"]


async def test_dev_zero_is_refused_without_reading(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    with trio.fail_after(5):
        store = await FootprintStore.open("/dev/zero")
    assert store.entries() == []
    assert any("not a regular file" in r.getMessage() for r in caplog.records)
    # recording never writes over a device
    assert await store.record(FootprintKey("sdxl"), 1.0) is not None
    assert store.entries()[0].model_family == "sdxl"
    no_tracebacks(caplog)


async def test_a_fifo_does_not_hang_startup(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fifo = tmp_path / "fp.json"
    os.mkfifo(fifo)
    caplog.set_level(logging.WARNING)
    with trio.fail_after(5):
        store = await FootprintStore.open(str(fifo))
        assert store.entries() == []
        await store.record(FootprintKey("sdxl"), 1.0)
        assert await store.reload_if_changed() is False
    assert fifo.is_fifo()  # not replaced
    assert any("not a regular file" in r.getMessage() for r in caplog.records)
    no_tracebacks(caplog)


async def test_a_directory_is_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    store = await FootprintStore.open(str(tmp_path))
    assert store.entries() == []
    no_tracebacks(caplog)


async def test_an_oversized_file_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "fp.json"
    path.write_bytes(b"[" + b" " * MAX_FILE_BYTES + b"]")
    caplog.set_level(logging.WARNING)
    store = await FootprintStore.open(str(path))
    assert store.entries() == []
    assert any(f"larger than {MAX_FILE_BYTES}" in r.getMessage() for r in caplog.records)


async def test_corruption_while_running_keeps_the_last_good_table(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "fp.json"
    path.write_text(GOOD)
    store = await FootprintStore.open(str(path))
    assert [e.model_family for e in store.entries()] == ["sdxl"]
    caplog.set_level(logging.WARNING)
    for i, text in enumerate(HOSTILE.values()):
        tmp = tmp_path / f"t{i}"
        tmp.write_bytes(text.encode() if isinstance(text, str) else text)
        os.replace(tmp, path)  # a new inode: the store sees a change
        for _ in range(3):  # as health would, on every request
            assert await store.reload_if_changed() is False
            assert [e.model_family for e in store.entries()] == ["sdxl"]
    warnings = [r for r in caplog.records if "keeping the last good table" in r.getMessage()]
    assert len(warnings) == len(HOSTILE)  # one per version of the file, not one per call
    no_tracebacks(caplog)
    # a good file again is merged in
    path.write_text(GOOD.replace("sdxl", "flux"))
    assert await store.reload_if_changed() is True
    assert {e.model_family for e in store.entries()} == {"sdxl", "flux"}


# --- fuzz -------------------------------------------------------------------------------------

_values = json_values(digits=30, text=20, items=4, keys=8, leaves=20)
_members = st.fixed_dictionaries(
    {},
    optional={
        "model_family": _values,
        "quant": _values,
        "task_type": _values,
        "vram_peak_gb": _values,
        "observed_peak_gb": _values,
        "samples": _values,
        "updated": _values | st.just("2025-01-01T00:00:00Z"),
    },
)
_tokens = st.sampled_from(
    [
        "1e400",
        "-1e400",
        "NaN",
        "Infinity",
        "[" * 200,
        "{" * 200,
        '"\\ud800"',
        '"\\u0000"',
        "9" * 5000,
    ]
)


def _document(data: object) -> str:
    return json.dumps(data, ensure_ascii=False)


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_members, max_size=5) | _values)
def test_fuzz_parse_records_shapes(data: object) -> None:
    try:
        records = parse_records(_document(data))
    except FootprintFileError as exc:
        assert str(exc)
        return
    for rec in records:
        assert 0 <= rec.vram_peak_gb <= 1e6 and 0 <= rec.samples < 2**63
        assert rec.key.family.isprintable() and len(rec.key.family) <= 256


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40), _tokens, st.integers(min_value=0, max_value=40))
def test_fuzz_parse_records_hostile_text(prefix: str, token: str, cut: int) -> None:
    text = GOOD[:cut] + token + prefix
    try:
        parse_records(text)
        parse_records(text.encode("utf-8", errors="surrogatepass"))
    except FootprintFileError:
        pass


# --- a real node process ----------------------------------------------------------------------


async def _health_of_node_with(tmp_path: Path, footprints: Path, then: Callable[[], None]) -> str:
    """Start ``fleet-trio node`` on the fake GPU with ``--footprints``; health must answer 200
    before and after ``then()`` (which corrupts the file while it runs). Returns stderr."""
    gpu_dir = tmp_path / "gpu"
    init_device(str(gpu_dir))
    port = free_port()
    argv = ["node", "--gpu", "fake", "--fake-gpu-dir", str(gpu_dir)]
    argv += ["--listen", f"127.0.0.1:{port}", "--footprints", str(footprints)]
    err = tmp_path / "stderr.txt"
    with trio.fail_after(30), err.open("wb") as errfile:
        async with (
            fleet_trio_process(argv, stderr=errfile) as proc,
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client,
        ):

            async def up() -> httpx.Response | None:
                assert proc.returncode is None, err.read_text()
                return await answer(client, "/fleet/health")

            r = await wait_until(up, what="the node's health answering")
            assert r.status_code == 200 and r.json()["model_footprints"] == []
            then()
            for _ in range(3):
                r = await client.get("/fleet/health")
                assert r.status_code == 200
    return err.read_text()


async def test_a_node_starts_and_answers_health_with_a_hostile_file(tmp_path: Path) -> None:
    path = tmp_path / "fp.json"
    path.write_text(HOSTILE["samples 1e400"])

    def corrupt() -> None:
        tmp = tmp_path / "new"
        tmp.write_text(HOSTILE["5000 deep"])
        os.replace(tmp, path)

    stderr = await _health_of_node_with(tmp_path, path, corrupt)
    assert "Traceback" not in stderr
    assert stderr.count("starting empty") == 1
    assert stderr.count("keeping the last good table") == 1


async def test_a_node_starts_with_a_fifo_as_its_footprints(tmp_path: Path) -> None:
    fifo = tmp_path / "fp.json"
    os.mkfifo(fifo)
    stderr = await _health_of_node_with(tmp_path, fifo, lambda: None)
    assert "Traceback" not in stderr and "not a regular file" in stderr
