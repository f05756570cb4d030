"""fleet_trio.inputs: the shared checks for outside input."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet_trio.inputs import InputError, id_problem, loads_json, printable


@pytest.mark.parametrize(
    "good", ["a3f9-XYZ_0123456789abcdef.fleet~job", "agd-" + "0" * 24, "fakehost:gpu0", "x" * 256]
)
def test_ids_the_spec_and_peers_use_are_valid(good: str) -> None:
    assert id_problem(good) is None


@pytest.mark.parametrize(
    "bad", ["", "x" * 257, "a\x00b", "a\nb", "a b", "a/b", "-rf", "\ud800", "é", 'a"b', "a%2fb"]
)
def test_hostile_ids_are_refused_with_a_reason(bad: str) -> None:
    assert id_problem(bad)


@pytest.mark.parametrize(
    "text",
    [
        "[" * 5000 + "]" * 5000,
        '{"a":' * 100 + "1" + "}" * 100,
        "1e400",
        "NaN",
        "-Infinity",
        '{"samples": 1e400}',
        "1" * 5000,
        '"\\ud800',
        "{",
        b"\xff",
    ],
)
def test_hostile_json_is_an_input_error(text: str | bytes) -> None:
    with pytest.raises(InputError):
        loads_json(text)


def test_brackets_inside_strings_do_not_count_as_depth() -> None:
    text = json.dumps({"s": "[" * 500 + "{" * 500})
    assert loads_json(text) == {"s": "[" * 500 + "{" * 500}


@given(
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers()
        | st.text()
        | st.floats(allow_nan=False, allow_infinity=False),
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(), c, max_size=3),
        max_leaves=20,
    )
)
def test_ordinary_json_round_trips(value: object) -> None:
    assert loads_json(json.dumps(value)) == value


@given(st.text())
def test_printable_never_lets_a_control_character_through(text: str) -> None:
    out = printable(text)
    assert "\n" not in out and "\r" not in out and "\x1b" not in out and "\x00" not in out
    assert all(not (0xD800 <= ord(c) <= 0xDFFF) for c in out)
    out.encode("utf-8")
