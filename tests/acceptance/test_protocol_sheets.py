"""worker-protocol.md §15: usage sheets (137–139) and the log path of a plain job (118, 123)."""

from __future__ import annotations

import os
import pathlib

import pytest
import trio

from fleet_trio.worker.worker import MAX_SHEET, SHEET_MARKER, read_sheets, truncate_sheet
from tests.helpers import dev, running, sheet_config, succeeded


def write_sheets(root: pathlib.Path, host: str, **devices: str) -> None:
    """``root/host.md`` holding ``host``, and ``root/host.d/<device>.md`` for each device."""
    (root / "host.d").mkdir()
    (root / "host.md").write_text(host)
    for name, text in devices.items():
        (root / "host.d" / f"{name}.md").write_text(text)


async def test_protocol_137_sheets_read_verbatim_and_missing_is_empty(
    tmp_path: pathlib.Path,
) -> None:
    write_sheets(tmp_path, "# gpubox\n  two  spaces, kept\n", gpu0="gpu0: the fast one\n")
    sheet, devices = await read_sheets(sheet_config(tmp_path))
    assert sheet == "# gpubox\n  two  spaces, kept\n"
    assert devices == {"gpu0": "gpu0: the fast one\n", "gpu1": "", "gpu2": ""}

    nothing, empty = await read_sheets(sheet_config(tmp_path / "missing"))
    assert nothing == ""
    assert empty == {"gpu0": "", "gpu1": "", "gpu2": ""}


def test_protocol_138_oversized_sheet_is_cut_on_a_character_boundary() -> None:
    exact = b"a" * MAX_SHEET
    assert truncate_sheet(exact) == exact.decode()
    for prefix in (b"", b"x", b"xx"):  # shift where the 3-byte characters fall
        data = prefix + "é€".encode() * 20000
        text = truncate_sheet(data)
        encoded = text.encode("utf-8")  # valid UTF-8, or this raises
        assert len(encoded) <= MAX_SHEET
        assert text.endswith(SHEET_MARKER)
        body = text[: -len(SHEET_MARKER)]
        assert data.decode("utf-8", errors="replace").startswith(body)
        assert len(body.encode()) > MAX_SHEET - len(SHEET_MARKER) - 4
    invalid = b"\xff" * (MAX_SHEET - 10)  # each invalid byte is sent as a 3-byte U+FFFD
    assert len(truncate_sheet(invalid).encode("utf-8")) <= MAX_SHEET


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a mode-000 file")
async def test_protocol_139_unreadable_sheets_are_omitted_not_empty(
    tmp_path: pathlib.Path,
) -> None:
    write_sheets(tmp_path, "host", gpu1="one")
    os.chmod(tmp_path / "host.md", 0)
    os.chmod(tmp_path / "host.d" / "gpu1.md", 0)
    sheet, devices = await read_sheets(sheet_config(tmp_path))
    assert sheet is None
    assert "gpu1" not in devices
    assert devices["gpu0"] == ""


async def test_protocol_139_a_directory_in_the_way_is_unreadable_even_for_root(
    tmp_path: pathlib.Path,
) -> None:
    (tmp_path / "host.d" / "gpu1.md").mkdir(parents=True)
    (tmp_path / "host.md").mkdir()
    sheet, devices = await read_sheets(sheet_config(tmp_path))
    assert sheet is None  # unknown: the registration omits `sheet`, it does not send ""
    assert "gpu1" not in devices
    assert devices == {"gpu0": "", "gpu2": ""}


async def test_protocol_118_final_log_flush_precedes_the_terminal_report() -> None:
    script = "i=0; while [ $i -lt 200 ]; do echo line-$i; i=$((i+1)); done; printf tail"
    with trio.fail_after(30):
        async with running() as (ctrl, _worker):
            job = await succeeded(ctrl, dev("gpu0"), ["sh", "-c", script])
            expected = "".join(f"line-{i}\n" for i in range(200)).encode() + b"tail"
            assert ctrl.logs(job) == expected
            logs = [r.seq for r in ctrl.requests("logs") if f"/jobs/{job}/" in r.path]
            terminal = [
                r.seq
                for r in ctrl.requests("status")
                if f"/jobs/{job}/" in r.path and b'"succeeded"' in r.body
            ]
            assert logs and terminal
            assert max(logs) < min(terminal)


async def test_protocol_123_plain_job_uses_the_log_endpoint_and_no_relay() -> None:
    with trio.fail_after(30):
        async with running() as (ctrl, _worker):
            job = await succeeded(ctrl, dev("gpu0"), ["sh", "-c", "echo to-the-log"])
            assert ctrl.logs(job) == b"to-the-log\n"
            endpoints = {r.endpoint for r in ctrl.requests()}
            assert endpoints <= {"register", "labels", "heartbeat", "assignments", "status", "logs"}
            assert not [r for r in ctrl.requests() if "relay" in r.path or "stream" in r.path]
