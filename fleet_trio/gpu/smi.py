"""The ``nvidia-smi`` source (node.md §5.1, §5.6, §7.2).

Every call runs through :func:`fleet_trio.proc.run.run` in its own process group with a
timeout (upstream has none, §5.2), so a hung ``nvidia-smi`` is killed and counts as a failed
sample instead of freezing the sampler.
"""

from __future__ import annotations

import math
import os

import attrs
import trio

from fleet_trio.gpu.source import MIB, DeviceSet, GpuDevice, GpuError, VramSnapshot
from fleet_trio.proc.run import look_path, run
from fleet_trio.proc.sinks import CappedBuffer
from fleet_trio.proc.spec import JobSpec

MEMORY_QUERY = ("--query-gpu=memory.total,memory.used", "--format=csv,noheader,nounits")
APPS_QUERY = ("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
NAME_QUERY = ("--query-gpu=name", "--format=csv,noheader")
DEVICES_QUERY = (
    "--query-gpu=index,uuid,name,memory.total,memory.used",
    "--format=csv,noheader,nounits",
)
"""The 5-field per-device query: one line per GPU (multi-GPU nodes)."""
BULK_MAX_AGE = 0.25
"""Seconds one run of :data:`DEVICES_QUERY` serves every device's snapshot."""
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
    values = []
    for what, field in zip(("total", "used"), fields, strict=True):
        try:
            values.append(_float_field(field))
        except ValueError as exc:
            raise GpuError(f"nvidia-smi: bad {what} {field.strip()!r}") from exc
    total, used = values
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


@attrs.frozen
class SmiDeviceRow:
    """One line of :data:`DEVICES_QUERY`. ``memory`` is ``(total GiB, used GiB)``, or the
    :class:`GpuError` that line's memory fields gave (that device alone failed to read)."""

    index: int
    uuid: str
    name: str
    memory: tuple[float, float] | GpuError


def parse_smi_devices(text: str) -> list[SmiDeviceRow]:
    """Every line of ``index,uuid,name,memory.total,memory.used`` (MiB), in output order.

    A line whose index or UUID is unusable is an error for the whole output (the devices
    cannot be told apart); a line whose memory fields are bad (``[N/A]``, ``0`` total, NaN)
    only marks that device failed. The name may itself hold commas (the middle fields).
    """
    rows: list[SmiDeviceRow] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 5:
            raise GpuError(f"nvidia-smi: expected 5 fields, got {len(fields)}: {line[:200]!r}")
        try:
            index = int(fields[0])
        except ValueError:
            raise GpuError(f"nvidia-smi: bad index {fields[0]!r}") from None
        uuid = fields[1]
        if index < 0 or not uuid or uuid.startswith("["):
            raise GpuError(f"nvidia-smi: bad device line {line[:200]!r}")
        name = line.split(",", 2)[2].rsplit(",", 2)[0].strip()  # it may hold commas
        memory: tuple[float, float] | GpuError
        try:
            memory = parse_smi_memory(f"{fields[-2]}, {fields[-1]}")
        except GpuError as exc:
            memory = GpuError(f"{exc} (device {index})")
        rows.append(SmiDeviceRow(index=index, uuid=uuid, name=name, memory=memory))
    if not rows:
        raise GpuError("nvidia-smi: empty output")
    if len({r.index for r in rows}) != len(rows) or len({r.uuid for r in rows}) != len(rows):
        raise GpuError("nvidia-smi: the same device index or uuid on two lines")
    return rows


def find_nvidia_smi() -> str | None:
    """``nvidia-smi`` on ``$PATH``, or ``None``."""
    return look_path("nvidia-smi", os.environ.get("PATH", os.defpath))


class SmiSource:
    """A :class:`~fleet_trio.gpu.source.GpuSource` backed by ``nvidia-smi``.

    With ``bulk`` (multi-GPU nodes), snapshots come from one shared run of the 5-field
    per-device query instead of one ``--id`` query per device.
    """

    name = "smi"

    def __init__(
        self,
        *,
        index: int = 0,
        timeout: float = 5.0,
        command: str = "nvidia-smi",
        bulk: SmiBulk | None = None,
    ) -> None:
        self.index = index
        self.timeout = timeout
        self.command = command
        self.bulk = bulk

    def argv(self, query: tuple[str, ...]) -> tuple[str, ...]:
        """The command line; ``--id`` is added only for a device other than 0, so the default
        is exactly the contract's command (whose first line is GPU 0)."""
        select = (f"--id={self.index}",) if self.index else ()
        return (self.command, *query, *select)

    async def _query(self, query: tuple[str, ...]) -> str:
        return await run_smi(self.argv(query), self.timeout)

    async def snapshot(self) -> VramSnapshot:
        if self.bulk is not None:
            total, used = await self.bulk.memory(self.index)
            return VramSnapshot.now(total, used)
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


async def run_smi(argv: tuple[str, ...], smi_timeout: float) -> str:
    """Run one ``nvidia-smi`` query (own process group, killed after ``smi_timeout``); stdout.
    :class:`GpuError` on failure."""
    out = CappedBuffer(OUTPUT_CAP)
    err = CappedBuffer(4096)
    spec = JobSpec(
        command=argv,
        max_runtime=smi_timeout,
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


class SmiBulk:
    """One run of :data:`DEVICES_QUERY` shared by every device's snapshot: a result younger
    than ``max_age`` is reused and concurrent callers share the run in flight."""

    def __init__(
        self, *, timeout: float = 5.0, command: str = "nvidia-smi", max_age: float = BULK_MAX_AGE
    ) -> None:
        self.timeout = timeout
        self.command = command
        self.max_age = max_age
        self.runs = 0
        self._lock = trio.Lock()
        self._rows: dict[int, SmiDeviceRow] | GpuError | None = None
        self._taken = -math.inf

    async def rows(self) -> dict[int, SmiDeviceRow]:
        async with self._lock:
            if self._rows is None or trio.current_time() - self._taken >= self.max_age:
                self.runs += 1
                try:
                    text = await run_smi((self.command, *DEVICES_QUERY), self.timeout)
                    self._rows = {r.index: r for r in parse_smi_devices(text)}
                except GpuError as exc:
                    self._rows = exc
                self._taken = trio.current_time()
            if isinstance(self._rows, GpuError):
                raise self._rows
            return self._rows

    async def memory(self, index: int) -> tuple[float, float]:
        row = (await self.rows()).get(index)
        if row is None:
            raise GpuError(f"nvidia-smi: device {index} is missing from the output")
        if isinstance(row.memory, GpuError):
            raise row.memory
        return row.memory


async def open_smi_devices(*, smi_timeout: float = 5.0, command: str = "nvidia-smi") -> DeviceSet:
    """Enumerate the GPUs with :data:`DEVICES_QUERY`. One device: a plain :class:`SmiSource`
    (the contract's own memory query); several: sources sharing one :class:`SmiBulk`."""
    rows = parse_smi_devices(await run_smi((command, *DEVICES_QUERY), smi_timeout))
    bulk = SmiBulk(timeout=smi_timeout, command=command) if len(rows) > 1 else None
    devices = tuple(
        GpuDevice(
            index=r.index,
            uuid=r.uuid,
            name=r.name,
            source=SmiSource(index=r.index, timeout=smi_timeout, command=command, bulk=bulk),
        )
        for r in sorted(rows, key=lambda r: r.index)
    )
    return DeviceSet("smi", devices)


__all__ = [
    "APPS_QUERY",
    "DEVICES_QUERY",
    "MEMORY_QUERY",
    "NAME_QUERY",
    "SmiBulk",
    "SmiDeviceRow",
    "SmiSource",
    "find_nvidia_smi",
    "open_smi_devices",
    "parse_compute_apps",
    "parse_smi_devices",
    "parse_smi_memory",
    "parse_smi_name",
    "run_smi",
]
