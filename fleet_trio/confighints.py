"""Hints for configuration typos: the closest known key (``difflib``)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest(key: str, known: Iterable[str]) -> str | None:
    """The known key closest to ``key`` (``heartbeat_intervall`` → ``heartbeat_interval``),
    or ``None`` when nothing is close."""
    found = difflib.get_close_matches(key, sorted(set(known)), n=1, cutoff=0.7)
    return found[0] if found else None


def did_you_mean(key: str, known: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` or ``""``."""
    match = closest(key, known)
    return f" (did you mean {match!r}?)" if match else ""


__all__ = ["closest", "did_you_mean"]
