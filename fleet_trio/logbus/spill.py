"""Spill files: the full output of a job, appended to ``<spill_dir>/<job_id>.log``.

Plain blocking helpers; :mod:`fleet_trio.logbus.bus` calls them through
``trio.to_thread.run_sync`` with a limiter, never on the event loop.
"""

from __future__ import annotations

import hashlib
import os

from fleet_trio.inputs import id_problem

#: Ids up to this length are their own file name stem; longer ones are cut and hashed so the
#: name stays under the 255-byte limit of common file systems.
_STEM_MAX = 200


def check_job_id(job_id: str) -> str:
    """Return ``job_id`` if it is a valid id (:mod:`fleet_trio.inputs`), else raise ``ValueError``.

    The id set (letters and digits first, then also ``. _ ~ : @ + = -``) holds no slash, NUL or
    other character a file name cannot carry, so a valid id is never escaped: an escaped id could
    collide with another valid id.
    """
    problem = id_problem(job_id) if isinstance(job_id, str) else "is not a string"
    if problem is not None:
        raise ValueError(f"invalid job id {job_id!r}: {problem}")
    return job_id


def spill_path(spill_dir: str, job_id: str) -> str:
    """The spill file of ``job_id`` under ``spill_dir`` (the id is validated), named by the id
    itself, or for a long id by a cut and a digest (longer than any short id, so the two kinds
    never collide)."""
    stem = check_job_id(job_id)
    if len(job_id) > _STEM_MAX:
        digest = hashlib.sha256(job_id.encode("ascii")).hexdigest()[:32]
        stem = f"{job_id[: _STEM_MAX - 20]}~{digest}"
    return os.path.join(spill_dir, stem + ".log")


def append(path: str, data: bytes, truncate: bool) -> None:
    """Append ``data`` to ``path`` (truncating it first when ``truncate``); blocking."""
    with open(path, "wb" if truncate else "ab") as f:
        f.write(data)


def read_range(path: str, offset: int, nbytes: int) -> bytes:
    """Read up to ``nbytes`` bytes of ``path`` from ``offset``; blocking."""
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(nbytes)


__all__ = ["append", "check_job_id", "read_range", "spill_path"]
