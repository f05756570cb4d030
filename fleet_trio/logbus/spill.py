"""Spill files: the full output of a job, appended to ``<spill_dir>/<job_id>.log``.

Plain blocking helpers; :mod:`fleet_trio.logbus.bus` calls them through
``trio.to_thread.run_sync`` with a limiter, never on the event loop.
"""

from __future__ import annotations

import os
import re

_JOB_ID = re.compile(r"[A-Za-z0-9._-]{1,200}")


def check_job_id(job_id: str) -> str:
    """Return ``job_id`` if it is safe as a file name stem, else raise ``ValueError``.

    Allowed: 1 to 200 characters of ``[A-Za-z0-9._-]``. Job ids are untrusted (they come from
    the controller), so anything else (a slash, a NUL, an empty id) is rejected rather than
    escaped: an escaped id could collide with another valid id. ``"."``/``".."`` are harmless
    because the spill file name always gets the ``.log`` suffix.
    """
    if not isinstance(job_id, str) or _JOB_ID.fullmatch(job_id) is None:
        raise ValueError(f"invalid job id {job_id!r}: want 1-200 characters of [A-Za-z0-9._-]")
    return job_id


def spill_path(spill_dir: str, job_id: str) -> str:
    """The spill file of ``job_id`` under ``spill_dir`` (the id is validated)."""
    return os.path.join(spill_dir, check_job_id(job_id) + ".log")


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
