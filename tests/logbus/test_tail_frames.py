"""The tail's frame texts: built without the JSON encoder, byte for byte what it would write,
one frame at a time, and cut so that a character is not split between two frames."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet_trio.logbus.bus import End, Output, Skipped, utf8_cut
from fleet_trio.logbus.tail import (
    MAX_FRAME_DATA,
    TailError,
    TailProtocolError,
    dumps,
    encode_event,
    encode_output,
    event_texts,
    frame_pieces,
    loads,
    output_text,
)

# Text that exercises every escape: quotes, backslashes, all C0 controls, DEL, non-ASCII
# (2-, 3- and 4-byte UTF-8), U+2028/U+2029 (valid JSON as they are).
TEXT = st.text(
    alphabet=st.one_of(
        st.sampled_from('"\\\x7f\u2028\u2029é中😀'),
        st.characters(max_codepoint=0x1F),
        st.characters(min_codepoint=0x20, max_codepoint=0x7E),
        st.characters(exclude_categories=("Cs",)),
    ),
    max_size=300,
)
TIMES = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(0, 2**40).map(float))


@settings(max_examples=300, deadline=None)
@given(
    data=st.one_of(TEXT.map(lambda t: t.encode("utf-8")), st.binary(max_size=300)),
    stream=st.sampled_from(["stdout", "stderr"]),
    offset=st.integers(0, 2**63 - 1),
    t=TIMES,
)
def test_output_text_is_exactly_the_json_encoders(
    data: bytes, stream: str, offset: int, t: float
) -> None:
    text = output_text(stream, offset, data, t)
    assert text == dumps(encode_output(stream, offset, data, t))
    event = loads(text)
    assert isinstance(event, Output) and event.data == data and event.offset == offset


def test_output_text_of_log_lines() -> None:
    line = 'step 42 loss "0.1234" path C:\\tmp\t\x1b[32mok\x1b[0m é\r\n'
    data = (line * 500).encode()
    text = output_text("stderr", 7, data, 1.5)
    assert text == dumps(encode_output("stderr", 7, data, 1.5))
    assert "b64" not in json.loads(text)


@settings(max_examples=200, deadline=None)
@given(
    data=st.one_of(TEXT.map(lambda t: t.encode("utf-8")), st.binary(max_size=64), st.just(b"")).map(
        lambda b: b * (1 + (2 * MAX_FRAME_DATA) // max(1, len(b) * 40))
    ),
    size=st.integers(1, 40),
)
def test_frame_pieces_cover_the_chunk_and_respect_characters(data: bytes, size: int) -> None:
    pieces = list(frame_pieces(data, size))
    if not data:
        assert pieces == [(0, 0)]  # an empty chunk is one (empty) frame, as before
        return
    assert [i for i, _ in pieces] == [0] + [j for _, j in pieces[:-1]]
    assert (pieces[-1][1] if pieces else 0) == len(data)
    for i, j in pieces:
        assert 0 < j - i <= size
        if j < len(data) and size >= 4:
            # a cut lands on a character start unless no start is within 3 bytes
            near = any(data[k] & 0xC0 != 0x80 for k in range(max(i + 1, j - 3), j + 1))
            assert data[j] & 0xC0 != 0x80 or not near
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return
    if size >= 4:  # valid UTF-8 stays valid in every piece
        for i, j in pieces:
            data[i:j].decode("utf-8")


def test_utf8_cut() -> None:
    euro = "€".encode()  # e2 82 ac
    data = b"ab" + euro + b"cd"
    assert utf8_cut(data, 3, 0) == 2  # inside the euro sign: back to its start
    assert utf8_cut(data, 4, 0) == 2
    assert utf8_cut(data, 5, 0) == 5  # "c" starts a character
    assert utf8_cut(data, 3, 2) == 3  # never back to the floor: the piece would be empty
    assert utf8_cut(b"\x80" * 8, 6, 0) == 6  # no start near: unchanged


def test_a_large_chunk_is_sent_as_frames_without_splitting_a_character() -> None:
    # A 3-byte character straddles every MAX_FRAME_DATA boundary of the chunk.
    unit = "x" * (MAX_FRAME_DATA - 1) + "€"
    data = (unit * 3).encode()
    event = Output("stdout", 10, data, 2.0)
    texts = list(event_texts(event))
    assert texts == [dumps(m) for m in encode_event(event)]
    msgs = [json.loads(t) for t in texts]
    assert all("b64" not in m for m in msgs)  # no frame is lossy
    assert all(len(m["data"].encode()) <= MAX_FRAME_DATA for m in msgs)
    assert b"".join(m["data"].encode() for m in msgs) == data
    assert msgs[0]["offset"] == 10
    for a, b in itertools.pairwise(msgs):
        assert b["offset"] - a["offset"] == len(a["data"].encode())


def test_event_texts_is_lazy() -> None:
    texts = event_texts(Output("stdout", 0, b"y" * (5 * MAX_FRAME_DATA), 0.0))
    first = next(texts)  # one frame built, not five
    assert json.loads(first)["data"] == "y" * MAX_FRAME_DATA
    assert len(list(texts)) == 4


def test_event_texts_of_the_other_events() -> None:
    for event in (Skipped(3, 10), End("done", 0, "", 13), TailError("unknown job")):
        assert list(event_texts(event)) == [dumps(m) for m in encode_event(event)]


def test_loads_a_frame_of_json_log_lines_and_refuses_a_deep_one() -> None:
    data = b'{"step": 1, "tags": [["a"], {"b": [1]}]}\n' * 500  # 3,500 brackets, in a string
    event = loads(output_text("stdout", 0, data, 1.0))
    assert isinstance(event, Output) and event.data == data
    for deep in (
        '{"type":"skipped","offset":1,"bytes":2,"x":' + "[" * 100_000 + "]" * 100_000 + "}",
        "[" * 100_000,
    ):
        with pytest.raises(TailProtocolError):
            loads(deep)
