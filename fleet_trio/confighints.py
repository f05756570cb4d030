"""Configuration errors both roles' loaders share: the closest known key for a typo
(``difflib``), and a cattrs structuring failure turned into one message naming its key.

A loader raises :class:`KeyedError` (message + dotted key) and turns it into a
``ConfigError`` that names the file at its edge.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any

import attrs
import cattrs


def closest(key: str, known: Iterable[str]) -> str | None:
    """The known key closest to ``key`` (``heartbeat_intervall`` → ``heartbeat_interval``),
    or ``None`` when nothing is close."""
    found = difflib.get_close_matches(key, sorted(set(known)), n=1, cutoff=0.7)
    return found[0] if found else None


def did_you_mean(key: str, known: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` or ``""``."""
    match = closest(key, known)
    return f" (did you mean {match!r}?)" if match else ""


class KeyedError(ValueError):
    """A config problem and the dotted key it is about (``devices[1].max_runtime``)."""

    def __init__(self, message: str, key: str) -> None:
        super().__init__(message)
        self.key = key


def _format_exception(exc: BaseException, type_: type | None) -> str:
    """A hook's ``ValueError`` says it best; unknown keys of a strict class get a hint."""
    if isinstance(exc, ValueError) and str(exc):
        return str(exc)
    if isinstance(exc, AttributeError | TypeError) and type_ is not None and attrs.has(type_):
        # a nested section given a scalar or a list (cattrs reads it as a mapping)
        return "expected a mapping (key: value lines)"
    if isinstance(exc, cattrs.ForbiddenExtraKeysError) and attrs.has(exc.cl):
        known = [f.name for f in attrs.fields(exc.cl)]
        hints = "".join(did_you_mean(str(k), known) for k in sorted(exc.extra_fields))
        return cattrs.v.format_exception(exc, type_) + hints
    return cattrs.v.format_exception(exc, type_)


def cattrs_error(exc: BaseException, prefix: str = "") -> tuple[str, str]:
    """``(message, dotted key)`` of the first error of a cattrs structuring failure, the key
    under ``prefix`` (``$.devices[1]['x']`` → ``prefix.devices[1].x``)."""
    try:
        messages = cattrs.transform_error(exc, path="$", format_exception=_format_exception)
    except Exception:  # pragma: no cover - defensive: never lose the error itself
        messages = []
    if not messages:
        return str(exc), prefix
    message, _, where = messages[0].rpartition(" @ ")
    if not message:
        message, where = messages[0], "$"
    key = where.removeprefix("$").replace("['", ".").replace("']", "").lstrip(".")
    return message, ".".join(p for p in (prefix, key) if p)


def structure(converter: cattrs.Converter, value: object, cls: Any, key: str) -> Any:
    """``converter.structure``; a failure is a :class:`KeyedError` under ``key``. A section
    (an attrs class) given anything but a mapping is refused here: cattrs would fail on it
    with an ``AttributeError``, not a validation error."""
    if attrs.has(cls) and not isinstance(value, Mapping):
        kind = {list: "a list", str: "a string", int: "a number", float: "a number",
                bool: "a boolean"}.get(type(value), type(value).__name__)  # fmt: skip
        raise KeyedError(f"expected a mapping (key: value lines), got {kind}", key)
    try:
        return converter.structure(value, cls)
    except (cattrs.BaseValidationError, ValueError, TypeError) as exc:
        message, where = cattrs_error(exc, key)
        raise KeyedError(message, where) from None


__all__ = ["KeyedError", "cattrs_error", "closest", "did_you_mean", "structure"]
