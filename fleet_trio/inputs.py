"""Checks for input that comes from outside the process: ids, JSON text, log fields.

Every parser of outside input (dispatch bodies, the footprints file, controller answers, the
tail's query and messages) decodes JSON through :func:`loads_json`, which bounds the nesting depth
and refuses non-finite numbers, and every id that came from outside is checked with
:func:`id_problem` before anything is registered under it. Text from outside that reaches a log
line goes through :func:`printable` first, so it can neither forge a line nor hide in a terminal.

These are pure functions with no I/O; both roles use them.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

#: Longest id accepted anywhere (job ids, task types, device ids, worker-side ids).
ID_MAX_LEN = 256

#: The documented id character set: ASCII letters and digits first, then also ``. _ ~ : @ + = -``.
#: No whitespace, no control characters, no quotes, no slashes or backslashes, no ``%``, no
#: non-ASCII: an id is safe in a URL path segment, a file name, an environment value, argv (it
#: never starts with ``-``) and a log line, as it is.
ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._~:@+=-]*")

#: Deepest nesting of arrays and objects any outside JSON document may have.
JSON_MAX_DEPTH = 64

_DESCRIBE = "1-256 characters of A-Z a-z 0-9 . _ ~ : @ + = -, starting with a letter or digit"


class InputError(ValueError):
    """Outside input that fails a check; the message is safe to show and to log."""


def id_problem(value: str, *, max_len: int = ID_MAX_LEN) -> str | None:
    """Why ``value`` is not a valid id, or ``None`` when it is."""
    if not value:
        return "is empty"
    if len(value) > max_len:
        return f"is longer than {max_len} characters"
    if ID_PATTERN.fullmatch(value) is None:
        return f"must be {_DESCRIBE}"
    return None


def _reject_constant(name: str) -> Any:
    raise InputError(f"non-finite number {name} is not allowed")


def finite_float(text: str) -> float:
    """A JSON number that must be finite (``parse_float``): ``1e400`` is an :class:`InputError`."""
    value = float(text)
    if not math.isfinite(value):
        raise InputError(f"number out of range: {text[:32]}")
    return value


def _max_depth(text: str, limit: int) -> int:
    """Nesting depth of ``text`` (brackets inside strings do not count), stopping past ``limit``."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    return deepest
        elif ch in "]}":
            depth -= 1
    return deepest


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def go_strings(value: Any) -> Any:
    """Decoded JSON with every lone surrogate in its strings and keys (from an escape such as
    ``"\\ud800"``: the bytes were valid UTF-8) replaced by U+FFFD, as Go's decoder does.
    Python keeps them, and no file name, argv, environment or UTF-8 encoder takes them."""
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [go_strings(v) for v in value]
    if isinstance(value, dict):
        return {go_strings(k): go_strings(v) for k, v in value.items()}
    return value


def loads_json(data: str | bytes, *, max_depth: int = JSON_MAX_DEPTH, go_text: bool = False) -> Any:
    """Decode JSON from outside: depth-bounded, finite numbers only, any failure an InputError.

    ``NaN``, ``Infinity`` and numbers that overflow a float (``1e400``) are refused, as are
    documents nested deeper than ``max_depth`` and integers too long for Python to convert.
    ``go_text``: strings as a Go peer's decoder reads them (:func:`go_strings`).
    """
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError as exc:
        raise InputError(f"invalid UTF-8 at byte {exc.start}") from None
    # Fast path: a document with no more brackets than the limit cannot be nested deeper.
    if text.count("[") + text.count("{") > max_depth and _max_depth(text, max_depth) > max_depth:
        raise InputError(f"nested deeper than {max_depth} levels")
    try:
        value = json.loads(text, parse_constant=_reject_constant, parse_float=finite_float)
    except InputError:
        raise
    except RecursionError:  # the decoder's own bound, below a generous max_depth
        raise InputError("nested deeper than the decoder allows") from None
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno} column {exc.colno}"
        raise InputError(f"invalid JSON: {exc.msg} at {where}") from None
    except ValueError as exc:  # e.g. an integer with too many digits
        raise InputError(f"invalid JSON: {exc}") from None
    # a lone surrogate can only come from an escape, and every escape has a backslash
    return go_strings(value) if go_text and "\\" in text else value


def printable(text: str, *, limit: int | None = None) -> str:
    """``text`` with control characters, lone surrogates and backslashes escaped for a log line.

    The result holds no newline, carriage return, escape sequence or NUL, so a value from outside
    can neither forge a log line nor drive the operator's terminal. ``limit`` cuts long values
    (marked with ``…``).
    """
    if limit is not None and len(text) > limit:
        text = text[:limit] + "…"
    if text.isprintable() and "\\" not in text:
        return text
    out: list[str] = []
    for ch in text:
        code = ord(ch)
        if ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif code < 0x20 or code == 0x7F or 0x80 <= code < 0xA0 or 0xD800 <= code <= 0xDFFF:
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
        elif not ch.isprintable() and ch != " ":
            out.append(f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
        else:
            out.append(ch)
    return "".join(out)


__all__ = [
    "ID_MAX_LEN",
    "ID_PATTERN",
    "JSON_MAX_DEPTH",
    "InputError",
    "finite_float",
    "go_strings",
    "id_problem",
    "loads_json",
    "printable",
]


def first_control(text: str) -> str | None:
    """The first control character of ``text`` (C0 or DEL) as ``U+XXXX``, or None: names and
    tokens from a config or a flag that reach a header, an id or an environment must have none."""
    for ch in text:
        if ch < " " or ch == "\x7f":
            return f"U+{ord(ch):04X}"
    return None


def token_problem(text: str) -> str | None:
    """Why ``text`` cannot be a bearer token, or None: a control character (it would cut or
    forge a header), or a character outside ASCII (HTTP clients and servers here carry header
    values as ASCII: such a token could never be sent, or never match)."""
    found = first_control(text)
    if found:
        return f"must not contain a control character (found {found})"
    for ch in text:
        if ch > "\x7e":
            return f"must be ASCII (found U+{ord(ch):04X})"
    return None
