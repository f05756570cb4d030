"""The relay's input frame codec (worker-protocol.md §8.2, checklist 127): pure functions."""

from __future__ import annotations

import json

import pytest

from fleet_trio.worker.relay import (
    MAX_FRAME_LINE,
    DataFrame,
    Frame,
    FrameError,
    FrameReader,
    ResizeFrame,
    decode_frame,
    encode_data,
    encode_resize,
)


def encode_frame(frame: Frame) -> bytes:
    if isinstance(frame, DataFrame):
        return encode_data(frame.data)
    return encode_resize(frame.rows, frame.cols)


def test_encode_data_frame_exact_bytes() -> None:
    assert encode_data(b"ls") == b'{"t":"d","b":"bHM="}\n'
    assert encode_data(b"") == b'{"t":"d"}\n'  # b omitted when empty
    assert encode_frame(DataFrame(b"\xff\x00\r\n")) == b'{"t":"d","b":"/wANCg=="}\n'


def test_encode_resize_frame_exact_bytes() -> None:
    assert encode_resize(48, 180) == b'{"t":"r","rows":48,"cols":180}\n'
    assert encode_resize(0, 0) == b'{"t":"r"}\n'  # zero sizes omitted
    assert encode_resize(0, 80) == b'{"t":"r","cols":80}\n'
    assert encode_frame(ResizeFrame(65535, 1)) == b'{"t":"r","rows":65535,"cols":1}\n'
    with pytest.raises(ValueError):
        encode_resize(65536, 1)
    with pytest.raises(ValueError):
        encode_resize(-1, 1)


def test_round_trip() -> None:
    frames = [DataFrame(bytes(range(256))), ResizeFrame(24, 80), DataFrame(b""), ResizeFrame(0, 0)]
    reader = FrameReader()
    assert reader.feed(b"".join(encode_frame(f) for f in frames)) == frames


def test_decode_single_lines() -> None:
    assert decode_frame(b'{"t":"d","b":"bHM="}') == DataFrame(b"ls")
    assert decode_frame(b'{"t":"d"}') == DataFrame(b"")
    assert decode_frame(b'{"t":"d","b":null}') == DataFrame(b"")
    assert decode_frame(b'{"t":"r","rows":48,"cols":180}') == ResizeFrame(48, 180)
    assert decode_frame(b'{"t":"r"}') == ResizeFrame(0, 0)
    assert decode_frame(b'{"b":"bHM=","t":"d","extra":[1,2]}') == DataFrame(b"ls")
    assert decode_frame(b"   ") is None
    assert decode_frame(b'{"t":"x","b":"bHM="}') is None  # unknown type: skipped
    assert decode_frame(b'{"b":"bHM="}') is None  # no type: skipped


@pytest.mark.parametrize(
    "line",
    [
        b"{not json",
        b'{"t":"d","b":"bHM="',
        b'"just a string"',
        b"[1,2]",
        b'{"t":5}',
        b'{"t":"d","b":12}',
        b'{"t":"d","b":"not base64!"}',
        b'{"t":"r","rows":"48","cols":180}',
        b'{"t":"r","rows":true,"cols":180}',
        b'{"t":"r","rows":48.5,"cols":180}',
        b'{"t":"r","rows":70000,"cols":180}',
        b'{"t":"r","rows":-1,"cols":180}',
        b"\xff\xfe",
    ],
)
def test_decode_rejects_malformed(line: bytes) -> None:
    with pytest.raises(FrameError):
        decode_frame(line)


def test_reader_reassembles_frames_split_anywhere() -> None:
    stream = encode_data(b"echo hello\n") + encode_resize(48, 180) + encode_data(b"exit\n")
    want = [DataFrame(b"echo hello\n"), ResizeFrame(48, 180), DataFrame(b"exit\n")]
    for size in (1, 2, 3, 7, 13, len(stream)):
        reader = FrameReader()
        got = []
        for i in range(0, len(stream), size):
            got += reader.feed(stream[i : i + size])
        got += reader.finish()
        assert got == want, size


def test_reader_skips_blank_lines_and_unknown_types() -> None:
    reader = FrameReader()
    data = b'\n  \n{"t":"zz","x":1}\n' + encode_data(b"a") + b"\r\n" + encode_resize(1, 2)
    assert reader.feed(data) == [DataFrame(b"a"), ResizeFrame(1, 2)]


def test_reader_rejects_malformed_json_after_good_frames() -> None:
    reader = FrameReader()
    assert reader.feed(encode_data(b"ok")) == [DataFrame(b"ok")]
    with pytest.raises(FrameError):
        reader.feed(b'{"t":"d","b":\n')


def test_reader_last_line_without_newline_counts_at_eof() -> None:
    reader = FrameReader()
    assert reader.feed(b'{"t":"d","b":"bHM="}') == []
    assert reader.finish() == [DataFrame(b"ls")]
    assert reader.finish() == []


def test_reader_line_limit() -> None:
    reader = FrameReader(max_line=32)
    assert reader.feed(b'{"t":"d","b":"' + b"A" * 12 + b'"}\n') == [DataFrame(b"\x00" * 9)]
    with pytest.raises(FrameError):
        reader.feed(b"x" * 33)
    big = FrameReader()
    payload = json.dumps({"t": "d", "b": "A" * (MAX_FRAME_LINE + 4)}).encode() + b"\n"
    with pytest.raises(FrameError):
        big.feed(payload)
