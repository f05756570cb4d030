"""Per-job cgroup limits: ``memory_max``, ``pids_max``, ``cpu_weight`` (docs/containment.md,
"Limits"). fleet-trio's own keys (rc has none): a node task's (``tasks.<name>``) and a worker
device's (``devices[]``).

Each is checked when the config is loaded (:func:`parse_memory_max`, :func:`check_pids_max`,
:func:`check_cpu_weight`); at start, :func:`check_limits` makes sure every configured limit's
controller is enabled for the job cgroups (or fails the start with one line naming the key,
where it is set and the missing controller); each job cgroup then gets its limit files written
right after it is made, before the job's shim enters it (:meth:`JobLimits.write`). An OOM kill
(``memory.events``' ``oom_kill`` at the end) is the job's reason (:meth:`JobLimits.oom_reason`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

import attrs

from fleet_trio.errors import errno_text
from fleet_trio.memory import parse_size
from fleet_trio.proc.spec import Result

if TYPE_CHECKING:
    from fleet_trio.proc.containment import CgroupUsage

MIN_MEMORY_MAX = 1 << 20
"""1 MiB: no job starts in less (the kernel would OOM-kill it at once)."""
MAX_PIDS = 1 << 22
"""The kernel's ``pid_max`` ceiling (4194304)."""
CPU_WEIGHT_RANGE = (1, 10000)
"""``cpu.weight``'s range (the default is 100)."""

CONTROLLER = {"memory_max": "memory", "pids_max": "pids", "cpu_weight": "cpu"}
"""The controller each limit needs."""


def parse_memory_max(value: object) -> tuple[int, str]:
    """``(bytes, the text as written)`` of a ``memory_max`` value: a size in the project's one
    notation (:func:`fleet_trio.memory.parse_size`: ``8GiB`` is 8·2³⁰ bytes, ``8G`` 8·10⁹) or
    a whole number of bytes. Raises ``ValueError`` (one line)."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ValueError(f"expected a size such as 8GiB or 512MiB, got {value!r}")
    text = str(value).strip()
    nbytes = parse_size(text)
    if nbytes < MIN_MEMORY_MAX:
        raise ValueError(f"must be at least 1MiB, got {text!r} ({nbytes} bytes)")
    return nbytes, text


def check_pids_max(value: object) -> int:
    """A ``pids_max``: a whole number from 1. Raises ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected a whole number >= 1, got {value!r}")
    if not 1 <= value <= MAX_PIDS:
        raise ValueError(f"must be from 1 to {MAX_PIDS}, got {value}")
    return value


def check_cpu_weight(value: object) -> int:
    """A ``cpu_weight``: a whole number from 1 to 10000 (cgroup v2's ``cpu.weight``)."""
    low, high = CPU_WEIGHT_RANGE
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected a whole number from {low} to {high}, got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"must be from {low} to {high}, got {value}")
    return value


@attrs.frozen
class JobLimits:
    """The limits of one job's cgroup (``None``: not set)."""

    memory_max: int | None = None
    """Bytes (``memory.max``)."""
    memory_max_text: str = ""
    """``memory_max`` as the config wrote it (the OOM reason names it so)."""
    pids_max: int | None = None
    cpu_weight: int | None = None

    @property
    def empty(self) -> bool:
        return self.memory_max is None and self.pids_max is None and self.cpu_weight is None

    def configured(self) -> list[str]:
        """The configured keys, in a fixed order."""
        return [k for k in CONTROLLER if getattr(self, k) is not None]

    def files(self) -> list[tuple[str, str]]:
        """``(cgroup file, value)`` to write, in order."""
        out: list[tuple[str, str]] = []
        if self.memory_max is not None:
            out.append(("memory.max", str(self.memory_max)))
            # an OOM kills the whole job, not one of its processes (Linux >= 4.19)
            out.append(("memory.oom.group", "1"))
        if self.pids_max is not None:
            out.append(("pids.max", str(self.pids_max)))
        if self.cpu_weight is not None:
            out.append(("cpu.weight", str(self.cpu_weight)))
        return out

    def write(self, path: str) -> None:
        """Write the limit files of the cgroup at ``path``. Raises ``OSError`` naming the file
        (``memory.oom.group`` alone is best effort: kernels before 4.19 lack it)."""
        for name, value in self.files():
            try:
                with open(os.path.join(path, name), "w") as f:
                    f.write(value)
            except OSError as exc:
                if name == "memory.oom.group":
                    continue
                raise OSError(exc.errno, exc.strerror, os.path.join(path, name)) from None

    def oom_reason(self) -> str:
        """The reason of a job the kernel's OOM killer killed."""
        if self.memory_max is None:
            return "killed: out of memory"
        return f"killed: out of memory (memory_max {self.memory_max_text or self.memory_max})"


NO_LIMITS = JobLimits()


def oom_result(result: Result, usage: CgroupUsage, limits: JobLimits | None) -> Result:
    """``result`` with the job's ``usage``; when the kernel's OOM killer killed in the job's
    cgroup (``memory.events``' ``oom_kill`` > 0), that is the job's reason: ``killed: out of
    memory (memory_max 8G)`` (the value as configured; without one, the limit was an
    ancestor's: ``killed: out of memory``). A start error stays what it is."""
    result = attrs.evolve(result, usage=usage)
    if not usage.oom_kills or result.err is not None:
        return result
    return attrs.evolve(result, killed=True, reason=(limits or NO_LIMITS).oom_reason())


def enable_controllers(jobs_dir: str, controllers: Iterable[str]) -> dict[str, str]:
    """Enable ``controllers`` for the cgroups made in ``jobs_dir``: ``+NAME`` to the
    ``cgroup.subtree_control`` of its parent (the delegated cgroup) and of ``jobs_dir``.
    Returns the controllers that cannot be had, each with why (empty: all enabled)."""
    parent = os.path.dirname(jobs_dir.rstrip("/"))
    missing: dict[str, str] = {}
    try:
        with open(os.path.join(parent, "cgroup.controllers")) as f:
            offered = f.read().split()
    except OSError as exc:
        offered = []
        unreadable = f"{parent}/cgroup.controllers: {errno_text(exc.errno or 0)}"
    else:
        unreadable = ""
    for name in dict.fromkeys(controllers):
        if name not in offered:
            missing[name] = unreadable or (
                f"{parent}/cgroup.controllers offers {' '.join(offered) or 'none'}"
            )
            continue
        for directory in (parent, jobs_dir):
            if _enabled(directory, name):
                continue
            try:
                with open(os.path.join(directory, "cgroup.subtree_control"), "w") as f:
                    f.write(f"+{name}")
            except OSError as exc:
                missing[name] = (
                    f"+{name} to {directory}/cgroup.subtree_control: {errno_text(exc.errno or 0)}"
                )
                break
    return missing


def _enabled(directory: str, name: str) -> bool:
    try:
        with open(os.path.join(directory, "cgroup.subtree_control")) as f:
            return name in f.read().split()
    except OSError:
        return False


def check_limits(jobs_dir: str | None, configured: Iterable[tuple[str, JobLimits]]) -> str | None:
    """The start error (one line) for the first configured limit that cannot be had, or
    ``None``. ``jobs_dir``: the cgroup backend's jobs directory (``None``: the marker
    backend, where every limit is an error). ``configured``: ``(where, limits)``, ``where``
    naming the task or device and its file (``tasks.train in /etc/node.yaml``)."""
    wanted = [(where, limits) for where, limits in configured if not limits.empty]
    if not wanted:
        return None
    if jobs_dir is None:
        where, limits = wanted[0]
        return (
            f"{where}: {limits.configured()[0]} needs the cgroup backend (containment is marker;"
            " docs/containment.md)"
        )
    needed = [CONTROLLER[k] for _, limits in wanted for k in limits.configured()]
    missing = enable_controllers(jobs_dir, needed)
    for where, limits in wanted:
        for key in limits.configured():
            why = missing.get(CONTROLLER[key])
            if why is not None:
                return (
                    f"{where}: {key} needs the {CONTROLLER[key]} controller, which is not"
                    f" enabled for the job cgroups ({why})"
                )
    return None


__all__ = [
    "CONTROLLER",
    "NO_LIMITS",
    "JobLimits",
    "check_cpu_weight",
    "check_limits",
    "check_pids_max",
    "enable_controllers",
    "oom_result",
    "parse_memory_max",
]
