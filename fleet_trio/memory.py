"""The memory budget: one ceiling on what a process retains across jobs (docs/node.md).

Retained job output — a node's kept results and both roles' log histories — is charged to one
:class:`MemoryBudget`. Each charge is an *entry* (``(kind, job_id)``, e.g. ``("result",
"j-1")`` or ``("log", "j-1")``) with its current size. A running job's entries count but are
never evicted; once an entry is :meth:`ended <MemoryBudget.end>` it may be. :meth:`settle`
evicts ended entries — log histories before results (:data:`EVICTION_ORDER`), oldest end
first within a kind — until the total is within the limit: each eviction
calls the owner's ``evict`` callback, which frees what it can (a result is dropped; a log
history keeps only what a reader still holds, the rest stays readable from its spill file when
there is one) and returns the bytes it still holds.

**The reserve.** Running entries cannot be evicted, so when they alone fill the budget, evicting
"until it fits" would evict every ended entry — a result the moment it is published, before
any dispatcher could poll it. Ended entries therefore always keep up to ``reserve`` bytes
(a quarter of the limit by default): :meth:`settle` stops once ``total <= limit`` *or* the
ended entries still charged total at most ``reserve``. What is retained stays bounded by
``max(limit, running + reserve)`` (running output is bounded per job by its owner).

Invariants (a Hypothesis state machine checks them): a running entry is never evicted; after
:meth:`settle`, ``total <= limit`` unless the ended entries not yet evicted total at most
``reserve`` (the excess is running, still held, or the reserve); among ended entries every
log history goes before any result, and within a kind the oldest ended goes first. Plain,
synchronous, no clock, no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Literal, TypeAlias

import attrs

Kind: TypeAlias = Literal["result", "log"]
Key: TypeAlias = tuple[Kind, str]
Evict: TypeAlias = Callable[[], int]
"""Free what can be freed; return the bytes still held."""

DEFAULT_BUDGET = 1 << 30
"""1 GiB: results and log histories of every job together (a 24 GiB box keeps 23 for work)."""
MIN_BUDGET = 1 << 20
EVICTION_ORDER: tuple[Kind, ...] = ("log", "result")
"""Which ended entries go first: a log history (a tail then reads it from its spill file, or
is told what it missed) costs less than a result (its job then answers ``result evicted``)."""
RESERVE_DIVISOR = 4
"""The default reserve: ended entries keep up to ``limit // 4`` whatever runs."""

_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4}


def parse_size(text: str) -> int:
    """``"512MiB"``, ``"1GiB"``, ``"2G"``, ``"1500000"`` → bytes. Binary (``KiB``…``TiB``)
    and decimal (``KB``/``K``…``TB``/``T``) units. Raises ``ValueError`` with a clear message."""
    m = _SIZE.fullmatch(text)
    if m is None:
        raise ValueError(f"expected a size such as 512MiB, 1GiB or 2000000000, got {text!r}")
    number, unit = m.group(1), (m.group(2) or "").lower()
    if unit.endswith("ib") or (len(unit) == 2 and unit[1] == "i"):
        scale = 1 << (10 * "kmgt".index(unit[0]) + 10)
    else:
        scale = _UNITS[unit[:1] if unit not in ("", "b") else unit]
    value = int(float(number) * scale) if "." in number else int(number) * scale
    if value > 1 << 50:
        raise ValueError(f"size out of range (at most 1PiB), got {text!r}")
    return value


def check_budget(value: int) -> int:
    if value < MIN_BUDGET:
        raise ValueError(f"memory budget must be at least 1MiB, got {value} bytes")
    return value


def format_size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"


@attrs.define
class _Entry:
    size: int
    evict: Evict
    ended_seq: int | None = None
    """When it ended (a sequence number); ``None`` while its job runs."""
    evicted: bool = False


@attrs.define
class Evicted:
    """Totals of what :meth:`MemoryBudget.settle` evicted, by kind (for metrics)."""

    entries: dict[str, int] = attrs.Factory(lambda: {"result": 0, "log": 0})
    nbytes: dict[str, int] = attrs.Factory(lambda: {"result": 0, "log": 0})


class MemoryBudget:
    """Byte accounting with a ceiling; evicts the oldest ended entries first. Synchronous."""

    def __init__(self, limit: int = DEFAULT_BUDGET, *, reserve: int | None = None) -> None:
        if limit < 0:
            raise ValueError("memory budget must be >= 0")
        self.limit = limit
        self.reserve = limit // RESERVE_DIVISOR if reserve is None else max(0, reserve)
        """Bytes ended entries may always keep, even while running ones fill the limit."""
        self._ended_total = 0
        """Sizes of the entries in ``_ended`` (ended, not evicted)."""
        self.total = 0
        self.peak = 0
        self.evicted = Evicted()
        self._entries: dict[Key, _Entry] = {}
        self._ended: dict[Kind, dict[Key, None]] = {kind: {} for kind in EVICTION_ORDER}
        """Per kind, ended and not evicted, in end order (oldest first)."""
        self._seq = 0

    # -- queries ---------------------------------------------------------------------------
    def size(self, key: Key) -> int:
        entry = self._entries.get(key)
        return 0 if entry is None else entry.size

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def is_evicted(self, key: Key) -> bool:
        entry = self._entries.get(key)
        return entry is not None and entry.evicted

    def retained(self) -> dict[str, int]:
        """Bytes charged now, by kind."""
        out = {"result": 0, "log": 0}
        for (kind, _), entry in self._entries.items():
            out[kind] += entry.size
        return out

    # -- updates ---------------------------------------------------------------------------
    def charge(self, key: Key, size: int, evict: Evict | None = None) -> None:
        """Set ``key``'s size (creating it, running, with ``evict`` as its callback)."""
        if size < 0:
            raise ValueError("size must be >= 0")
        entry = self._entries.get(key)
        if entry is None:
            if evict is None:
                raise ValueError(f"{key}: a new entry needs an evict callback")
            entry = self._entries[key] = _Entry(0, evict)
        elif evict is not None:
            entry.evict = evict
        if key in self._ended[key[0]]:
            self._ended_total += size - entry.size
        self.total += size - entry.size
        entry.size = size
        self.peak = max(self.peak, self.total)

    def end(self, key: Key) -> None:
        """``key``'s job ended: from now on its entry may be evicted (no-op if unknown)."""
        entry = self._entries.get(key)
        if entry is None or entry.ended_seq is not None:
            return
        self._seq += 1
        entry.ended_seq = self._seq
        if not entry.evicted:
            self._ended[key[0]][key] = None
            self._ended_total += entry.size

    def release(self, key: Key) -> None:
        """Forget ``key`` (its owner dropped it: TTL, pruning)."""
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.total -= entry.size
            if key in self._ended[key[0]]:
                del self._ended[key[0]][key]
                self._ended_total -= entry.size

    def settle(self) -> list[Key]:
        """Evict ended entries — log histories first, then results; oldest end first within a
        kind — until ``total <= limit`` or what ended entries still hold is within the
        reserve. Returns them."""
        done: list[Key] = []
        while self.total > self.limit and self._ended_total > self.reserve:
            key = self._next_victim()
            if key is None:
                break
            del self._ended[key[0]][key]
            entry = self._entries[key]
            before = entry.size
            self._ended_total -= before
            left = max(0, min(entry.evict(), before))
            entry.evicted = True
            self.total -= before - left
            entry.size = left
            self.evicted.entries[key[0]] += 1
            self.evicted.nbytes[key[0]] += before - left
            done.append(key)
        return done

    def _next_victim(self) -> Key | None:
        for kind in EVICTION_ORDER:
            ended = self._ended[kind]
            if ended:
                return next(iter(ended))
        return None


__all__ = [
    "DEFAULT_BUDGET",
    "EVICTION_ORDER",
    "MIN_BUDGET",
    "RESERVE_DIVISOR",
    "Evict",
    "Evicted",
    "Key",
    "Kind",
    "MemoryBudget",
    "check_budget",
    "format_size",
    "parse_size",
]
