"""The footprint store (node.md §4): measured VRAM peaks per (family, quant, task).

(Over 500 lines: the record rule, the Go-compatible file format and the locked atomic store are one
file contract (node.md §4).)

Two layers:

* :class:`FootprintTable`, a plain synchronous value holder with no I/O and no clock: the
  record rule (§4.1: non-positive dropped, max-keep, ×margin, rounded half away from zero to
  0.1), the max-merge and the wire listing. Merging is a join — every field is the max of the
  two records — so it is commutative, associative and idempotent, and an advertised value never
  decreases.
* :class:`FootprintStore`, the file-backed trio shell. Disk I/O runs in a worker thread behind a
  :class:`trio.CapacityLimiter`. Every record, **under an exclusive ``flock`` on the store's
  directory**, reads and merges the disk copy first, then writes the merged table atomically
  (temp file, fsync, rename, fsync of the directory). So records written by another process
  are never lost (this fixes upstream's lost update, §11 D).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import math
import os
import re
import stat
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

import attrs
import trio

from fleet_trio.inputs import ID_MAX_LEN, InputError, loads_json, printable

log = logging.getLogger(__name__)

DEFAULT_MARGIN = 1.2
"""CONTRACT v2's multiplier; v2.1 uses 1.0 (§12)."""
FILE_NAME = "footprints.json"
TEMP_PREFIX = ".footprints-"
TEMP_SUFFIX = ".tmp"
MAX_FILE_BYTES = 4 << 20
"""The largest footprint file read (4 MiB, some 20,000 records); a larger one is corrupt."""
MAX_GB = 1_000_000.0
"""The largest peak a record may hold (GiB); larger, negative or non-finite is corrupt."""
MAX_SAMPLES = (1 << 63) - 1
FILE_MAX_DEPTH = 8
"""The file is an array of flat objects (depth 2); anything nested deeper is corrupt."""


class FootprintFileError(ValueError):
    """The footprint file's text is not a valid store (bad JSON, wrong types, bad time)."""


# ----------------------------------------------------------------------------------------------
# values


@attrs.frozen(order=True)
class FootprintKey:
    """(``model_family``, ``quant``, ``task_type``). ``""`` quant means "node default"."""

    family: str
    quant: str = ""
    task: str = ""


@attrs.frozen
class FootprintEntry:
    """One advertised footprint, as health lists it (§2.2, §4.6)."""

    model_family: str
    quant: str
    task_type: str
    vram_peak_gb: float

    def to_wire(self) -> dict[str, Any]:
        """The wire object: ``quant`` and ``task_type`` are absent when empty, never ``""``."""
        out: dict[str, Any] = {"model_family": self.model_family}
        if self.quant:
            out["quant"] = self.quant
        if self.task_type:
            out["task_type"] = self.task_type
        out["vram_peak_gb"] = self.vram_peak_gb
        return out


@attrs.frozen
class FootprintRecord:
    """One stored record (§4.2). ``updated_ns`` is nanoseconds since the Unix epoch (UTC)."""

    key: FootprintKey
    vram_peak_gb: float = 0.0
    observed_peak_gb: float = 0.0
    samples: int = 0
    updated_ns: int = 0

    def entry(self) -> FootprintEntry:
        return FootprintEntry(self.key.family, self.key.quant, self.key.task, self.vram_peak_gb)

    def join(self, other: FootprintRecord) -> FootprintRecord:
        """The field-wise max of two records of the same key (the merge rule)."""
        if other == self:
            return self
        return FootprintRecord(
            key=self.key,
            vram_peak_gb=max(self.vram_peak_gb, other.vram_peak_gb),
            observed_peak_gb=max(self.observed_peak_gb, other.observed_peak_gb),
            samples=max(self.samples, other.samples),
            updated_ns=max(self.updated_ns, other.updated_ns),
        )


def round_tenth(value: float) -> float:
    """``round(v × 10) / 10`` with ties away from zero (Go's ``math.Round``), §4.1."""
    scaled = Decimal(value * 10).quantize(Decimal(1), rounding=ROUND_HALF_UP)
    return float(scaled) / 10


def advertised(observed: float, margin: float = DEFAULT_MARGIN) -> float:
    """The advertised value for an observed peak: ``round_tenth(observed × margin)``."""
    return round_tenth(observed * margin)


# ----------------------------------------------------------------------------------------------
# the sync core


class FootprintTable:
    """The invariant-bearing table: max-keep records, ×margin, join-merge. No I/O, no clock."""

    def __init__(
        self, margin: float = DEFAULT_MARGIN, records: Iterable[FootprintRecord] = ()
    ) -> None:
        if not math.isfinite(margin) or margin <= 0:
            raise ValueError(f"footprint margin must be a positive number, got {margin!r}")
        self.margin = margin
        self._records: dict[FootprintKey, FootprintRecord] = {}
        self.merge(records)

    def copy(self) -> FootprintTable:
        return FootprintTable(self.margin, self._records.values())

    def records(self) -> list[FootprintRecord]:
        """Every record (including never-advertised ones), sorted by key."""
        return [self._records[k] for k in sorted(self._records)]

    def get(self, key: FootprintKey) -> FootprintRecord | None:
        return self._records.get(key)

    def __len__(self) -> int:
        return len(self._records)

    def observe(self, key: FootprintKey, observed: float, now_ns: int) -> FootprintRecord | None:
        """Fold one observation in (§4.1). ``None`` (and no change) when it is ≤ 0 or not finite."""
        if not math.isfinite(observed) or observed <= 0:
            return None
        old = self._records.get(key, FootprintRecord(key))
        observed_peak = old.observed_peak_gb
        vram_peak = old.vram_peak_gb
        if observed > observed_peak:
            observed_peak = observed
            # max(): with one margin this is plain §4.1; it only matters when a record merged
            # from a writer with a larger margin already advertises more (never decrease).
            vram_peak = max(vram_peak, advertised(observed, self.margin))
        rec = FootprintRecord(
            key=key,
            vram_peak_gb=vram_peak,
            observed_peak_gb=observed_peak,
            samples=old.samples + 1,
            updated_ns=max(old.updated_ns, now_ns),
        )
        self._records[key] = rec
        return rec

    def merge(self, records: Iterable[FootprintRecord]) -> bool:
        """Join ``records`` in (field-wise max per key). True when anything changed."""
        changed = False
        for rec in records:
            old = self._records.get(rec.key)
            new = rec if old is None else old.join(rec)
            if new != old:
                self._records[rec.key] = new
                changed = True
        return changed

    def entries(self) -> list[FootprintEntry]:
        """Advertised entries (``vram_peak_gb`` > 0), sorted by (family, quant, task)."""
        return [r.entry() for r in self.records() if r.vram_peak_gb > 0]

    def families(self) -> list[str]:
        """The distinct families of the advertised entries, sorted."""
        return sorted({e.model_family for e in self.entries()})

    def to_json(self) -> str:
        return dump_records(self.records())


# ----------------------------------------------------------------------------------------------
# the file format (§4.2)

_GO_ESCAPES = {
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}
_RFC3339 = re.compile(
    r"^(\d{4})-(\d\d)-(\d\d)[Tt](\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?([Zz]|[+-]\d\d:\d\d)$"
)
_NS = 1_000_000_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def go_string(value: str) -> str:
    """A JSON string as Go's encoder writes it (HTML-safe escapes, UTF-8 kept)."""
    text = json.dumps(value, ensure_ascii=False)
    for raw, esc in _GO_ESCAPES.items():
        text = text.replace(raw, esc)
    return text


def go_float(value: float) -> str:
    """A JSON number as Go's ``encoding/json`` writes a float64 (``7`` not ``7.0``)."""
    if not math.isfinite(value):
        raise ValueError(f"cannot encode {value!r} as JSON")
    text = repr(float(value))
    if "e" in text and 1e-6 <= abs(value) < 1e21:
        text = format(Decimal(text), "f")
    if text.endswith(".0"):
        text = text[:-2]
    return text


def format_time_ns(ns: int) -> str:
    """RFC 3339 UTC, Go style: fraction up to 9 digits with trailing zeros dropped."""
    seconds, frac = divmod(ns, _NS)
    t = _EPOCH + timedelta(seconds=seconds)
    text = f"{t.year:04d}-{t.month:02d}-{t.day:02d}T{t.hour:02d}:{t.minute:02d}:{t.second:02d}"
    if frac:
        text += "." + f"{frac:09d}".rstrip("0")
    return text + "Z"


def parse_time_ns(text: str) -> int:
    """Parse an RFC 3339 timestamp to ns since the epoch; :class:`FootprintFileError` if bad."""
    m = _RFC3339.match(text)
    if m is None:
        raise FootprintFileError(f"bad updated time {text!r}")
    year, month, day, hour, minute, sec = (int(g) for g in m.groups()[:6])
    frac = int((m.group(7) or "").ljust(9, "0") or 0)
    zone = m.group(8)
    try:
        base = datetime(year, month, day, hour, minute, sec, tzinfo=UTC)
    except ValueError as exc:
        raise FootprintFileError(f"bad updated time {text!r}") from exc
    offset = 0
    if zone not in ("Z", "z"):
        sign = 1 if zone[0] == "+" else -1
        offset = sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    delta = base - _EPOCH
    whole = delta.days * 86400 + delta.seconds - offset
    return whole * _NS + frac


_ZERO_TIME_NS = parse_time_ns("0001-01-01T00:00:00Z")
"""Go's zero ``time.Time``: what an absent ``updated`` reads as."""


def dump_records(records: Iterable[FootprintRecord]) -> str:
    """The file text: a 2-space pretty-printed array, sorted, no trailing newline (§4.2)."""
    items: list[str] = []
    for rec in sorted(records, key=lambda r: r.key):
        members = [f'"model_family": {go_string(rec.key.family)}']
        if rec.key.quant:
            members.append(f'"quant": {go_string(rec.key.quant)}')
        if rec.key.task:
            members.append(f'"task_type": {go_string(rec.key.task)}')
        members.append(f'"vram_peak_gb": {go_float(rec.vram_peak_gb)}')
        members.append(f'"observed_peak_gb": {go_float(rec.observed_peak_gb)}')
        members.append(f'"samples": {rec.samples}')
        members.append(f'"updated": {go_string(format_time_ns(rec.updated_ns))}')
        items.append("  {\n" + ",\n".join("    " + m for m in members) + "\n  }")
    if not items:
        return "[]"
    return "[\n" + ",\n".join(items) + "\n]"


def _str_member(obj: Mapping[str, Any], name: str) -> str:
    value = obj.get(name, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise FootprintFileError(f"{name} must be a string")
    if len(value) > ID_MAX_LEN or not value.isprintable():
        raise FootprintFileError(
            f"{name} must be at most {ID_MAX_LEN} printable characters, "
            f"got {printable(value, limit=64)!r}"
        )
    return value


def _num_member(obj: Mapping[str, Any], name: str, high: float = MAX_GB) -> float:
    value = obj.get(name, 0)
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FootprintFileError(f"{name} must be a number")
    if not 0 <= value <= high:  # also NaN (no JSON spells it; a caller's data might)
        raise FootprintFileError(f"{name} out of range (0 to {high:g}): {str(value)[:32]}")
    return float(value)


def parse_records(text: str | bytes) -> list[FootprintRecord]:
    """Parse the file text. Tolerant of missing members; last duplicate key wins (§4.2).

    Raises :class:`FootprintFileError` for invalid JSON, nesting deeper than
    :data:`FILE_MAX_DEPTH`, wrong member types, a non-finite or out-of-range number, a string
    that is not a short printable text, or an unparseable ``updated`` (upstream treats the
    whole file as corrupt then). Nothing else escapes.
    """
    try:
        data = loads_json(text, max_depth=FILE_MAX_DEPTH)
    except InputError as exc:
        raise FootprintFileError(str(exc)) from None
    if data is None:
        return []  # Go decodes a JSON null into an empty slice
    if not isinstance(data, list):
        raise FootprintFileError("the footprint file must hold a JSON array")
    by_key: dict[FootprintKey, FootprintRecord] = {}
    for item in data:
        if not isinstance(item, dict):
            raise FootprintFileError("each footprint must be a JSON object")
        key = FootprintKey(
            _str_member(item, "model_family"),
            _str_member(item, "quant"),
            _str_member(item, "task_type"),
        )
        samples = _num_member(item, "samples", MAX_SAMPLES)
        if samples != int(samples) or samples > MAX_SAMPLES:
            raise FootprintFileError("samples must be an integer")
        updated = item.get("updated")
        if updated is None:
            updated_ns = _ZERO_TIME_NS
        elif isinstance(updated, str):
            updated_ns = parse_time_ns(updated)
        else:
            raise FootprintFileError("updated must be a string")
        by_key[key] = FootprintRecord(
            key=key,
            vram_peak_gb=_num_member(item, "vram_peak_gb"),
            observed_peak_gb=_num_member(item, "observed_peak_gb"),
            samples=int(samples),
            updated_ns=updated_ns,
        )
    return list(by_key.values())


# ----------------------------------------------------------------------------------------------
# file I/O (thread side: every function below blocks)

FileSig = tuple[int, int, int, int]
"""(device, inode, size, mtime_ns): a rename-replaced file always gets a new inode."""


def _sig(st: os.stat_result) -> FileSig:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def read_file(path: str) -> tuple[list[FootprintRecord], FileSig] | None:
    """Read and parse; ``None`` when the file does not exist.

    Raises :class:`OSError` or :class:`FootprintFileError` (and nothing else): the path must be
    a regular file of at most :data:`MAX_FILE_BYTES` (a FIFO, a device such as ``/dev/zero``
    or a directory is refused without reading, and the open never blocks).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FootprintFileError("not a regular file")
        if st.st_size > MAX_FILE_BYTES:
            raise FootprintFileError(f"larger than {MAX_FILE_BYTES} bytes ({st.st_size})")
        sig = _sig(st)
        chunks = []
        size = 0
        while chunk := os.read(fd, 1 << 16):
            size += len(chunk)
            if size > MAX_FILE_BYTES:  # grew while being read
                raise FootprintFileError(f"larger than {MAX_FILE_BYTES} bytes")
            chunks.append(chunk)
    finally:
        os.close(fd)
    return parse_records(b"".join(chunks)), sig


def _not_regular(path: str) -> bool:
    """True when ``path`` exists and is not a regular file (nothing is written over it; a
    symbolic link is not one: it is left alone, never replaced nor followed)."""
    try:
        return not stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def resolve_path(path: str) -> str:
    """``~`` expanded, made absolute (a later ``chdir`` does not move the store)."""
    return os.path.abspath(os.path.expanduser(path))


def stat_sig(path: str) -> FileSig | None:
    try:
        return _sig(os.stat(path))
    except OSError:
        return None


@contextlib.contextmanager
def dir_lock(directory: str) -> Iterator[None]:
    """An exclusive ``flock`` on the directory itself (no lock file left behind)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def write_atomic(path: str, text: str) -> FileSig:
    """Temp file in the same directory, fsync, rename over ``path``, fsync the directory."""
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, suffix=TEMP_SUFFIX, dir=directory)
    try:
        try:
            os.fchmod(fd, 0o644)
            data = text.encode("utf-8")
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(directory)
    st = os.stat(path)
    return _sig(st)


def _fsync_dir(directory: str) -> None:
    try:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EROFS):
            raise
    finally:
        os.close(dfd)


def _record_locked(
    path: str, table: FootprintTable, key: FootprintKey, observed: float, now_ns: int
) -> tuple[FootprintTable, FootprintRecord | None, FileSig | None]:
    """Thread side of :meth:`FootprintStore.record`: lock, merge disk, observe, write, unlock.

    Works on ``table`` (a private copy). Returns it with the new record and the written file's
    signature (``None`` when persisting failed; the in-memory observation stands, §4.1 step 6).
    """
    directory = os.path.dirname(path) or "."
    rec: FootprintRecord | None = None
    try:
        if _not_regular(path):
            raise OSError(errno.EINVAL, "not a regular file; not writing over it")
        os.makedirs(directory, mode=0o755, exist_ok=True)
        with dir_lock(directory):
            try:
                loaded = read_file(path)
            except (OSError, FootprintFileError) as exc:
                log.warning("footprints: ignoring unreadable %s while recording: %s", path, exc)
                loaded = None
            if loaded is not None:
                table.merge(loaded[0])
            rec = table.observe(key, observed, now_ns)
            sig = write_atomic(path, table.to_json())
            return table, rec, sig
    except OSError as exc:
        log.warning("footprints: could not persist %s: %s", path, exc)
        if rec is None:
            rec = table.observe(key, observed, now_ns)
        return table, rec, None


# ----------------------------------------------------------------------------------------------
# the trio shell


class FootprintStore:
    """A file-backed footprint store (node.md §4), safe across tasks and across processes."""

    def __init__(
        self,
        path: str,
        table: FootprintTable,
        *,
        limiter: trio.CapacityLimiter | None = None,
        seen: FileSig | None = None,
    ) -> None:
        self.path = path
        self.table = table
        self.limiter = limiter if limiter is not None else trio.CapacityLimiter(1)
        self._seen = seen
        self._refused: FileSig | None = None
        """The signature of the last file version refused as corrupt (warned about once)."""
        self._lock = trio.Lock()

    @property
    def margin(self) -> float:
        return self.table.margin

    @classmethod
    async def open(
        cls,
        path: str,
        *,
        margin: float = DEFAULT_MARGIN,
        limiter: trio.CapacityLimiter | None = None,
    ) -> FootprintStore:
        """Load ``path`` (§4.4): missing → empty silently; unreadable, corrupt, not a regular
        file or over :data:`MAX_FILE_BYTES` → empty plus one warning; never raises for the
        file's sake."""
        path = resolve_path(path)
        table = FootprintTable(margin)
        store = cls(path, table, limiter=limiter)
        try:
            loaded = await trio.to_thread.run_sync(read_file, path, limiter=store.limiter)
        except (OSError, FootprintFileError) as exc:
            log.warning("footprints: starting empty, could not load %s: %s", path, exc)
            store._refused = stat_sig(path)
            return store
        if loaded is not None:
            table.merge(loaded[0])
            store._seen = loaded[1]
        return store

    async def record(self, key: FootprintKey, observed_gib: float) -> FootprintEntry | None:
        """Fold one observed peak (GiB) in and persist (§4.1, §4.3).

        Non-positive (or non-finite) observations are dropped: ``None``, no write. Otherwise
        the disk copy is merged first under the directory lock, so another process's records
        survive. Returns the key's entry as it now stands.
        """
        if not math.isfinite(observed_gib) or observed_gib <= 0:
            return None
        async with self._lock:
            now_ns = time.time_ns()
            work = self.table.copy()
            work, rec, sig = await trio.to_thread.run_sync(
                _record_locked, self.path, work, key, observed_gib, now_ns, limiter=self.limiter
            )
            self.table.merge(work.records())
            if sig is not None:
                self._seen = sig
        current = self.table.get(key)
        assert rec is not None and current is not None
        return current.entry()

    async def reload_if_changed(self) -> bool:
        """Merge the file in if it changed since the last load (§4.5). True if memory changed.

        The gate is the file's identity (device, inode, size, mtime): every atomic write is a
        new inode, so two writes within one mtime tick are both seen. The gate advances only
        after a successful parse (§11 B). A corrupt file (or one that is not a regular file)
        keeps the last good table: one warning per version of the file, which is not read
        again until it changes.
        """
        # One stat, inline: health calls this on every request and must never queue behind a
        # record's fsync on the store's limiter. Only a changed file is read in a thread.
        sig = stat_sig(self.path)
        if sig is None or sig == self._seen or sig == self._refused:
            await trio.lowlevel.checkpoint()
            return False
        try:
            loaded = await trio.to_thread.run_sync(read_file, self.path, limiter=self.limiter)
        except (OSError, FootprintFileError) as exc:
            self._refused = sig
            log.warning(
                "footprints: keeping the last good table, could not load %s: %s", self.path, exc
            )
            return False
        if loaded is None:
            return False
        records, seen = loaded
        changed = self.table.merge(records)
        self._seen = seen
        return changed

    def entries(self) -> list[FootprintEntry]:
        """Advertised entries in wire order (§4.6)."""
        return self.table.entries()

    def families(self) -> list[str]:
        return self.table.families()

    def get(self, key: FootprintKey) -> FootprintRecord | None:
        return self.table.get(key)


def default_store_path() -> str:
    """``~/.local-offload/footprints.json`` (§4.7); ``$HOME`` fallback handled by expanduser."""
    return os.path.join(os.path.expanduser("~"), ".local-offload", FILE_NAME)


__all__ = [
    "DEFAULT_MARGIN",
    "FILE_NAME",
    "MAX_FILE_BYTES",
    "FootprintEntry",
    "FootprintFileError",
    "FootprintKey",
    "FootprintRecord",
    "FootprintStore",
    "FootprintTable",
    "advertised",
    "default_store_path",
    "dump_records",
    "format_time_ns",
    "go_float",
    "parse_records",
    "parse_time_ns",
    "round_tenth",
]
