"""Usage sheets are files on the host: a FIFO, a device or a huge file in ``sheet_dir`` is an
unreadable sheet (logged, the worker goes on), never a hang, a blown memory or a shutdown
that cannot finish."""

from __future__ import annotations

import os
import pathlib

import pytest
import trio

from fleet_trio.worker.worker import MAX_SHEET, SHEET_MARKER, read_sheets
from tests.helpers import sheet_config


async def test_a_fifo_or_a_device_is_an_unreadable_sheet_at_once(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "host.d").mkdir()
    os.mkfifo(tmp_path / "host.md")  # no writer: a plain open() would block forever
    (tmp_path / "host.d" / "gpu0.md").symlink_to("/dev/zero")  # endless
    (tmp_path / "host.d" / "gpu1.md").write_text("ok\n")
    with trio.fail_after(10):
        sheet, devices = await read_sheets(sheet_config(tmp_path))
    assert sheet is None
    assert devices == {"gpu1": "ok\n", "gpu2": ""}
    assert "not a regular file" in caplog.text and "host.md" in caplog.text


async def test_a_huge_sheet_is_read_only_as_far_as_is_sent(tmp_path: pathlib.Path) -> None:
    (tmp_path / "host.md").write_bytes(b"a" * (64 << 20))  # 64 MiB, sparse reads only
    with trio.fail_after(10):
        sheet, _ = await read_sheets(sheet_config(tmp_path))
    assert sheet is not None and sheet.endswith(SHEET_MARKER)
    assert len(sheet.encode()) <= MAX_SHEET
