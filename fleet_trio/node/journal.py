"""The node's job journal: every ack, state change and result, in SQLite, for restarts.

(Over 500 lines: the journal's schema, its reader and its batching writer must agree on every row;
they are read together.)

Polls read the in-memory :class:`~fleet_trio.node.jobs.JobTable`; the journal is only read at
startup (:mod:`fleet_trio.node.recovery`). What the HTTP surface shows is written here first:
the store submits a record and makes the change visible in the commit's callback.

- :class:`Journal` is the blocking part: one ``sqlite3`` connection (standard library), WAL
  mode, ``locking_mode=EXCLUSIVE`` (a second node on the same file fails at startup instead of
  sharing it), ``synchronous=NORMAL`` by default (a commit survives a crash of the process —
  ``kill -9`` — but not a power cut; ``synchronous: full`` survives both at the cost of an
  ``fsync`` per commit). Results larger than ``inline_max`` bytes live in files in the folder
  ``<journal>.results`` beside it, not in the database and not in RAM.
- **Identity**: the journal records a random journal id, the node id and the absolute path it
  was created at (``meta``). At :meth:`Journal.open` a journal whose recorded path is not its
  path is a *copy* (a copied state folder, a restored backup elsewhere): its jobs are dropped and
  it takes a new work tag, so the recovery never sweeps or removes anything of the original
  (:attr:`Journal.copied`). The running node holds the device and inode of the file and of its
  ``-wal`` and checks them before and after each commit batch and on a timer
  (:meth:`Journal.verify`): deleted, replaced or moved, the journal is *lost* — it saves what
  it holds (:meth:`Journal._salvage`) and never writes again (:class:`JournalLost`).
- :class:`JournalWriter` is the trio shell: one task (in the services scope) that takes every
  record submitted since its last commit and writes them in one transaction (a group commit)
  through ``trio.to_thread.run_sync`` with a limiter of one, then runs the submitters' callbacks
  in order. Concurrent acks therefore share one commit.

A submission may carry a *veto*, asked when its batch is taken for the commit: an ack whose
client is gone or whose request is past ``ack_deadline`` is dropped then, never written
(:class:`Vetoed`; docs/node.md "Delivery-checked acks").

The records are small frozen values (:class:`Accept`, :class:`Start`, :class:`Finish`,
:class:`Evict`, :class:`Drop`, :class:`Withdraw`: an ack taken back); the journal enforces
the table's rules too (``done``/``error`` are write-once; ``running`` only from ``accepted``),
so a replay cannot disagree with what was shown.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import re
import secrets
import sqlite3
import stat
from collections.abc import Callable, Iterable, Sequence

import attrs
import trio

from fleet_trio.statedir import symlink_problem

log = logging.getLogger(__name__)

SCHEMA_VERSION = "1"
DEFAULT_INLINE_MAX = 64 * 1024
"""Results larger than this (bytes) are kept in a file beside the journal, not in RAM."""
SYNC_MODES = ("normal", "full")
WORK_TAG = re.compile(r"[0-9a-f]{12}")
"""A node's work-dir tag (``meta.work_tag``): 12 hex digits, made when the journal is created.
Its jobs' work dirs are ``fleet-job-<tag>-…``, so a restarted node finds every dir its
predecessor made — also those of acks that never committed — and no other node's."""

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS jobs ("
    " job_id TEXT PRIMARY KEY,"
    " state TEXT NOT NULL,"
    " data BLOB,"
    " data_file TEXT,"
    " error TEXT,"
    " work_dir TEXT NOT NULL DEFAULT '',"
    " accepted_wall REAL NOT NULL,"
    " terminal_wall REAL)",
)


class JournalError(Exception):
    """The journal cannot be opened or written (one line, naming the file)."""


class Vetoed(JournalError):
    """A submission dropped before its commit because its ``veto`` gave a reason (nothing of
    it was written): an ack whose client is gone, or whose request is past ``ack_deadline``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class JournalLost(JournalError):
    """The journal's file (or its ``-wal``) is no longer the one this node opened: deleted,
    replaced or moved while the node ran. Permanent for this run: nothing more is written (a
    write would go to an unlinked file and be lost at the next crash). The message is the one
    ERROR line the node logs (what happened, where its content was saved)."""


JOURNAL_LOST = "journal lost"
"""The 503 message of health and dispatch once the journal is lost (:class:`JournalLost`)."""

IDENTITY_CHECK_INTERVAL = 2.0
"""Seconds between two checks of the journal's identity while no commit comes (a commit batch
checks it too, before and after)."""


@attrs.frozen
class Identity:
    """Who a journal belongs to (its ``meta`` rows ``journal_id``, ``node_id``, ``path``)."""

    journal_id: str
    node_id: str
    path: str


@attrs.frozen
class Copied:
    """:meth:`Journal.open` found a copy: the identity it recorded (the original's) and how
    many jobs were dropped with it."""

    original: Identity
    jobs: int

    def describe(self, path: str, tag: str) -> str:
        node = f" by node {self.original.node_id!r}" if self.original.node_id else ""
        return (
            f"journal {path}: a copy of journal {self.original.journal_id} "
            f"(created at {self.original.path}{node}): its {self.jobs} job(s) were another "
            f"node's and are dropped, and it takes a new work tag {tag}; no process or work "
            "dir of the original is swept or removed (a state folder moved here with the node "
            "stopped is no copy: start its node with --journal-moved the first time)"
        )


class ResultLost(Exception):
    """A large result's file is missing, empty or torn (not JSON): a power cut under
    ``sync: normal``, a disk error, or somebody else's hand. The message says which; the job
    answers ``error: "result lost: <message>"``."""


RESULT_LOST = "result lost: "
"""The error text's prefix of a job whose result file was lost (:class:`ResultLost`)."""


def result_problem(data: bytes, *, parse: bool = True) -> str | None:
    """Why ``data``, read from a result file, cannot be the job's result, or ``None``.

    Every result the node keeps is one JSON object (a ``done`` job's stdout): empty bytes, a
    NUL byte (blocks a power cut left zero-filled; JSON text never holds one) or text that is
    not JSON is a torn file. ``parse=False`` (a restart, which reads every file) checks the
    shape only — non-empty, no NUL, ``{`` … ``}`` — at the speed of a read; a poll parses."""
    body = data.strip()
    if not body:
        return "result file empty"
    if (nul := data.find(b"\0")) >= 0:
        return f"result file torn (zero-filled at byte {nul})"
    if not parse:
        if body[:1] != b"{" or body[-1:] != b"}":
            return "result file torn (cut short)"
        return None
    try:
        json.loads(data)
    except RecursionError:
        return None  # deep but whole: it was checked when the job made it
    except ValueError as exc:
        at = f" at byte {exc.pos}" if isinstance(exc, json.JSONDecodeError) else ""
        return f"result file torn (invalid JSON{at})"
    return None


@attrs.frozen
class Accept:
    job_id: str
    wall: float
    work_dir: str = ""


@attrs.frozen
class Start:
    job_id: str


@attrs.frozen
class Finish:
    job_id: str
    state: str
    """``done`` or ``error``."""
    wall: float
    data: bytes | None = None
    """Inline result (``done`` only); ``None`` when it went to ``data_file`` or is absent."""
    error: str | None = None
    data_file: str | None = None
    """A large result: written to this file (under the results folder) before the commit."""
    file_data: bytes | None = None
    """The bytes written to ``data_file`` (not stored in the database)."""


@attrs.frozen
class Evict:
    job_id: str
    data_file: str | None = None


@attrs.frozen
class Withdraw:
    """An ack committed, then withdrawn before its job started (its client was gone before the
    202 could reach it; docs/node.md "Delivery-checked acks"): the id is unknown again. Only an
    ``accepted`` row goes; a later ``Accept`` of the same id is a new job."""

    job_id: str


@attrs.frozen
class Drop:
    """A ``done`` job's result was dropped (the memory budget, or its file was lost): it
    becomes ``error`` with ``error``, so a restart answers what polls were answered."""

    job_id: str
    error: str


Record = Accept | Start | Finish | Evict | Drop | Withdraw
Statement = tuple[str, list[object]]
"""One SQL statement and its parameters."""


@attrs.frozen
class Row:
    """One job as the journal holds it."""

    job_id: str
    state: str
    data: bytes | None
    data_file: str | None
    error: str | None
    work_dir: str
    accepted_wall: float
    terminal_wall: float | None

    @property
    def terminal(self) -> bool:
        return self.state in ("done", "error")


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0] if text else type(exc).__name__


class Journal:
    """The blocking SQLite side. Call every method from one thread at a time."""

    def __init__(
        self,
        path: str,
        *,
        inline_max: int = DEFAULT_INLINE_MAX,
        sync: str = "normal",
        max_pages: int | None = None,
        node_id: str | None = None,
        moved: bool = False,
    ) -> None:
        if sync not in SYNC_MODES:
            raise ValueError(f"sync must be one of {', '.join(SYNC_MODES)}, got {sync!r}")
        self.path = path
        self.inline_max = inline_max
        self.sync = sync
        self.max_pages = max_pages
        """Test hook: ``PRAGMA max_page_count`` (makes "database or disk is full" reachable)."""
        self.results_dir = "" if path == ":memory:" else path + ".results"
        self.work_tag = ""
        """This node's work-dir tag (:data:`WORK_TAG`), read at :meth:`open`."""
        self.previous_work_root: str | None = None
        """The folder the previous run made its work dirs in (``meta.work_root``)."""
        self.node_id = node_id
        """The running node's id, recorded in the journal (``None``: not recorded, not
        compared)."""
        self.identity: Identity | None = None
        """This journal's identity, once open (``None`` in memory)."""
        self.copied: Copied | None = None
        """Set by :meth:`open` when the file was a copy of another journal (see the module)."""
        self.migrated = False
        """Set by :meth:`open` when an older journal got its identity record now."""
        self.renamed_from: str | None = None
        """Set by :meth:`open` when the journal was recorded under another node id."""
        self.moved = moved
        """``--journal-moved``: a journal recorded at another path was *moved* here by its
        operator (the node stopped), not copied: it stays this node's, jobs and tag."""
        self.moved_from: str | None = None
        """Set by :meth:`open` when a moved journal's recorded path was updated."""
        self.lost: str | None = None
        """Why the journal is lost (the ERROR line), once :meth:`verify` found it so."""
        self._main: tuple[int, int] | None = None
        self._wal: tuple[int, int] | None = None
        self._db: sqlite3.Connection | None = None

    # -- opening -------------------------------------------------------------------------------
    def open(self) -> None:
        """Open (creating it if needed), take the exclusive lock, check it. Raises
        :class:`JournalError` with a one-line reason: not a regular file, unwritable folder,
        corrupt file, another process holding it."""
        opened: tuple[int, int] | None = None
        if self.path != ":memory:":
            self._check_path()
            self._private_file()
            opened = _ident(self.path)  # what SQLite opens next; compared once it is open
        try:
            db = sqlite3.connect(
                self.path, timeout=0, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise JournalError(f"journal {self.path}: cannot open: {_describe(exc)}") from None
        try:
            db.execute("PRAGMA locking_mode=EXCLUSIVE")
            mode = db.execute("PRAGMA journal_mode=WAL").fetchone()
            if self.path != ":memory:" and (mode is None or str(mode[0]).lower() != "wal"):
                raise JournalError(f"journal {self.path}: cannot switch to WAL mode ({mode})")
            db.execute(f"PRAGMA synchronous={self.sync.upper()}")
            if self.max_pages is not None:
                db.execute(f"PRAGMA max_page_count={int(self.max_pages)}")
            db.execute("BEGIN EXCLUSIVE")
            for statement in _SCHEMA:
                db.execute(statement)
            db.execute(
                "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema', ?)", (SCHEMA_VERSION,)
            )
            (version,) = db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
            if version != SCHEMA_VERSION:
                raise JournalError(
                    f"journal {self.path}: schema {version!r}, this node reads {SCHEMA_VERSION!r}"
                )
            self._identify(db)
            db.execute(
                "INSERT OR IGNORE INTO meta (key, value) VALUES ('work_tag', ?)",
                (secrets.token_hex(6),),
            )
            (tag,) = db.execute("SELECT value FROM meta WHERE key = 'work_tag'").fetchone()
            if not isinstance(tag, str) or not WORK_TAG.fullmatch(tag):
                raise JournalError(f"journal {self.path}: bad work tag {tag!r} (not 12 hex)")
            root = db.execute("SELECT value FROM meta WHERE key = 'work_root'").fetchone()
            db.execute("COMMIT")
            self.work_tag = tag
            self.previous_work_root = root[0] if root and isinstance(root[0], str) else None
            check = db.execute("PRAGMA quick_check").fetchone()
            if check is None or check[0] != "ok":
                raise JournalError(f"journal {self.path}: corrupt ({check[0] if check else '?'})")
        except JournalError:
            db.close()
            raise
        except sqlite3.Error as exc:
            db.close()
            text = _describe(exc)
            if "locked" in text or "busy" in text:
                text += " (another fleet-trio node uses this journal?)"
            raise JournalError(f"journal {self.path}: {text}") from None
        if self.results_dir:
            try:
                os.makedirs(self.results_dir, mode=0o700, exist_ok=True)
                _chmod_own_dir(self.results_dir, 0o700)
            except OSError as exc:
                db.close()
                raise JournalError(
                    f"journal {self.path}: cannot create {self.results_dir}: {exc.strerror}"
                ) from None
        if self.path != ":memory:":
            self._main = _ident(self.path)
            self._wal = _ident(self.path + "-wal")
            if self._main is None or self._main != opened:
                db.close()
                what = "gone" if self._main is None else "replaced by another file"
                raise JournalError(f"journal {self.path}: {what} while it was opened")
        self._db = db

    def where(self) -> str:
        """The absolute path recorded in the identity: the folder resolved (two spellings of
        one folder are one journal), the file's own name kept."""
        full = os.path.abspath(self.path)
        return os.path.join(os.path.realpath(os.path.dirname(full)), os.path.basename(full))

    def _identify(self, db: sqlite3.Connection) -> None:
        """Inside :meth:`open`'s transaction: read the identity, write it when missing (a new
        journal, or an older one: migrated, kept as it is); a copy (another recorded path)
        drops its jobs and its work tag and takes an identity of its own."""
        if self.path == ":memory:":
            return
        meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
        here = self.where()
        node = self.node_id if self.node_id is not None else str(meta.get("node_id") or "")
        recorded = meta.get("journal_id")
        if recorded:
            original = Identity(
                str(recorded), str(meta.get("node_id") or ""), str(meta.get("path") or "")
            )
            if original.path != here and self.moved:  # the operator's word: a move
                self.moved_from = original.path
                original = attrs.evolve(original, path=here)
                db.execute("INSERT OR REPLACE INTO meta VALUES ('path', ?)", (here,))
            if original.path == here:
                self.identity = attrs.evolve(original, node_id=node)
                if node and original.node_id and node != original.node_id:
                    self.renamed_from = original.node_id
                if node != original.node_id:
                    db.execute("INSERT OR REPLACE INTO meta VALUES ('node_id', ?)", (node,))
                return
            (jobs,) = db.execute("SELECT count(*) FROM jobs").fetchone()
            self.copied = Copied(original, int(jobs))
            db.execute("DELETE FROM jobs")
            db.execute("DELETE FROM meta WHERE key IN ('work_tag', 'work_root')")
        else:
            self.migrated = "work_tag" in meta  # an older journal: its jobs and tag are its own
        self.identity = Identity(secrets.token_hex(8), node, here)
        db.executemany(
            "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
            [
                ("journal_id", self.identity.journal_id),
                ("node_id", self.identity.node_id),
                ("path", self.identity.path),
            ],
        )

    def _private_file(self) -> None:
        """The journal holds every result: ``0600`` whatever the umask (SQLite gives its
        ``-wal`` and ``-shm`` files the database file's mode). Never through a link."""
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise JournalError(f"journal {self.path}: cannot open: {exc.strerror}") from None
        try:
            os.fchmod(fd, 0o600)
        except OSError:
            pass  # not ours to change (another owner): SQLite still decides
        finally:
            os.close(fd)

    def _check_path(self) -> None:
        folder = os.path.dirname(os.path.abspath(self.path))
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as exc:
            raise JournalError(
                f"journal {self.path}: cannot create its folder: {exc.strerror}"
            ) from None
        # the file, SQLite's siblings and the results folder: never a link (docs/security.md)
        for own in (self.path, *(self.path + s for s in SQLITE_SIBLINGS), self.results_dir):
            if own and (problem := symlink_problem(own)):
                raise JournalError(f"journal {self.path}: {problem}")
        # SQLite's own files: a FIFO or a folder there fails later as "database is locked"
        # or "disk I/O error" (or a read that never returns): a start error naming the file
        for sibling in (self.path + s for s in SQLITE_SIBLINGS):
            try:
                mode = os.lstat(sibling).st_mode
            except OSError:
                continue
            if not stat.S_ISREG(mode):
                raise JournalError(f"journal {self.path}: {sibling} is not a regular file")
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise JournalError(f"journal {self.path}: {exc.strerror}") from None
        if not stat.S_ISREG(st.st_mode):
            raise JournalError(f"journal {self.path}: not a regular file")

    def close(self) -> str | None:
        """Close the connection. A journal found lost now is saved first (the returned line
        says so: log it); SQLite's close deletes ``<journal>-wal`` by its name, so a file
        there that is not this journal's own is kept aside and put back."""
        if self._db is None:
            return None
        found = None
        if self.lost is None:
            try:
                self.verify()
            except JournalLost as exc:
                found = str(exc)
        wal = self.path + "-wal"
        foreign = self._wal is not None and _ident(wal) not in (None, self._wal)
        keep = f"{wal}.{secrets.token_hex(4)}.keep"
        if foreign:
            try:
                os.link(wal, keep)
            except OSError:
                foreign = False
        try:
            self._db.close()
        finally:
            self._db = None
            if foreign:
                with contextlib.suppress(OSError):
                    os.link(keep, wal)
                _unlink(keep)
        return found

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            raise JournalError(f"journal {self.path}: not open")
        return self._db

    # -- identity --------------------------------------------------------------------------------
    def _problem(self) -> str | None:
        """What happened to the journal's file or its ``-wal`` since :meth:`open`, or ``None``."""
        main = _ident(self.path)
        if main != self._main:
            if main is None:
                return "its file was deleted or moved away"
            return "its file was replaced by another file"
        if self._wal is not None:
            wal = _ident(self.path + "-wal")
            if wal != self._wal:
                if wal is None:
                    return "its -wal file was deleted or moved away"
                return "its -wal file was replaced by another file"
        return None

    def verify(self, undo: Sequence[str] = ()) -> None:
        """Check that the journal is still the file this node opened (blocking; two
        ``lstat``). Raises :class:`JournalLost` when it is not — the first time after saving
        what the open connection holds (:meth:`_salvage`); ``undo``: job ids whose ack the
        batch just committed is refused, removed from what is saved."""
        if self.lost is not None:
            raise JournalLost(self.lost)
        if self._db is None or self._main is None:
            return
        problem = self._problem()
        if problem is None:
            return
        try:
            if undo:
                marks = ", ".join(["?"] * len(undo))
                self._db.execute(
                    f"DELETE FROM jobs WHERE state = 'accepted' AND job_id IN ({marks})",
                    list(undo),
                )
            saved = self._salvage()
        except (sqlite3.Error, OSError) as exc:
            saved = f"its content could not be saved ({_describe(exc)})"
        self.lost = (
            f"journal {self.path} lost: {problem} while the node ran; {saved}; health and new "
            f"dispatches answer 503 {JOURNAL_LOST}, running jobs go on (their outcomes are "
            "kept in memory only) and nothing more is written; restart the node"
        )
        raise JournalLost(self.lost)

    def _salvage(self) -> str:
        """Save what the open connection holds (every commit so far) where a restart finds it,
        overwriting nothing: the ``-wal`` alone gone → a checkpoint into the journal's own file;
        the file gone → a copy at its path; the file replaced → a copy at ``<journal>.lost``.
        Our own stale ``-wal`` beside a path that is no longer ours is removed (SQLite would
        replay it into whatever is opened there). Returns the clause for the ERROR line."""
        db = self.db
        wal = self.path + "-wal"
        main = _ident(self.path)
        if main == self._main:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            return "every commit is saved in its file (checkpointed)"
        folder = os.path.dirname(os.path.abspath(self.path))
        tmp = os.path.join(folder, f".{os.path.basename(self.path)}.{secrets.token_hex(4)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        os.close(fd)
        try:
            copy = sqlite3.connect(tmp, isolation_level=None)
            try:
                db.backup(copy)
            finally:
                copy.close()
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            if self._wal is not None and _ident(wal) == self._wal:
                _unlink(wal)
            target = self.path
            if main is not None or _ident(wal) is not None:
                target = self.path + ".lost"
            try:
                os.link(tmp, target)
            except FileExistsError:
                return f"its content could not be saved ({target} exists)"
            _fsync_dir(folder)
        finally:
            _unlink(tmp)
        if target == self.path:
            return f"every commit is saved to a new {target}"
        return f"every commit is saved to {target} (stop the node, then move it to {self.path})"

    def set_meta(self, key: str, value: str) -> None:
        """Write one ``meta`` entry (blocking). Raises :class:`JournalError`."""
        self.verify()
        try:
            self.db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))
        except sqlite3.Error as exc:
            raise JournalError(f"journal {self.path}: write failed: {_describe(exc)}") from None

    # -- files for large results -----------------------------------------------------------
    def result_file(self, job_id: str) -> str | None:
        """Where a large result of ``job_id`` goes (``None``: no folder, keep it inline)."""
        if not self.results_dir:
            return None
        digest = hashlib.sha256(job_id.encode("utf-8", "surrogatepass")).hexdigest()[:40]
        return os.path.join(self.results_dir, digest + ".json")

    def read_result(self, path: str, *, parse: bool = True) -> bytes:
        """A large result's bytes (blocking). Raises :class:`ResultLost` when the file is
        missing, empty or torn (never spliced into a body; :func:`result_problem`), ``OSError``
        when it cannot be read now (another error: a later read may succeed)."""
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            raise ResultLost("result file missing") from None
        if (problem := result_problem(data, parse=parse)) is not None:
            raise ResultLost(problem)
        return data

    def check_result(self, path: str) -> str | None:
        """Why the result file ``path`` is lost, or ``None`` when it looks whole (or cannot be
        read just now: only a missing, empty or torn file is a loss). Blocking; checks the
        shape, not the JSON (a restart reads every file: :func:`result_problem`)."""
        try:
            self.read_result(path, parse=False)
        except ResultLost as exc:
            return str(exc)
        except OSError:
            return None
        return None

    # -- writing ---------------------------------------------------------------------------
    def apply(self, records: Sequence[Record]) -> None:
        """Write ``records`` in one transaction (large results go to their files first).

        A batch that is one SQL statement (the usual ack or burst of acks) runs as that
        statement alone — SQLite makes every statement atomic — rather than between ``BEGIN``
        and ``COMMIT``: each statement releases and retakes the GIL, and on a busy event loop
        every retake can wait a switch interval. Raises :class:`JournalError`; nothing of the
        batch is committed then. The journal's identity is checked before the batch (nothing is
        written into a file that is gone) and after it (:class:`JournalLost`: its acks are
        refused, and taken out of what is saved)."""
        db = self.db
        self.verify()
        try:
            for rec in records:
                if isinstance(rec, Finish) and rec.data_file and rec.file_data is not None:
                    self._write_file(rec.data_file, rec.file_data, durable=self.sync == "full")
            statements = [st for run in _runs(records) for st in self._statements(run)]
            if len(statements) == 1:
                db.execute(*statements[0])
            elif statements:
                db.execute("BEGIN IMMEDIATE")
                try:
                    for statement in statements:
                        db.execute(*statement)
                    db.execute("COMMIT")
                except BaseException:
                    if db.in_transaction:  # SQLite may have rolled back already (SQLITE_FULL)
                        db.execute("ROLLBACK")
                    raise
        except (sqlite3.Error, OSError) as exc:
            raise JournalError(f"journal {self.path}: write failed: {_describe(exc)}") from None
        self.verify(undo=[rec.job_id for rec in records if isinstance(rec, Accept)])
        for rec in records:
            if isinstance(rec, Evict) and rec.data_file:
                _unlink_own(rec.data_file)

    @staticmethod
    def _write_file(path: str, data: bytes, *, durable: bool = False) -> None:
        """Write ``data`` to ``path`` whole or not at all: a ``.tmp`` beside it, renamed over
        it; a failure removes the ``.tmp``. ``durable`` (``sync: full``): the file and then
        its folder are ``fsync``ed before this returns, so the row that the commit after it
        writes never names a file a power cut can take back. The folder is opened without
        following a link (a link swapped in for the results folder while the node runs fails
        with ``ELOOP``: nothing is written into its target)."""
        folder, name = os.path.split(path)
        tmp = name + ".tmp"
        dfd = _open_own_dir(folder)
        try:
            try:
                fd = os.open(
                    tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600, dir_fd=dfd
                )
                with open(fd, "wb") as f:
                    f.write(data)
                    if durable:
                        f.flush()
                        os.fsync(f.fileno())
                os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=dfd)
                raise
            if durable:
                os.fsync(dfd)
        finally:
            os.close(dfd)

    @classmethod
    def _statements(cls, run: Sequence[Record]) -> list[Statement]:
        """A run of records of one kind as few statements as it takes: acks, starts and
        evictions as one statement per chunk of :data:`_CHUNK` (each statement retakes the
        GIL, and a busy event loop makes every retake wait), results one each."""
        first = run[0]
        if len(run) == 1 or isinstance(first, Finish | Drop | Withdraw):
            return [cls._statement(rec) for rec in run]
        out: list[Statement] = []
        for at in range(0, len(run), _CHUNK):
            chunk = run[at : at + _CHUNK]
            if isinstance(first, Accept):
                rows = ", ".join(["(?, 'accepted', ?, ?)"] * len(chunk))
                params: list[object] = []
                for rec in chunk:
                    assert isinstance(rec, Accept)
                    params += [rec.job_id, rec.work_dir, rec.wall]
                out.append(
                    (
                        "INSERT OR REPLACE INTO jobs (job_id, state, work_dir, accepted_wall) "
                        f"VALUES {rows}",
                        params,
                    )
                )
                continue
            marks = ", ".join(["?"] * len(chunk))
            ids: list[object] = [rec.job_id for rec in chunk]
            if isinstance(first, Start):
                sql = (
                    f"UPDATE jobs SET state = 'running' WHERE state = 'accepted' "
                    f"AND job_id IN ({marks})"
                )
            else:
                sql = f"DELETE FROM jobs WHERE state IN ('done', 'error') AND job_id IN ({marks})"
            out.append((sql, ids))
        return out

    @staticmethod
    def _statement(rec: Record) -> Statement:
        if isinstance(rec, Accept):
            return (
                "INSERT OR REPLACE INTO jobs (job_id, state, work_dir, accepted_wall) "
                "VALUES (?, 'accepted', ?, ?)",
                [rec.job_id, rec.work_dir, rec.wall],
            )
        if isinstance(rec, Start):
            return (
                "UPDATE jobs SET state = 'running' WHERE job_id = ? AND state = 'accepted'",
                [rec.job_id],
            )
        if isinstance(rec, Finish):
            return (
                "UPDATE jobs SET state = ?, data = ?, data_file = ?, error = ?, terminal_wall = ? "
                "WHERE job_id = ? AND state IN ('accepted', 'running')",
                [rec.state, rec.data, rec.data_file, rec.error, rec.wall, rec.job_id],
            )
        if isinstance(rec, Withdraw):
            return ("DELETE FROM jobs WHERE job_id = ? AND state = 'accepted'", [rec.job_id])
        if isinstance(rec, Drop):
            return (
                "UPDATE jobs SET state = 'error', data = NULL, data_file = NULL, error = ? "
                "WHERE job_id = ? AND state = 'done'",
                [rec.error, rec.job_id],
            )
        return (
            "DELETE FROM jobs WHERE job_id = ? AND state IN ('done', 'error')",
            [rec.job_id],
        )

    # -- reading ---------------------------------------------------------------------------
    def load(self) -> list[Row]:
        """Every job in the journal, in acceptance order."""
        try:
            cursor = self.db.execute(
                "SELECT job_id, state, data, data_file, error, work_dir, accepted_wall, "
                "terminal_wall FROM jobs ORDER BY accepted_wall, rowid"
            )
            return [Row(*row) for row in cursor.fetchall()]
        except sqlite3.Error as exc:
            raise JournalError(f"journal {self.path}: cannot read: {_describe(exc)}") from None

    def drop_stale_files(self, keep: Iterable[str]) -> int:
        """Remove result files no job refers to (a crash between file and commit). Not in a
        results folder that has become a link since the start: nothing there is ours."""
        if not self.results_dir:
            return 0
        if problem := symlink_problem(self.results_dir):
            log.error("journal %s: %s; no stale result file removed", self.path, problem)
            return 0
        wanted = set(keep)
        removed = 0
        try:
            names = os.listdir(self.results_dir)
        except OSError:
            return 0
        for name in names:
            path = os.path.join(self.results_dir, name)
            if path not in wanted:
                _unlink(path)
                removed += 1
        return removed


SQLITE_SIBLINGS = ("-wal", "-shm", "-journal")
"""The files SQLite keeps beside the database."""


def _chmod_own_dir(path: str, mode: int) -> None:
    """``chmod`` of a folder of ours, through a descriptor opened without following a link
    (a link swapped in after the start check fails with ``ELOOP``, its target untouched)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def _ident(path: str) -> tuple[int, int] | None:
    """``(device, inode)`` of ``path`` itself (never followed), or ``None`` when it is gone."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _open_own_dir(folder: str) -> int:
    """A descriptor of a folder of ours, opened without following a link (``ELOOP``)."""
    return os.open(folder or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


def _unlink_own(path: str) -> None:
    """Remove a file of ours in a folder of ours; nothing when that folder is now a link."""
    folder, name = os.path.split(path)
    with contextlib.suppress(OSError):
        dfd = _open_own_dir(folder)
        try:
            os.unlink(name, dir_fd=dfd)
        finally:
            os.close(dfd)


def _fsync_dir(folder: str) -> None:
    """Make a rename in ``folder`` durable (raises ``OSError``)."""
    fd = os.open(folder or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------------
# The trio shell: group commits.
# --------------------------------------------------------------------------------------------

Callback = Callable[[JournalError | None], None]


Veto = Callable[[], str | None]
"""Asked when a submission's commit comes up: a reason not to write it, or ``None``."""


class Ticket:
    """One submission: its records, its callback, and an event set after the callback ran."""

    def __init__(
        self, records: Sequence[Record], callback: Callback | None, veto: Veto | None = None
    ) -> None:
        self.records = tuple(records)
        self.callback = callback
        self.veto = veto
        self.error: JournalError | None = None
        self.done = trio.Event()

    def vetoed(self) -> bool:
        """Ask the veto (if any); when it gives a reason, settle with :class:`Vetoed` (nothing
        is written) and return True. A veto that raises is logged and the records written."""
        if self.veto is None:
            return False
        try:
            reason = self.veto()
        except Exception:
            log.exception("journal: a veto failed; writing the records")
            return False
        if reason is None:
            return False
        try:
            self.settle(Vetoed(reason))
        except Exception:
            log.exception("journal: a commit callback failed")
        return True

    def settle(self, error: JournalError | None) -> None:
        self.error = error
        try:
            if self.callback is not None:
                self.callback(error)
        finally:
            self.done.set()

    async def wait(self) -> JournalError | None:
        await self.done.wait()
        return self.error


_CHUNK = 200
"""Rows per multi-row statement (3 parameters each: well under SQLite's 999)."""


def _runs(records: Sequence[Record]) -> list[list[Record]]:
    """``records`` cut into consecutive runs of one kind (their order kept)."""
    runs: list[list[Record]] = []
    for rec in records:
        if runs and type(runs[-1][0]) is type(rec):
            runs[-1].append(rec)
        else:
            runs.append([rec])
    return runs


class JournalWriter:
    """Writes what is submitted, in submission order, many submissions per transaction."""

    def __init__(self, journal: Journal, *, check_interval: float | None = None) -> None:
        self.journal = journal
        self.check_interval = check_interval
        """Seconds between identity checks while no commit comes (``None``: only the commits
        check it; the node passes :data:`IDENTITY_CHECK_INTERVAL`)."""
        self._queue: list[Ticket] = []
        self._lot = trio.lowlevel.ParkingLot()
        self._limiter = trio.CapacityLimiter(1)
        self._closed = False
        self._failing = False
        self._lost_logged = False

    def submit(
        self,
        records: Sequence[Record],
        callback: Callback | None = None,
        *,
        veto: Veto | None = None,
    ) -> Ticket:
        """Queue ``records``; ``callback(error)`` runs on the event loop after their commit
        (``error`` is ``None`` when it committed). ``veto`` is asked when the batch holding
        them is taken for its commit: a reason drops them (``callback(Vetoed(reason))``).
        Synchronous; never raises."""
        ticket = Ticket(records, callback, veto)
        if self._closed:
            ticket.settle(JournalError(f"journal {self.journal.path}: closed"))
            return ticket
        self._queue.append(ticket)
        self._lot.unpark_all()
        return ticket

    async def run_sync(self, fn: Callable[[], object]) -> object:
        """Run a blocking journal call (reads at startup) on the writer's thread limiter."""
        return await trio.to_thread.run_sync(fn, limiter=self._limiter)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The writer task. Cancellation: stops after the commit in progress (a commit is never
        abandoned); what is still queued then is settled with a "closed" error."""
        task_status.started()
        try:
            while True:
                if not self._queue:
                    await self._idle()
                    continue
                batch, self._queue = self._queue, []
                batch = [ticket for ticket in batch if not ticket.vetoed()]
                if not batch:
                    continue
                records = [rec for ticket in batch for rec in ticket.records]
                error: JournalError | None = None
                try:
                    await trio.to_thread.run_sync(
                        self.journal.apply, records, limiter=self._limiter
                    )
                except JournalError as exc:
                    error = exc
                self._note(error)
                for ticket in batch:
                    try:
                        ticket.settle(error)
                    except Exception:
                        log.exception("journal: a commit callback failed")
        finally:
            self._closed = True
            pending, self._queue = self._queue, []
            for ticket in pending:
                ticket.settle(JournalError(f"journal {self.journal.path}: closed"))

    @property
    def lost(self) -> bool:
        """The journal is lost (:class:`JournalLost`): nothing more is written this run."""
        return self.journal.lost is not None

    async def _idle(self) -> None:
        """Wait for a submission; every ``check_interval`` without one, check the identity."""
        interval = self.check_interval
        if interval is None or self.lost:
            interval = math.inf
        with trio.move_on_after(interval):
            while not self._queue:
                await self._lot.park()
            return
        try:
            await trio.to_thread.run_sync(self.journal.verify, limiter=self._limiter)
        except JournalError as exc:
            self._note(exc)

    def close(self) -> None:
        """Close the journal (the writer's end); a loss found only now is logged."""
        found = self.journal.close()
        if found is not None:
            self._note(JournalLost(found))

    def _note(self, error: JournalError | None) -> None:
        if isinstance(error, JournalLost):
            if not self._lost_logged:  # one ERROR line: what happened, where it was saved
                self._lost_logged = True
                log.error("%s", error)
            return
        if error is None:
            if self._failing:
                self._failing = False
                log.warning("journal: writes succeed again (%s)", self.journal.path)
            return
        if not self._failing:
            self._failing = True
            log.error("%s; new dispatches get 503 until a write succeeds", error)


__all__ = [
    "DEFAULT_INLINE_MAX",
    "IDENTITY_CHECK_INTERVAL",
    "JOURNAL_LOST",
    "RESULT_LOST",
    "SYNC_MODES",
    "WORK_TAG",
    "Accept",
    "Copied",
    "Drop",
    "Evict",
    "Finish",
    "Identity",
    "Journal",
    "JournalError",
    "JournalLost",
    "JournalWriter",
    "Record",
    "ResultLost",
    "Row",
    "Start",
    "Ticket",
    "Veto",
    "Vetoed",
    "Withdraw",
    "result_problem",
]
