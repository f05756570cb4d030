"""Go-style durations (worker-process.md §0.2) and signal names (§0.3)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet_trio.durations import (
    HOUR,
    MILLISECOND,
    SECOND,
    go_duration,
    go_duration_seconds,
    parse_duration,
    signal_text,
)
from fleet_trio.errors import DurationError


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("300ms", 300 * MILLISECOND),
        ("1.5s", 1_500 * MILLISECOND),
        ("1m30s", 90 * SECOND),
        ("2h", 2 * HOUR),
        ("0", 0),
        ("-1.5h", -(HOUR + HOUR // 2)),
        ("1h0m0s", HOUR),
        ("10m0.5s", 600 * SECOND + 500 * MILLISECOND),
        (".5s", 500 * MILLISECOND),
        ("1.s", SECOND),
        ("1µs", 1_000),
        ("1us", 1_000),
        ("1\u03bcs", 1_000),
        ("7ns", 7),
        ("+3s", 3 * SECOND),
        ("1h2m3s4ms5us6ns", HOUR + 2 * 60 * SECOND + 3 * SECOND + 4_005_006),
    ],
)
def test_parse_accepts_what_go_accepts(text: str, ns: int) -> None:
    assert parse_duration(text) == ns


@pytest.mark.parametrize("text", ["30", "", "s", "1x", ".", "-", "1..5s", "1s2", "10 s", "1e3s"])
def test_parse_rejects_what_go_rejects(text: str) -> None:
    with pytest.raises(DurationError) as info:
        parse_duration(text)
    assert "invalid duration" in str(info.value)


def test_bare_number_error_says_the_unit_is_missing() -> None:
    with pytest.raises(DurationError, match="missing unit"):
        parse_duration("30")


def test_parse_rejects_overflow() -> None:
    with pytest.raises(DurationError, match="out of range"):
        parse_duration("9999999999h")


@pytest.mark.parametrize(
    ("ns", "text"),
    [
        (0, "0s"),
        (10 * SECOND, "10s"),
        (120 * SECOND, "2m0s"),
        (500 * MILLISECOND, "500ms"),
        (300 * MILLISECOND, "300ms"),
        (200 * MILLISECOND, "200ms"),
        (HOUR, "1h0m0s"),
        (1_500 * MILLISECOND, "1.5s"),
        (90 * SECOND, "1m30s"),
        (600 * SECOND + 500 * MILLISECOND, "10m0.5s"),
        (1_500_000, "1.5ms"),
        (1_000, "1µs"),
        (1_500, "1.5µs"),
        (999, "999ns"),
        (-SECOND, "-1s"),
        ((1 << 63) - 1, "2562047h47m16.854775807s"),
    ],
)
def test_format_matches_go(ns: int, text: str) -> None:
    assert go_duration(ns) == text


def test_format_from_float_seconds() -> None:
    assert go_duration_seconds(0.7) == "700ms"
    assert go_duration_seconds(0.5) == "500ms"
    assert go_duration_seconds(30) == "30s"
    assert go_duration_seconds(120) == "2m0s"


@given(st.integers(min_value=-((1 << 63) - 1), max_value=(1 << 63) - 1))
def test_format_then_parse_round_trips(ns: int) -> None:
    assert parse_duration(go_duration(ns)) == ns


@given(
    st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=10_000), st.sampled_from(["h", "m", "s", "ms"])
        ),
        min_size=1,
        max_size=4,
    )
)
def test_parse_then_format_then_parse_is_stable(parts: list[tuple[int, str]]) -> None:
    text = "".join(f"{n}{u}" for n, u in parts)
    ns = parse_duration(text)
    assert parse_duration(go_duration(ns)) == ns


def test_signal_names_are_gos() -> None:
    assert signal_text(9) == "killed"
    assert signal_text(15) == "terminated"
    assert signal_text(11) == "segmentation fault"
    assert signal_text(24) == "CPU time limit exceeded"
    assert signal_text(2) == "interrupt"
    assert signal_text(40) == "signal 40"
