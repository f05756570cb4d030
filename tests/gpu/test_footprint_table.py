"""The footprint table's invariants (Hypothesis state machine) and the file format."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from fleet_trio.gpu.footprints import (
    FootprintFileError,
    FootprintKey,
    FootprintRecord,
    FootprintTable,
    advertised,
    dump_records,
    format_time_ns,
    go_float,
    parse_records,
    parse_time_ns,
    round_tenth,
)

KEYS = st.sampled_from(
    [
        FootprintKey("sdxl"),
        FootprintKey("sdxl", "bf16", "image-gen"),
        FootprintKey("wan2.2", "q8_0", "video-gen"),
        FootprintKey("whisper"),
    ]
)
OBS = st.one_of(
    st.floats(min_value=-5, max_value=100, allow_nan=False),
    st.sampled_from([0.0, -1.5, 2.0, 3.333, 1.04, 0.01, 0.04]),
)
RECORDS = st.builds(
    FootprintRecord,
    key=KEYS,
    vram_peak_gb=st.floats(min_value=0, max_value=200, allow_nan=False),
    observed_peak_gb=st.floats(min_value=0, max_value=200, allow_nan=False),
    samples=st.integers(min_value=0, max_value=1000),
    updated_ns=st.integers(min_value=0, max_value=4_000_000_000 * 10**9),
)


class TableMachine(RuleBasedStateMachine):
    """Advertised values are never ≤ 0 and never decrease; merge is a join."""

    def __init__(self) -> None:
        super().__init__()
        self.table = FootprintTable(1.2)
        self.seen: dict[FootprintKey, float] = {}
        self.clock = 0

    @rule(key=KEYS, observed=OBS)
    def observe(self, key: FootprintKey, observed: float) -> None:
        self.clock += 1
        before = self.table.get(key)
        rec = self.table.observe(key, observed, self.clock)
        if observed <= 0:
            assert rec is None
            assert self.table.get(key) == before
        else:
            assert rec is not None
            assert rec.observed_peak_gb >= observed
            assert rec.samples == (before.samples if before else 0) + 1

    @rule(records=st.lists(RECORDS, max_size=4))
    def merge(self, records: list[FootprintRecord]) -> None:
        self.table.merge(records)

    @rule(records=st.lists(RECORDS, max_size=4))
    def merge_is_commutative_and_idempotent(self, records: list[FootprintRecord]) -> None:
        other = FootprintTable(1.2, records)
        a = self.table.copy()
        a.merge(other.records())
        b = other.copy()
        b.merge(self.table.records())
        assert a.records() == b.records()
        again = a.copy()
        assert again.merge(other.records()) is False
        assert again.merge(self.table.records()) is False
        assert again.records() == a.records()

    @precondition(lambda self: len(self.table) > 0)
    @rule()
    def roundtrip_through_the_file_format(self) -> None:
        text = self.table.to_json()
        assert FootprintTable(1.2, parse_records(text)).records() == self.table.records()

    @invariant()
    def advertised_never_non_positive_and_never_decreasing(self) -> None:
        for entry in self.table.entries():
            assert entry.vram_peak_gb > 0
            key = FootprintKey(entry.model_family, entry.quant, entry.task_type)
            assert entry.vram_peak_gb >= self.seen.get(key, 0.0)
            self.seen[key] = entry.vram_peak_gb
        listed = {FootprintKey(e.model_family, e.quant, e.task_type) for e in self.table.entries()}
        assert set(self.seen) <= listed


TestTableMachine = TableMachine.TestCase
TestTableMachine.pytestmark = [pytest.mark.slow]
TestTableMachine.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)


@pytest.mark.parametrize(
    ("observed", "want"),
    [
        (2.0, 2.4),
        (3.0, 3.6),
        (3.333, 4.0),
        (1.04, 1.2),
        (10.0, 12.0),
        (0.51, 0.6),
        (13.29, 15.9),
        (4.25, 5.1),
        (7.0, 8.4),
        (8.0, 9.6),
        (12.5, 15.0),
        (14.0, 16.8),
        (5.5, 6.6),
        (1.0, 1.2),
    ],
)
def test_rounding_table(observed: float, want: float) -> None:
    assert advertised(observed) == want


def test_round_half_away_from_zero() -> None:
    assert round_tenth(0.25) == 0.3  # Python's round() would give 0.2
    assert round_tenth(0.05) == 0.1
    assert round_tenth(0.04) == 0.0


def test_margin_is_configurable() -> None:
    table = FootprintTable(1.0)
    rec = table.observe(FootprintKey("wan2.2"), 13.29, 1)
    assert rec is not None and rec.vram_peak_gb == 13.3
    with pytest.raises(ValueError):
        FootprintTable(0)


def test_file_format_matches_the_spec_example() -> None:
    records = [
        FootprintRecord(
            FootprintKey("sdxl", "bf16", "image-gen"),
            8.4,
            7.0,
            2,
            parse_time_ns("2026-07-17T05:40:02.125Z"),
        ),
        FootprintRecord(
            FootprintKey("acestep", "", "audio-gen"),
            5.1,
            4.25,
            1,
            parse_time_ns("2026-07-17T05:31:29.5Z"),
        ),
    ]
    want = """[
  {
    "model_family": "acestep",
    "task_type": "audio-gen",
    "vram_peak_gb": 5.1,
    "observed_peak_gb": 4.25,
    "samples": 1,
    "updated": "2026-07-17T05:31:29.5Z"
  },
  {
    "model_family": "sdxl",
    "quant": "bf16",
    "task_type": "image-gen",
    "vram_peak_gb": 8.4,
    "observed_peak_gb": 7,
    "samples": 2,
    "updated": "2026-07-17T05:40:02.125Z"
  }
]"""
    assert dump_records(records) == want
    assert dump_records([]) == "[]"


def test_parse_is_tolerant_and_last_duplicate_wins() -> None:
    text = json.dumps(
        [
            {"model_family": "sdxl", "vram_peak_gb": 2.4},
            {"model_family": "sdxl", "vram_peak_gb": 3.6, "observed_peak_gb": 3},
            {},
        ]
    )
    recs = {r.key: r for r in parse_records(text)}
    assert recs[FootprintKey("sdxl")].vram_peak_gb == 3.6
    assert recs[FootprintKey("")].vram_peak_gb == 0
    assert parse_records("null") == []


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{", "invalid JSON: "),
        ("{}", "the footprint file must hold a JSON array"),
        ("[1]", "each footprint must be a JSON object"),
        ('[{"model_family": 3}]', "model_family must be a string"),
        ('[{"vram_peak_gb": "2"}]', "vram_peak_gb must be a number"),
        ('[{"vram_peak_gb": NaN}]', "non-finite number NaN is not allowed"),
        ('[{"updated": "yesterday"}]', "bad updated time 'yesterday'"),
        ('[{"samples": 1.5}]', "samples must be an integer"),
    ],
)
def test_parse_rejects_corrupt_files_saying_why(text: str, says: str) -> None:
    with pytest.raises(FootprintFileError) as info:
        parse_records(text)
    assert says in str(info.value)


@given(st.integers(min_value=-62135596800 * 10**9, max_value=253402300799 * 10**9))
def test_time_roundtrip(ns: int) -> None:
    assert parse_time_ns(format_time_ns(ns)) == ns


def test_time_formats() -> None:
    assert format_time_ns(parse_time_ns("2026-07-17T05:31:29.123456789Z")) == (
        "2026-07-17T05:31:29.123456789Z"
    )
    assert format_time_ns(parse_time_ns("2026-07-17T07:31:29+02:00")) == "2026-07-17T05:31:29Z"


def test_go_float() -> None:
    assert go_float(7.0) == "7"
    assert go_float(8.4) == "8.4"
    assert go_float(0.00001) == "0.00001"
    assert go_float(1e21) == "1e+21"
    with pytest.raises(ValueError):
        go_float(float("nan"))


def test_go_string_escapes() -> None:
    table = FootprintTable()
    table.observe(FootprintKey("a<b>&ü"), 1.0, 0)
    assert '"a\\u003cb\\u003e\\u0026ü"' in table.to_json()
    assert parse_records(table.to_json())[0].key.family == "a<b>&ü"
