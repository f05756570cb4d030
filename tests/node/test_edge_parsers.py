"""The parsers at the web edge with hostile input (docs/security.md): dispatch bodies, the tail's
query, tail frames, and log lines carrying text from outside. Each case was a 500, a 1011, a
traceback or a forged log line before."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path
from typing import Any

import pytest
import trio
from trio_websocket import ConnectionClosed, open_websocket_url

from fleet_trio.errors import WireError
from fleet_trio.logbus.tail import (
    CLOSE_BAD_REQUEST,
    MAX_OFFSET,
    TailProtocolError,
    loads,
    parse_query,
    parse_start,
)
from fleet_trio.logbus.tail_client import tail_url
from fleet_trio.logs import StderrHandler, setup_logging, teardown_logging
from fleet_trio.node.wire import MAX_DEPTH, error_body, parse_dispatch
from tests.node.harness import echo_task, node_config, running_node


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def envelope(payload: bytes) -> bytes:
    return b'{"job_id":"p1","task_type":"echo","payload":' + payload + b"}"


def no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    for record in caplog.records:
        assert record.exc_info is None and record.levelno < logging.ERROR, record.getMessage()


# -- dispatch bodies -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        (envelope(nested(1000)), f"nested deeper than {MAX_DEPTH} levels"),
        (envelope(nested(MAX_DEPTH)), f"nested deeper than {MAX_DEPTH} levels"),
        (nested(100_000), f"nested deeper than {MAX_DEPTH} levels"),
        (b'{"job_id":' + nested(5000) + b"}", f"nested deeper than {MAX_DEPTH} levels"),
        (envelope(b"1e400"), "number out of range: 1e400"),
        (envelope(b'{"n":[-1e999]}'), "number out of range: -1e999"),
        (envelope(b"NaN"), "invalid character 'N'"),
        (envelope(b"-Infinity"), "invalid character"),
        (envelope(b"1" * 5000), "number out of range: an integer with too many digits"),
        (b"1e400", "number out of range"),
    ],
)
def test_dispatch_decoding_limits(body: bytes, detail: str) -> None:
    with pytest.raises(WireError) as info:
        parse_dispatch(body)
    assert info.value.status == 400
    assert str(info.value).startswith("malformed dispatch body: ")
    assert detail in str(info.value)


def test_dispatch_depth_limit_is_inclusive() -> None:
    ok = parse_dispatch(envelope(nested(MAX_DEPTH - 1)))  # + the envelope: MAX_DEPTH levels
    assert ok.payload_raw == nested(MAX_DEPTH - 1).decode()
    # brackets inside strings do not count
    deep_text = json.dumps("[" * 10_000).encode()
    assert parse_dispatch(envelope(deep_text)).payload_raw == deep_text.decode()


def test_error_body_with_a_lone_surrogate_is_valid_json() -> None:
    with pytest.raises(WireError) as info:
        parse_dispatch(b'{"job_id":"a","\\ud800x":1}')
    body = error_body(str(info.value))
    assert json.loads(body) == {"status": "error", "error": str(info.value)}
    body.decode("utf-8")  # strict UTF-8 on the wire


def echo_config(tmp_path: Path) -> Any:
    return node_config(tmp_path, {"echo": echo_task(tmp_path)})


async def test_hostile_bodies_on_a_running_node(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with running_node(tmp_path, echo_config(tmp_path)) as h:
        bodies = [
            envelope(nested(1000)),  # the 2 KB body of the issue
            envelope(b"1e400"),
            b'{"job_id":"p1","\\ud800":1}',
            b'{"job_id":"p1","task_type":"\\udfff"}',
            b'{"job_id":"\\u0000","task_type":"echo"}',
            b'{"job_id":"p1","task_type":"echo","payload":{"\\ud800":"\\udc00"}}',
        ]
        for body in bodies:
            r = await h.client.post("/fleet/dispatch", content=body)
            assert r.status_code == 400, (body[:60], r.text)
            assert r.json()["status"] == "error"
            assert h.node.store.get("p1") is None and h.node.store.queue_depth == 0
        r = await h.dispatch("p1", "echo", {"ok": True})
        assert r.status_code == 202
        await h.wait_terminal("p1")
    no_traceback(caplog)


# -- the tail's query and frames -----------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ["²", "١٢", "-1", "+1", "1e3", "0x10", "9" * 20, "9" * 5000, str(MAX_OFFSET + 1), "\ud800"],
)
def test_tail_from_is_ascii_digits_in_range(text: str) -> None:
    with pytest.raises(TailProtocolError, match="from must be"):
        parse_start(text)


def test_tail_query_values() -> None:
    assert parse_start(str(MAX_OFFSET)) == MAX_OFFSET
    assert parse_start(" Now ") == "now"
    with pytest.raises(TailProtocolError) as info:
        parse_query({"streams": "stdout,\x1b[2J" + "x" * 10_000})
    message = str(info.value)
    assert "\x1b" not in message and len(message) < 200


@pytest.mark.parametrize(
    "frame",
    [
        "[" * 5000,
        '{"type":"output","stream":"stdout","offset":0,"t":1e400,"data":"x"}',
        '{"type":"output","stream":"stdout","offset":0,"t":NaN,"data":"x"}',
        '{"type":"skipped","offset":' + "1" * 5000 + ',"bytes":1}',
        b"\xff\xfe",
        '{"type":"' + "x" * 100_000 + '"}',
    ],
)
def test_tail_frames_fail_cleanly(frame: str | bytes) -> None:
    with pytest.raises(TailProtocolError) as info:
        loads(frame)
    assert len(str(info.value)) < 300


async def test_hostile_tail_queries_on_a_running_node(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with running_node(tmp_path, echo_config(tmp_path)) as h:
        assert (await h.dispatch("t1", "echo", {})).status_code == 202
        await h.wait_terminal("t1")
        for params in ({"from": "²"}, {"from": "9" * 5000}, {"streams": "\u202e" * 100}):
            url = tail_url(h.node.url, "t1", params)
            with trio.fail_after(10):
                async with open_websocket_url(url) as ws:
                    frames = []
                    try:
                        while True:
                            frames.append(json.loads(await ws.get_message()))
                    except ConnectionClosed as exc:
                        assert exc.reason is not None and exc.reason.code == CLOSE_BAD_REQUEST
            assert [f["type"] for f in frames] == ["error"], frames
    no_traceback(caplog)


# -- log lines -----------------------------------------------------------------------------------


FORGED = "j1\n2026-01-01T00:00:00.000Z ERROR   fleet_trio: forged\r\x1b[2J\x85\u202e\ud800"


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_log_lines_escape_text_from_outside(fmt: str) -> None:
    buf = io.StringIO()
    try:
        setup_logging("INFO", fmt, stream=buf, environ={})
        # An unmanaged logger with only the handler under test: the raw text must not reach
        # pytest's own log capture, whose report pytest-xdist cannot carry (a lone surrogate).
        log = logging.Logger("fleet_trio.test_edge")
        for handler in logging.getLogger().handlers:
            if isinstance(handler, StderrHandler):
                log.addHandler(handler)
        log.warning("job %s: refused", FORGED, extra={"job_id": FORGED, "peer": "a\x1bb"})
        try:
            raise ValueError(f"bad id {FORGED}")
        except ValueError:
            log.exception("failed")
    finally:
        teardown_logging()
    out = buf.getvalue()
    for bad in ("\r", "\x1b", "\x85", "\u202e", "\ud800"):
        assert bad not in out, (ascii(bad), ascii(out))
    lines = out.split("\n")[:-1]
    records = [line for line in lines if not line.startswith(" ")]
    assert len(records) == 2, ascii(lines)  # no line of its own for the forged text
    if fmt == "json":
        entries = [json.loads(line) for line in lines]
        assert len(entries) == 2
        # the value itself is kept exactly: only its representation is escaped
        assert entries[0]["event"] == f"job {FORGED}: refused"
        assert entries[0]["job_id"] == FORGED
        assert FORGED in entries[1]["exc"]
    else:
        assert lines[0].count("forged") == 2  # the message and job_id=, on one line
        assert "\\n2026-01-01" in lines[0] and "\\x1b[2J" in lines[0]
        assert lines[2] == "  Traceback (most recent call last):"
        assert any(line.startswith("  2026-01-01T00:00:00.000Z ERROR") for line in lines)
