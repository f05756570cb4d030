"""The ``nvidia-smi`` source (node.md §5.1, §5.6, §7.2).

Every call runs through :func:`fleet_trio.proc.run.run` in its own process group with a
timeout (upstream has none, §5.2), so a hung ``nvidia-smi`` is killed and counts as a failed
sample instead of freezing the sampler.
"""

from __future__ import annotations

import math
import os

import trio

from fleet_trio.gpu.source import MIB, GpuError, VramSnapshot
from fleet_trio.proc.run import look_path, run
from fleet_trio.proc.sinks import CappedBuffer
from fleet_trio.proc.spec import JobSpec

MEMORY_QUERY = ("--query-gpu=memory.total,memory.used", "--format=csv,noheader,nounits")
APPS_QUERY = ("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
NAME_QUERY = ("--query-gpu=name", "--format=csv,noheader")
OUTPUT_CAP = 1 << 20
KILL_GRACE = 1.0


def _float_field(text: str) -> float:
    value = float(text.strip())  # ValueError for "N/A", "[N/A]", ""
    if not math.isfinite(value):
        raise ValueError(f"non-finite value {text.strip()!r}")
    return value


def parse_smi_memory(text: str) -> tuple[float, float]:
    """``(total GiB, used GiB)`` from ``memory.total,memory.used`` MiB output (§5.1).

    The first line wins (GPU 0 of the query); CRLF and surrounding blanks are trimmed; exactly
    two fields; total ≤ 0, used < 0, NaN and Inf are errors.
    """
    line = text.split("\n", 1)[0].strip()
    if not line:
        raise GpuError("nvidia-smi: empty output")
    fields = line.split(",")
    if len(fields) != 2:
        raise GpuError(f"nvidia-smi: expected 2 fields, got {len(fields)}: {line!r}")
    try:
        total = _float_field(fields[0])
    except ValueError as exc:
        raise GpuError(f"nvidia-smi: bad total {fields[0].strip()!r}") from exc
    try:
        used = _float_field(fields[1])
    except ValueError as exc:
        raise GpuError(f"nvidia-smi: bad used {fields[1].strip()!r}") from exc
    if total <= 0:
        raise GpuError(f"nvidia-smi: non-positive total {fields[0].strip()!r}")
    if used < 0:
        raise GpuError(f"nvidia-smi: negative used {fields[1].strip()!r}")
    return total / 1024, used / 1024


def parse_compute_apps(text: str) -> dict[int, int] | None:
    """pid → bytes from ``--query-compute-apps=pid,used_memory`` (MiB).

    ``None`` when any row's memory is not a number (``[N/A]`` under WDDM or MIG: per-process
    accounting is unavailable). The same pid on several rows is summed. No rows → ``{}``.
    """
    out: dict[int, int] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.lower().startswith("no running"):
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 2:
            return None
        try:
            pid = int(fields[0])
            mib = _float_field(fields[1])
        except ValueError:
            return None
        if pid <= 0 or mib < 0:
            return None
        out[pid] = out.get(pid, 0) + int(mib * MIB)
    return out


def parse_smi_name(text: str) -> str:
    """The first line, trimmed (§7.2)."""
    return text.split("\n", 1)[0].strip()


def find_nvidia_smi() -> str | None:
    """``nvidia-smi`` on ``$PATH``, or ``None``."""
    return look_path("nvidia-smi", os.environ.get("PATH", os.defpath))


class SmiSource:
    """A :class:`~fleet_trio.gpu.source.GpuSource` backed by ``nvidia-smi``."""

    name = "smi"

    def __init__(
        self, *, index: int = 0, timeout: float = 5.0, command: str = "nvidia-smi"
    ) -> None:
        self.index = index
        self.timeout = timeout
        self.command = command

    def argv(self, query: tuple[str, ...]) -> tuple[str, ...]:
        """The command line; ``--id`` is added only for a device other than 0, so the default
        is exactly the contract's command (whose first line is GPU 0)."""
        select = (f"--id={self.index}",) if self.index else ()
        return (self.command, *query, *select)

    async def _query(self, query: tuple[str, ...]) -> str:
        out = CappedBuffer(OUTPUT_CAP)
        err = CappedBuffer(4096)
        spec = JobSpec(
            command=self.argv(query),
            max_runtime=self.timeout,
            grace_ceiling=KILL_GRACE,
            stderr_sink=err,
        )
        result = await run(spec, out)
        if result.err is not None:
            raise GpuError(f"nvidia-smi: {result.err}")
        if result.killed or result.exit_code != 0:
            why = result.reason or f"exit status {result.exit_code}"
            detail = err.getvalue().decode("utf-8", "replace").strip()
            raise GpuError(f"nvidia-smi: {why}" + (f": {detail[-400:]}" if detail else ""))
        return out.getvalue().decode("utf-8", "replace")

    async def snapshot(self) -> VramSnapshot:
        total, used = parse_smi_memory(await self._query(MEMORY_QUERY))
        return VramSnapshot.now(total, used)

    async def process_used_bytes(self) -> dict[int, int] | None:
        try:
            text = await self._query(APPS_QUERY)
        except GpuError:
            return None
        return parse_compute_apps(text)

    async def device_name(self) -> str:
        try:
            return parse_smi_name(await self._query(NAME_QUERY))
        except GpuError:
            return ""

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


__all__ = [
    "APPS_QUERY",
    "MEMORY_QUERY",
    "NAME_QUERY",
    "SmiSource",
    "find_nvidia_smi",
    "parse_compute_apps",
    "parse_smi_memory",
    "parse_smi_name",
]
