"""A Hypothesis state machine over the synchronous core (History + Cursor), spill simulated.

Invariants:
* the history holds a contiguous suffix of the written bytes, and
  ``size <= max(limit, len(newest chunk))`` (the newest chunk is always kept whole);
* each cursor's events, Output bytes plus Skipped counts, cover ``[start, total)`` in order
  without overlaps; the only gaps are bytes of streams the cursor filters out;
* Output data and stream match what was written at that offset;
* right after a poll that returned an event, the cursor is at most ``max_lag`` behind;
* a holding cursor keeps what it has not read (within ``max_lag``) in the history;
* End comes last and exactly once, with ``offset == total``.
"""

from __future__ import annotations

import attrs
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    precondition,
    rule,
)

from fleet_trio.logbus import STREAMS, Cursor, End, History, Output, Skipped, SpillRead, Stream

STREAM_CODE: dict[Stream, int] = {"stdout": 0, "stderr": 1}


@attrs.define
class Reader:
    cursor: Cursor
    expect_pos: int
    ended: bool = False
    events: int = 0
    held_from: int = 0  # history.start when a holding reader subscribed


class HistoryMachine(RuleBasedStateMachine):
    readers = Bundle("readers")

    def __init__(self) -> None:
        super().__init__()
        self.history = History(0)
        self.data = bytearray()
        self.streams = bytearray()  # per byte: 0 stdout, 1 stderr
        self.end: End | None = None
        self.spill = False
        self.spilled = 0
        self.spill_broken = False
        self.all_readers: list[Reader] = []
        self.steps = 0  # End (finish, drain) and a broken spill only after some activity

    @initialize(limit=st.one_of(st.integers(0, 64), st.integers(64, 400)), spill=st.booleans())
    def setup(self, limit: int, spill: bool) -> None:
        self.history = History(limit)
        self.spill = spill

    @rule(
        writes=st.lists(
            st.tuples(st.sampled_from(["stdout", "stderr"]), st.integers(0, 40)), max_size=4
        ),
        t=st.floats(0, 1e9, allow_nan=False),
    )
    def write(self, writes: list[tuple[Stream, int]], t: float) -> None:
        self.steps += 1
        if self.end is not None:
            return  # the JobLog ignores writes after end; the core never sees them
        for stream, size in writes:
            data = bytes((len(self.data) + i) % 251 for i in range(size))
            offset = self.history.append(stream, data, t)
            assert offset == len(self.data)
            self.data += data
            self.streams += bytes([STREAM_CODE[stream]]) * size

    @precondition(lambda self: self.spill and not self.spill_broken)
    @rule(frac=st.floats(0, 1))
    def flush(self, frac: float) -> None:
        self.spilled += int((len(self.data) - self.spilled) * frac)

    @precondition(lambda self: self.spill and not self.spill_broken and self.steps > 12)
    @rule()
    def break_spill(self) -> None:
        self.spill_broken = True

    @precondition(lambda self: self.steps > 8)
    @rule()
    def finish(self) -> None:
        if self.end is None:
            self.end = End("done", 0, "", len(self.data))

    @rule(
        target=readers,
        start=st.one_of(st.sampled_from(["start", "now"]), st.integers(-5, 400)),
        streams=st.sampled_from([STREAMS, frozenset({"stdout"}), frozenset({"stderr"})]),
        max_lag=st.one_of(st.integers(0, 100), st.just(1 << 20)),
        batch=st.sampled_from([0, 1, 7, 64]),
        hold=st.booleans(),
    )
    def subscribe(
        self, start: str | int, streams: frozenset[Stream], max_lag: int, batch: int, hold: bool
    ) -> Reader:
        cursor = Cursor(
            self.history,
            start,  # type: ignore[arg-type]
            streams=streams,
            max_lag=max_lag,
            batch=batch,
            hold=hold,
        )
        if self.end is not None:
            cursor.clamp(self.end.offset)  # what JobLog.subscribe does
        if start == "start":
            assert cursor.pos == 0
        elif start == "now":
            assert cursor.pos == len(self.data)
        reader = Reader(cursor, cursor.pos, held_from=self.history.start)
        self.all_readers.append(reader)
        return reader

    def _spill_state(self) -> tuple[int, bool]:
        if not self.spill or self.spill_broken:
            return 0, False
        return self.spilled, self.spilled < len(self.data)

    def _check_gap(self, reader: Reader, upto: int) -> None:
        """Bytes in [expect_pos, upto) were passed over: they must all be filtered out."""
        assert upto >= reader.expect_pos, "overlap / going backwards"
        for code in self.streams[reader.expect_pos : upto]:
            stream: Stream = "stdout" if code == 0 else "stderr"
            assert stream not in reader.cursor.streams, "a gap in the delivered bytes"
        reader.expect_pos = upto

    @rule(reader=readers, pace=st.integers(1, 8), spill_chunk=st.integers(1, 16))
    def read(self, reader: Reader, pace: int, spill_chunk: int) -> None:
        self.steps += 1
        cursor = reader.cursor
        for _ in range(pace):
            spill_upto, pending = self._spill_state()
            ev = cursor.poll(self.end, spill_upto=spill_upto, spill_pending=pending)
            if ev is None:
                if reader.ended:
                    return
                at_end = cursor.pos >= len(self.data) and self.end is None
                assert at_end or (cursor.pos < self.history.start and pending)
                return
            assert not reader.ended, "an event after End"
            if isinstance(ev, SpillRead):
                assert ev.offset == cursor.pos < ev.upto <= min(spill_upto, self.history.start)
                # the JobLog serves a piece of it (one stream run) from the file
                event("spill read")
                self._check_gap(reader, ev.offset)
                n = min(spill_chunk, ev.upto - ev.offset)
                code = self.streams[ev.offset]
                run = 1
                while run < n and self.streams[ev.offset + run] == code:
                    run += 1
                cursor.advance(run)
                if ("stdout" if code == 0 else "stderr") in cursor.streams:
                    reader.expect_pos += run
                continue
            reader.events += 1
            if isinstance(ev, End):
                assert ev == self.end
                assert ev.offset == len(self.data)
                self._check_gap(reader, max(ev.offset, reader.expect_pos))
                reader.ended = True
                assert cursor.done
                continue
            self._check_gap(reader, ev.offset)
            if isinstance(ev, Skipped):
                assert ev.nbytes > 0
                event("skipped (lag)" if cursor.pos > self.history.start else "skipped (evicted)")
                reader.expect_pos += ev.nbytes
            else:
                assert isinstance(ev, Output)
                assert ev.data, "empty Output"
                assert not cursor.batch or len(ev.data) <= cursor.batch, "larger than asked"
                event("output mid-chunk" if ev.offset not in self._chunk_starts() else "output")
                assert ev.stream in cursor.streams
                assert bytes(self.data[ev.offset : ev.offset + len(ev.data)]) == ev.data
                assert set(self.streams[ev.offset : ev.offset + len(ev.data)]) == {
                    STREAM_CODE[ev.stream]
                }
                stop = ev.offset + len(ev.data)
                inner = [o for o in self._chunk_starts() if ev.offset < o < stop]
                if inner:  # chunks joined: only up to the reader's batch size
                    event("output joined")
                    assert len(ev.data) <= cursor.batch
                reader.expect_pos += len(ev.data)
            assert reader.expect_pos == cursor.pos
            assert self.history.total - max(cursor.pos, cursor.base) <= cursor.max_lag

    def _chunk_starts(self) -> set[int]:
        return {c[0] for c in self.history.chunks()}

    @precondition(lambda self: self.steps > 8)
    @rule(reader=consumes(readers))
    def drain(self, reader: Reader) -> None:
        """Finish the job and read everything: End must come, exactly once."""
        self.finish()
        if self.spill and not self.spill_broken:
            self.spilled = len(self.data)
        for _ in range(10_000):
            if reader.ended:
                break
            self.read(reader, 8, 16)
        assert reader.ended
        assert reader.expect_pos == max(len(self.data), reader.cursor.start)
        self.all_readers.remove(reader)

    @invariant()
    def history_bounded_and_contiguous(self) -> None:
        h = self.history
        chunks = h.chunks()
        assert h.total == len(self.data)
        assert h.size == sum(len(c[2]) for c in chunks)
        assert h.start == h.total - h.size
        newest = len(chunks[-1][2]) if chunks else 0
        holders = [r for r in self.all_readers if r.cursor.holding]
        if not holders:
            assert h.size <= max(h.limit, newest)
        else:
            event("holding reader")
            # beyond the limit, at most what a holder may still read, plus one chunk
            extra = max(r.cursor.max_lag for r in holders) + 4 * 40
            assert h.size <= max(h.limit, newest) + extra
        for r in holders:
            # nothing a holder has not read was evicted since it subscribed, unless the lag
            # rule would skip it anyway
            c = r.cursor
            if h.start > max(c.pos, h.total - c.max_lag, r.held_from):
                raise AssertionError("evicted bytes a holding reader still needs")
        pos = h.start
        for offset, stream, data in chunks:
            assert offset == pos and data
            assert bytes(self.data[offset : offset + len(data)]) == data
            assert self.streams[offset] == STREAM_CODE[stream]
            pos += len(data)
        assert pos == h.total

    @invariant()
    def readers_never_ahead(self) -> None:
        for reader in self.all_readers:
            assert reader.expect_pos <= max(reader.cursor.pos, reader.cursor.start)


HistoryMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestHistoryMachine = HistoryMachine.TestCase
