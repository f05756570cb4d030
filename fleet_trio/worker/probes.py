"""Detected labels: probe passes and the Unconfirmed rule (worker-process.md §6).

(Over 500 lines: the pass structure, its three sources and the Unconfirmed rule are one section of
the spec (worker-process.md §6) and share its constants.)

Spec: worker-process.md §6.1 (pass structure, precedence builtin → nvidia-smi → drop-ins, one
lock), §6.2 (built-in host facts), §6.3 (nvidia-smi facts, found/broken), §6.4 (drop-in probes:
one flat JSON object on stdout), §6.5 (key classification), §6.6 (the per-device Unconfirmed
rule), §6.7 (when passes run), §0.5 (constants: 5 s per probe, 30 s per pass, 64 KiB caps,
200-byte stderr note), §14.3 (budgets: here cancel-scope deadlines); worker-protocol.md §9.1 (the
``labels`` wire rules: an unconfirmed device without facts is *omitted*, a confirmed-empty one
is ``{}``, the host key ``""`` only when there are host facts, ``null`` when nothing at all).

Layers:

* pure helpers — :func:`builtin_host_facts`, :func:`parse_nvidia_smi`,
  :func:`parse_probe_output`, :func:`classify_key`, :func:`labels_payload`;
* :func:`nvidia_labels` — one supervised ``nvidia-smi`` query → :class:`NvidiaFacts`;
* :class:`UnconfirmedTracker` — the sans-IO memory of which devices each source speaks for,
  plus the "clearing" warning markers (a plain sync class);
* :class:`Prober` — holds the tracker across passes, serialises passes with one
  :class:`trio.Lock`, and turns a pass into the wire map (logging each device's "preserving"
  warning once per episode).

The drop-in directory is run by :func:`fleet_trio.proc.scripts.run_scripts` (listing, bytewise
order, stat, executable check, per-probe timeout, the pass budget as a cancel scope, 64 KiB caps).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Collection, Iterable, Mapping
from typing import Any

import attrs
import trio

from fleet_trio.durations import SECOND, go_duration_seconds
from fleet_trio.gpu.nvml import gpu_rows_sync
from fleet_trio.gpu.source import GpuError
from fleet_trio.proc.containment import AnyContainment
from fleet_trio.proc.run import look_path, run
from fleet_trio.proc.scripts import (
    ScriptKind,
    ScriptOutcome,
    report_escapees,
    run_scripts,
    stderr_head,
)
from fleet_trio.proc.sinks import STREAM_CAP, CappedBuffer
from fleet_trio.proc.spec import JobSpec, Result
from fleet_trio.proc.stop import StopToken
from fleet_trio.worker.config import WorkerConfig

log = logging.getLogger(__name__)

PASS_BUDGET = 30.0
"""The whole-pass budget, seconds (§0.5: not configurable; tests pass ``pass_budget``)."""
DEFAULT_TIMEOUT = 5.0
"""Per-probe (and nvidia-smi) timeout when none is configured, seconds."""
OUTPUT_CAP = STREAM_CAP
"""stdout and stderr cap per probe, bytes each."""

BUILTIN = "builtin"
NVIDIA = "nvidia-smi"

NVIDIA_QUERY = (
    "--query-gpu=name,memory.total,memory.free,driver_version",
    "--format=csv,noheader,nounits",
)

CLEARING_PHRASE = (
    "probe failed and has not succeeded once since this worker started; it is treated as "
    "covering no device, so anything it used to report is cleared rather than preserved"
)
BUDGET_PHRASE = "probe pass exceeded its budget; remaining probes skipped"

_GPU_NAME = re.compile(r"gpu[0-9]+\Z")


# ---------------------------------------------------------------------------------------------
# Built-in host facts (§6.2)
# ---------------------------------------------------------------------------------------------


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _mem_total_bytes(meminfo: str) -> str | None:
    for line in (_read_text(meminfo) or "").splitlines():
        if line.startswith("MemTotal:"):
            fields = line.split()
            if len(fields) < 2:
                return None
            try:
                kb = int(fields[1])
            except ValueError:
                return None
            return str(kb * 1024)
    return None


def _kernel(osrelease: str) -> str | None:
    return (_read_text(osrelease) or "").strip() or None


def builtin_host_facts(
    *,
    disk_path: str = "/",
    meminfo: str = "/proc/meminfo",
    osrelease: str = "/proc/sys/kernel/osrelease",
) -> dict[str, str]:
    """``cpus``, ``mem_total_bytes``, ``disk_free_bytes`` (of ``/``), ``kernel`` (§6.2).

    Blocking (reads files, ``statvfs``): call it from a worker thread. A fact whose source is
    unreadable or unparsable is omitted; ``cpus`` never is. Never a ``cuda`` label.
    """
    facts: dict[str, str] = {"cpus": str(len(os.sched_getaffinity(0)))}
    mem = _mem_total_bytes(meminfo)
    if mem is not None:
        facts["mem_total_bytes"] = mem
    try:
        st = os.statvfs(disk_path)
    except OSError:
        pass
    else:
        facts["disk_free_bytes"] = str(st.f_bavail * st.f_bsize)
    kernel = _kernel(osrelease)
    if kernel is not None:
        facts["kernel"] = kernel
    return facts


# ---------------------------------------------------------------------------------------------
# nvidia-smi (§6.3)
# ---------------------------------------------------------------------------------------------


@attrs.frozen
class NvidiaFacts:
    """One nvidia-smi query: ``facts`` is ``None`` unless found and not broken."""

    facts: dict[str, str] | None
    found: bool
    broken: bool
    error: str = ""
    """Why it is broken (empty otherwise)."""

    @property
    def ok(self) -> bool:
        return self.found and not self.broken


def gpu_facts(index: int, model: str, total_mib: str, free_mib: str, driver: str) -> dict[str, str]:
    """One GPU's facts in the reference's units (§6.3): memory as ``<MiB>M``."""
    p = f"gpu{index}"
    return {
        f"{p}.vendor": "nvidia",
        f"{p}.model": model,
        f"{p}.vram": total_mib + "M",
        f"{p}.vram_free": free_mib + "M",
        f"{p}.driver": driver,
    }


def parse_nvidia_smi(text: str) -> dict[str, str]:
    """``gpu<i>.{vendor,model,vram,vram_free,driver}`` from the CSV query output (§6.3).

    ``i`` counts every line of the trimmed text, skipped ones included; a line without exactly
    four comma-separated fields is skipped with a WARN; values are not validated; memory
    fields get an ``M`` suffix (MiB as a K/M/G/T quantity: ``81920M``).
    """
    facts: dict[str, str] = {}
    for i, raw in enumerate(text.strip().split("\n")):
        line = raw.strip()
        if not line:
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 4:
            log.warning(
                "nvidia-smi: skipping line %d: expected 4 fields, got %d: %r",
                i,
                len(fields),
                line,
            )
            continue
        facts.update(gpu_facts(i, fields[0], fields[1], fields[2], fields[3]))
    return facts


def find_nvidia_smi(path: str | None = None) -> str | None:
    """``nvidia-smi`` on ``path`` (default: the worker's ``$PATH``): an executable,
    non-directory file, or ``None``."""
    return look_path("nvidia-smi", path if path is not None else os.environ.get("PATH", os.defpath))


async def nvml_labels(
    max_runtime: float, nvml: Any | None = None, *, limiter: trio.CapacityLimiter | None = None
) -> dict[str, str] | None:
    """The GPU facts from NVML (the driver library, no subprocess), or ``None`` when NVML is
    not usable here (no driver, no library, a hung call past ``max_runtime``).

    The call runs in a thread of ``limiter`` (the prober's own; a fresh one when ``None``),
    abandoned at ``max_runtime``: a hung driver keeps that one token, so the next calls time
    out waiting for it and nothing else is starved."""
    rows: list[tuple[str, int, int, str]] | None = None
    lim = limiter if limiter is not None else trio.CapacityLimiter(1)
    with trio.move_on_after(max_runtime):
        try:
            rows = await trio.to_thread.run_sync(
                gpu_rows_sync, nvml, limiter=lim, abandon_on_cancel=True
            )
        except GpuError as exc:
            log.debug("NVML unavailable for labels (%s); trying nvidia-smi", exc)
            return None
    if rows is None:
        log.warning("NVML did not answer within %gs; trying nvidia-smi", max_runtime)
        return None
    facts: dict[str, str] = {}
    for i, (model, total, free, driver) in enumerate(rows):
        facts.update(gpu_facts(i, model, str(total), str(free), driver))
    return facts


async def nvidia_labels(
    *,
    max_runtime: float = DEFAULT_TIMEOUT,
    path: str | None = None,
    stop: StopToken | None = None,
    nvml: bool = False,
    nvml_lib: Any | None = None,
    deadline: float = math.inf,
    containment: AnyContainment | None = None,
    nvml_limiter: trio.CapacityLimiter | None = None,
) -> NvidiaFacts:
    """The GPU facts: from NVML first when ``nvml`` (the same rows, without a subprocess),
    else — or when NVML is not usable — from nvidia-smi, queried once through the supervisor
    (own group, ``max_runtime``, 5 s default).

    Not found → ``(None, found=False, broken=False)`` with a DEBUG log. Start error, kill,
    non-zero exit or stdout over 64 KiB → ``(None, True, True)`` with a WARN naming nvidia-smi.
    ``path`` is the search path for the executable (``None``: ``$PATH``). ``deadline`` (an
    absolute ``trio.current_time()``, a pass budget) bounds the nvidia-smi run with a cancel
    scope: past it, nvidia-smi is torn down and reported killed (``cancelled``).

    Cancellation: a trio cancellation tears nvidia-smi down (shielded) and propagates.
    """
    if nvml:
        facts = await nvml_labels(max_runtime, nvml_lib, limiter=nvml_limiter)
        if facts is not None:
            return NvidiaFacts(facts=facts, found=True, broken=False)
    exe = find_nvidia_smi(path)
    if exe is None:
        log.debug("nvidia-smi not found on PATH; no nvidia facts")
        return NvidiaFacts(facts=None, found=False, broken=False)
    out, err = CappedBuffer(OUTPUT_CAP), CappedBuffer(OUTPUT_CAP)
    spec = JobSpec(
        command=[exe, *NVIDIA_QUERY],
        max_runtime=max_runtime,
        stderr_sink=err,
        containment=containment,
        cgroup_key="probe-nvidia-smi",
    )
    kept: list[Result] = []
    with trio.move_on_at(deadline):
        await run(spec, out, stop, record=kept.append)
    result = kept[0]
    report_escapees(exe, result)
    stderr = err.getvalue().decode("utf-8", "replace").strip()
    error = ""
    if result.err is not None:
        error = f"run: {result.err}"
    elif result.killed:
        error = f"killed: {result.reason or 'killed'}"
    elif result.exit_code != 0:
        error = f"exited {result.exit_code}"
    elif out.truncated:
        error = f"stdout exceeded {OUTPUT_CAP} bytes"
    if error:
        if stderr:
            error += f"; stderr: {stderr}"
        log.warning("nvidia-smi failed: %s", error, extra={"source": NVIDIA})
        return NvidiaFacts(facts=None, found=True, broken=True, error=error)
    facts = parse_nvidia_smi(out.getvalue().decode("utf-8", "replace"))
    return NvidiaFacts(facts=facts, found=True, broken=False)


# ---------------------------------------------------------------------------------------------
# Drop-in output (§6.4)
# ---------------------------------------------------------------------------------------------


class ProbeOutputError(ValueError):
    """A drop-in's stdout is not one JSON object; the text is the failure (``parse output: …``)."""


def _reject_constant(name: str) -> Any:
    raise ValueError(f"invalid JSON constant {name}")


_DECODER = json.JSONDecoder(parse_int=str, parse_float=str, parse_constant=_reject_constant)


def parse_probe_output(data: bytes, source: str = "") -> dict[str, str]:
    """One flat JSON object → string facts (§6.4).

    Numbers keep their literal text (``32``, ``1.50``), booleans become ``"true"``/``"false"``,
    ``null`` values are dropped silently, objects and arrays are dropped with a WARN, duplicate
    keys: last wins. A bare ``null`` is an empty object. Raises :class:`ProbeOutputError` for
    anything else (``parse output: …``), including trailing data after the object.
    """
    text = data.decode("utf-8", "replace").strip(" \t\r\n")
    if not text:
        raise ProbeOutputError("parse output: EOF")
    try:
        value, end = _DECODER.raw_decode(text)
    except (ValueError, RecursionError) as exc:
        raise ProbeOutputError(f"parse output: {exc}") from None
    if text[end:].strip(" \t\r\n"):
        raise ProbeOutputError("parse output: trailing data after the JSON object")
    if value is None:
        return {}
    if not isinstance(value, dict):
        kind = "array" if isinstance(value, list) else "scalar"
        raise ProbeOutputError(f"parse output: expected one JSON object, got a {kind}")
    facts: dict[str, str] = {}
    for key, v in value.items():
        if v is None:
            continue
        if isinstance(v, bool):
            facts[key] = "true" if v else "false"
        elif isinstance(v, str):
            facts[key] = v
        else:
            log.warning(
                "probe %s: key %r has a non-scalar value; dropped",
                source,
                key,
                extra={"probe": source, "key": key},
            )
    return facts


# ---------------------------------------------------------------------------------------------
# Key classification (§6.5)
# ---------------------------------------------------------------------------------------------


def classify_key(key: str, devices: Collection[str]) -> tuple[str, str] | None:
    """``("", key)`` for a host fact, ``(device, rest)`` for a device fact, ``None`` if invalid.

    Invalid: ``""``; a dot first or last; ``<p>.<rest>`` where ``p`` (before the first dot) is not
    a declared device — never promoted to a host fact.
    """
    if not key:
        return None
    if "." not in key:
        return ("", key)
    if key[0] == "." or key[-1] == ".":
        return None
    prefix, rest = key.split(".", 1)
    if prefix not in devices:
        return None
    return (prefix, rest)


def merge_facts(
    source: str,
    facts: Mapping[str, str],
    host: dict[str, str],
    device: dict[str, dict[str, str]],
) -> frozenset[str]:
    """Merge one successful source into ``host``/``device`` (later sources overwrite earlier
    ones) and return the devices it named — the source's scope. ``device``'s keys are the
    declared devices; invalid keys are dropped with a WARN."""
    named: set[str] = set()
    for key, value in facts.items():
        where = classify_key(key, device)
        if where is None:
            log.warning(
                "probe source %s: invalid label key %r dropped (empty, dot at an end, or not a "
                "declared device)",
                source,
                key,
                extra={"probe": source, "key": key, "devices": sorted(device)},
            )
            continue
        dev, name = where
        if dev:
            device[dev][name] = value
            named.add(dev)
        else:
            host[name] = value
    return frozenset(named)


# ---------------------------------------------------------------------------------------------
# The Unconfirmed rule (§6.6): sans-IO
# ---------------------------------------------------------------------------------------------


class UnconfirmedTracker:
    """Which devices each probe source speaks for, across passes (§6.6). Plain sync class.

    A pass is ``begin_pass()``, then one call per source outcome — :meth:`merge` (success),
    :meth:`nvidia`, :meth:`dropin_failed`, :meth:`list_failed` — then :meth:`end_pass`, which
    swaps the rebuilt per-source memory in and returns the unconfirmed devices (each with the
    failing sources that speak for it). :meth:`abort_pass` discards a pass (keeps the old memory).

    Warning decisions are returned, not logged: :meth:`dropin_failed` answers whether the
    once-per-episode "clearing" warning is due now.
    """

    def __init__(self, devices: Iterable[str]) -> None:
        self.devices: tuple[str, ...] = tuple(devices)
        self.memory: dict[str, frozenset[str]] = {}
        """The last completed pass's ``source → devices it speaks for``."""
        self.nvidia_seen_at_startup: bool | None = None
        """Recorded once, by the first pass that reports on nvidia-smi."""
        self.warned: set[str] = set()
        """Sources whose "clearing" warning was given in the current episode."""
        self._next: dict[str, frozenset[str]] = {}
        self._unconfirmed: dict[str, list[str]] = {}
        self._in_pass = False

    def begin_pass(self) -> None:
        self._next = {}
        self._unconfirmed = {}
        self._in_pass = True

    def _require_pass(self) -> None:
        if not self._in_pass:
            raise RuntimeError("UnconfirmedTracker: no pass in progress (call begin_pass())")

    def merge(self, source: str, named: Iterable[str]) -> None:
        """A successful source: its scope becomes exactly the devices it named this time."""
        self._require_pass()
        self._next[source] = frozenset(named)
        self.warned.discard(source)

    def unconfirm(self, source: str, scope: Iterable[str]) -> None:
        """A failed source: carry ``scope`` forward unchanged and mark its devices."""
        self._require_pass()
        kept = frozenset(scope)
        self._next[source] = kept
        for dev in sorted(kept):
            sources = self._unconfirmed.setdefault(dev, [])
            if source not in sources:
                sources.append(source)

    def gpu_devices(self) -> frozenset[str]:
        """Declared devices named ``gpu`` + one or more ASCII digits."""
        return frozenset(d for d in self.devices if _GPU_NAME.match(d))

    def nvidia(self, *, found: bool, broken: bool, named: Iterable[str] = ()) -> None:
        """nvidia-smi's outcome this pass (``named``: the devices its facts landed on)."""
        self._require_pass()
        if self.nvidia_seen_at_startup is None:
            self.nvidia_seen_at_startup = found
        if found and not broken:
            self.merge(NVIDIA, named)
        elif broken or self.nvidia_seen_at_startup:
            scope = self.memory.get(NVIDIA) or self.gpu_devices()
            self.unconfirm(NVIDIA, scope)
        # not found and never seen at startup: nothing (labels clear normally)

    def dropin_failed(self, source: str) -> bool:
        """A drop-in failed (run/parse error, stat error, budget skip, unreadable dir).

        Returns ``True`` when the "clearing" warning is due: the carried scope is empty and this
        source was not yet warned in this episode.
        """
        scope = self.memory.get(source, frozenset())
        self.unconfirm(source, scope)
        if scope or source in self.warned:
            return False
        self.warned.add(source)
        return True

    def list_failed(self) -> list[tuple[str, bool]]:
        """The probe dir could not be listed: every drop-in of the previous memory not already
        in this pass's memory fails. Returns ``(source, clearing warning due)`` in name order.

        ``builtin`` and ``nvidia-smi`` are never drop-ins: the spec's "in practice: every
        drop-in" is taken literally, so an nvidia-smi that vanished (never seen at startup)
        after breaking is forgotten rather than failed here (it never warns about clearing)."""
        self._require_pass()
        return [
            (src, self.dropin_failed(src))
            for src in sorted(self.memory)
            if src not in self._next and src not in (BUILTIN, NVIDIA)
        ]

    def scope(self, source: str) -> frozenset[str]:
        """The devices ``source`` currently speaks for (previous pass's memory)."""
        return self.memory.get(source, frozenset())

    def end_pass(self) -> dict[str, tuple[str, ...]]:
        """Swap the rebuilt memory in, prune warning markers of sources absent from it, and
        return ``unconfirmed device → failing sources`` (sorted by device)."""
        self._require_pass()
        self.memory = self._next
        self.warned &= set(self.memory)
        unconfirmed = {d: tuple(s) for d, s in sorted(self._unconfirmed.items())}
        self._next = {}
        self._unconfirmed = {}
        self._in_pass = False
        return unconfirmed

    def abort_pass(self) -> None:
        """Forget a pass that did not complete (keeps the previous memory)."""
        self._next = {}
        self._unconfirmed = {}
        self._in_pass = False


# ---------------------------------------------------------------------------------------------
# A pass and its wire form
# ---------------------------------------------------------------------------------------------


@attrs.frozen
class ProbeResult:
    """One pass (§6.1): ``host`` facts, ``device`` facts (every declared device present, maybe
    empty), ``unconfirmed`` devices; ``unconfirmed_by`` names the failing sources per device."""

    host: dict[str, str]
    device: dict[str, dict[str, str]]
    unconfirmed: frozenset[str] = frozenset()
    unconfirmed_by: dict[str, tuple[str, ...]] = attrs.Factory(dict)

    def omitted(self) -> frozenset[str]:
        """Devices the wire map leaves out: unconfirmed and without facts of their own."""
        return frozenset(d for d in self.unconfirmed if not self.device.get(d))


def labels_payload(result: ProbeResult) -> dict[str, dict[str, str]] | None:
    """The ``labels`` field of a registration or labels push (worker-protocol.md §9.1).

    ``""`` → host facts, present only when there are some; each declared device → its facts,
    ``{}`` when confirmed empty, omitted when unconfirmed without facts; ``None`` when the pass
    produced no facts anywhere (``labels: null``: the controller keeps everything).
    """
    if not result.host and not any(result.device.values()):
        return None
    out: dict[str, dict[str, str]] = {}
    if result.host:
        out[""] = dict(result.host)
    for dev, facts in result.device.items():
        if facts or dev not in result.unconfirmed:
            out[dev] = dict(facts)
    return out


def _probe_error(outcome: ScriptOutcome) -> str:
    """The drop-in failure text (§6.4): ``run: …`` / ``killed: …<note>`` / ``exited n<note>``."""
    result: Result | None = outcome.result
    if result is None:
        return outcome.error
    head = stderr_head(outcome.stderr, outcome.stderr_truncated)
    note = f"; stderr: {head}" if head else ""
    if result.err is not None:
        return f"run: {result.err}"
    if result.killed:
        return f"killed: {result.reason or 'killed'}{note}"
    return f"exited {result.exit_code}{note}"


class Prober:
    """Runs probe passes for one worker and keeps the per-source memory between them.

    ``pass_budget`` (seconds; ≤ 0 or ``inf``: unbounded) is the 30 s whole-pass budget, a test
    hook. ``path`` is the search path for ``nvidia-smi`` (``None``: the worker's ``$PATH`` at
    pass time). ``nvml``: take the GPU facts from NVML when it is usable, nvidia-smi otherwise
    (default: only when ``path`` is ``None`` — an explicit nvidia-smi path means that
    nvidia-smi). Passes are serialised by one lock (registration and the periodic loop).
    """

    def __init__(
        self,
        config: WorkerConfig,
        *,
        pass_budget: float = PASS_BUDGET,
        path: str | None = None,
        nvml: bool | None = None,
    ) -> None:
        self.config = config
        self.devices: tuple[str, ...] = tuple(d.name for d in config.devices)
        self.probe_dir = config.probe_dir
        self.timeout = (
            config.probe_timeout / SECOND if config.probe_timeout > 0 else DEFAULT_TIMEOUT
        )
        self.pass_budget = pass_budget
        self.path = path
        self.nvml = path is None if nvml is None else nvml
        self.tracker = UnconfirmedTracker(self.devices)
        self.lock = trio.Lock()
        # Each blocking resource has a limiter of its own (docs/task-tree.md, "Threads"):
        # a hung one keeps its token, and only its own later calls time out waiting for it.
        self.nvml_limiter = trio.CapacityLimiter(1)
        self.host_limiter = trio.CapacityLimiter(1)
        self.probe_dir_limiter = trio.CapacityLimiter(1)
        self.preserving: set[str] = set()
        """Devices whose "preserving" warning was given in the current omission episode."""
        self.containment: AnyContainment | None = None
        """How nvidia-smi and the drop-ins are contained (each in its own job cgroup
        ``probe-<name>`` under the cgroup backend); the worker sets it at start."""

    async def run_pass(self) -> ProbeResult:
        """One serialised pass (§6.1). A failing or hanging probe costs a label, never raises;
        trio cancellation propagates (and the pass is forgotten)."""
        async with self.lock:
            self.tracker.begin_pass()
            try:
                result = await self._pass()
            except BaseException:
                self.tracker.abort_pass()
                raise
            return result

    async def _pass(self) -> ProbeResult:
        tracker = self.tracker
        budget = self.pass_budget
        bounded = budget > 0 and not math.isinf(budget)
        # The pass budget is one deadline that nvidia-smi and the drop-ins share, each run
        # under a cancel scope with it (never a polled token).
        pass_deadline = trio.current_time() + budget if bounded else math.inf
        host: dict[str, str] = {}
        device: dict[str, dict[str, str]] = {d: {} for d in self.devices}

        builtin = {"cpus": str(len(os.sched_getaffinity(0)))}  # if the reads hang: the rest unread
        with trio.move_on_at(pass_deadline):
            builtin = await trio.to_thread.run_sync(
                builtin_host_facts, limiter=self.host_limiter, abandon_on_cancel=True
            )
        tracker.merge(BUILTIN, merge_facts(BUILTIN, builtin, host, device))

        nv = await nvidia_labels(
            max_runtime=self.timeout,
            path=self.path,
            nvml=self.nvml,
            deadline=pass_deadline,
            containment=self.containment,
            nvml_limiter=self.nvml_limiter,
        )
        if nv.facts is not None:
            tracker.nvidia(
                found=True, broken=False, named=merge_facts(NVIDIA, nv.facts, host, device)
            )
        else:
            tracker.nvidia(found=nv.found, broken=nv.broken)

        scripts = await run_scripts(
            self.probe_dir,
            max_runtime=self.timeout,
            budget=0,
            deadline=pass_deadline,
            cap=OUTPUT_CAP,
            limiter=self.probe_dir_limiter,
            containment=self.containment,
            cgroup_prefix="probe",
        )
        if scripts.list_error is not None:
            log.warning(
                "probe dir unreadable: %s; preserving the devices its probes speak for",
                scripts.list_error,
                extra={"probe_dir": self.probe_dir},
            )
            for source, warn in tracker.list_failed():
                if warn:
                    self._warn_clearing(source)
        for outcome in scripts.outcomes:
            self._dropin(outcome, host, device)
        if scripts.budget_exhausted:
            log.warning(
                "%s (budget %s)",
                BUDGET_PHRASE,
                go_duration_seconds(budget) if bounded else "unbounded",
                extra={"skipped": list(scripts.not_run)},
            )
            for name in scripts.not_run:
                self._dropin_failed(os.path.join(self.probe_dir, name))

        unconfirmed = tracker.end_pass()
        return ProbeResult(
            host=host,
            device=device,
            unconfirmed=frozenset(unconfirmed),
            unconfirmed_by=unconfirmed,
        )

    def _dropin(
        self, outcome: ScriptOutcome, host: dict[str, str], device: dict[str, dict[str, str]]
    ) -> None:
        source = os.path.join(self.probe_dir, outcome.name)
        if outcome.kind is ScriptKind.SKIPPED:
            return  # not executable: silently skipped, forgotten from memory
        facts: dict[str, str] | None = None
        if outcome.kind is ScriptKind.STAT_ERROR:
            problem = f"probe {source}: {outcome.error}"
        elif outcome.kind is ScriptKind.FAILED:
            problem = f"probe {source} failed: {_probe_error(outcome)}"
        elif outcome.stdout_truncated:
            problem = (
                f"probe {source} failed: stdout exceeded {OUTPUT_CAP} bytes; probe misbehaving"
            )
        else:
            try:
                facts = parse_probe_output(outcome.stdout, source)
            except ProbeOutputError as exc:
                problem = f"probe {source} failed: {exc}"
        if facts is None:
            log.warning("%s", problem, extra={"probe": source})
            self._dropin_failed(source)
            return
        self.tracker.merge(source, merge_facts(source, facts, host, device))

    def _dropin_failed(self, source: str) -> None:
        if self.tracker.dropin_failed(source):
            self._warn_clearing(source)

    def _warn_clearing(self, source: str) -> None:
        devices = sorted(self.devices)
        log.warning(
            "%s (probe %s; declared devices %s)",
            CLEARING_PHRASE,
            source,
            ", ".join(devices),
            extra={"probe": source, "devices": devices},
        )

    def wire_labels(self, result: ProbeResult) -> dict[str, dict[str, str]] | None:
        """:func:`labels_payload`, logging the "preserving" warning for each omitted device once
        per episode (again only after the device was sent and then omitted anew)."""
        payload = labels_payload(result)
        omitted = result.omitted()
        for dev in sorted(omitted - self.preserving):
            sources = ", ".join(result.unconfirmed_by.get(dev, ())) or "unknown"
            log.warning(
                "preserving the last known detected labels of device %s: a probe source that "
                "speaks for it failed this pass (%s) and it got no facts of its own, so it is "
                "omitted from the labels payload",
                dev,
                sources,
                extra={"device": dev, "sources": list(result.unconfirmed_by.get(dev, ()))},
            )
        if payload is None:
            self.preserving |= omitted
        else:
            self.preserving = set(omitted)
        return payload


async def gather_labels(prober: Prober) -> ProbeResult:
    """One probe pass (worker-process.md §0.1 ``gather_labels``): :meth:`Prober.run_pass`."""
    return await prober.run_pass()


__all__ = [
    "BUDGET_PHRASE",
    "BUILTIN",
    "CLEARING_PHRASE",
    "DEFAULT_TIMEOUT",
    "NVIDIA",
    "NVIDIA_QUERY",
    "OUTPUT_CAP",
    "PASS_BUDGET",
    "NvidiaFacts",
    "ProbeOutputError",
    "ProbeResult",
    "Prober",
    "UnconfirmedTracker",
    "builtin_host_facts",
    "classify_key",
    "find_nvidia_smi",
    "gather_labels",
    "labels_payload",
    "merge_facts",
    "nvidia_labels",
    "parse_nvidia_smi",
    "parse_probe_output",
]
