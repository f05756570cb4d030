"""Chaos scenarios: seeded fault schedules against a real fleet, and the promise checker.

Three parts (docs/chaos.md):

* :func:`make_schedule` — a pure function of ``(seed, duration)``: a list of :class:`Step`
  (dispatches to the nodes, rc jobs on the workers' devices, ``rc kill``, a crash or a graceful
  stop and restart of a node or worker, a controller restart, link faults). The same seed gives
  the same list, on any machine.
* :func:`run_schedule` — plays a schedule against a fleet from :func:`~fleet_trio.sim.fleet.
  open_fleet`, lets it settle, and collects plain :class:`Records` (what the dispatcher, the
  controller, ``/proc``, the fake GPUs and the launcher saw).
* :func:`check` — synchronous functions over those records, one per promise; each broken
  promise is a :class:`Violation`. No I/O, so they are unit-tested on hand-made records.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
from collections.abc import Callable, Iterable, Mapping, Sequence

import attrs
import trio

from fleet_trio.gpu.fake import read_holdings
from fleet_trio.proc.procfs import list_pids, read_proc_file, read_proc_stat
from fleet_trio.sim.controller import SimError
from fleet_trio.sim.dispatcher import LOST_404
from fleet_trio.sim.fleet import (
    GPU_ROOT_ENV,
    NODE_DRAIN,
    NODE_KILL_GRACE,
    Fleet,
    ProcessEvent,
    ShutdownRecord,
)

# -- the job kinds --------------------------------------------------------------------------

NODE_MARKER = "FLEET_JOB_ID"
RC_MARKER = "RC_JOB_ID"
LEAK_MARKER = "FLEET_TRIO_SIM_LEAK_JOB"
"""Carried by a leaking fake-VRAM holder instead of ``RC_JOB_ID`` (so the sweep misses it)."""

SLEEPER_SECONDS = 1.2
STUBBORN_SECONDS = 2.5
"""How long the node's ``stubborn`` task (it ignores SIGTERM) runs when left alone."""
MARK_LEAD = NODE_KILL_GRACE / 2
"""The interrupted mark comes when the drain ends, before the kill grace: a poller sees it
within the drain plus half the grace after the stop (a mark made after the kill shows only
once the whole grace has passed)."""
TRAP_MARGIN = 0.3
"""Seconds a stubborn job needs after its ack to have its ``trap '' TERM`` in place."""

NODE_KINDS: dict[str, int] = {"quick": 3, "fail": 2, "sleeper": 2, "stubborn": 1, "escape": 1}
"""Node task types of the chaos node and their weight in a schedule."""
RC_KINDS: dict[str, int] = {"lines": 3, "fail": 1, "slow": 2, "escape": 1, "leak": 1}
LINK_FAULT_WINDOW = 1.0
"""Seconds a latency, fail_http or drop fault lasts before the link heals."""
PROCESS_FAULTS = ("node_crash", "node_stop", "worker_crash", "worker_stop", "controller_restart")
LINK_FAULTS = ("latency", "fail_http", "drop", "half_open")

_RUN = 'echo "$FLEET_JOB_ID" >> "$FLEET_TRIO_SIM_NODE_DIR/runs"'


def node_yaml(*, escape_task: bool = True) -> str:
    """The chaos node's config: short drain and grace, one task per node kind. Each run
    appends its job id to ``runs`` in the node's folder (the run counter)."""
    tasks = {
        "quick": f"{_RUN}; echo '{{\"ok\": true}}'",
        "fail": f"{_RUN}; echo boom >&2; exit 3",
        "sleeper": f"{_RUN}; sleep {SLEEPER_SECONDS}; echo '{{\"slept\": true}}'",
        "stubborn": f"trap '' TERM; {_RUN}; sleep {STUBBORN_SECONDS}; echo '{{\"late\": true}}'",
    }
    if escape_task:
        tasks["escape"] = (
            f"{_RUN}; setsid sleep 300 </dev/null >/dev/null 2>&1 & echo '{{\"escaped\": true}}'"
        )
    return shell_tasks_yaml(tasks, drain_ms=int(NODE_DRAIN * 1000), kill_grace_s=NODE_KILL_GRACE)


def shell_tasks_yaml(
    tasks: dict[str, str], *, drain_ms: int, kill_grace_s: float, node_lines: tuple[str, ...] = ()
) -> str:
    """A node config of ``sh -c`` tasks (name → script) with these timings; ``node_lines``
    are more lines under ``node:`` (indented two spaces)."""
    lines = [
        "node:",
        *node_lines,
        "  timings:",
        f"    drain_timeout: {drain_ms}ms",
        f"    kill_grace: {int(kill_grace_s * 1000)}ms",
        "tasks:",
    ]
    for name, script in tasks.items():
        lines += [f"  {name}:", f'    command: ["sh", "-c", {yaml_str(script)}]']
    return "\n".join(lines) + "\n"


def yaml_str(text: str) -> str:
    """``text`` as a double-quoted YAML scalar."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def rc_expected_output(lines: int) -> bytes:
    return b"".join(b"line %d\n" % i for i in range(1, lines + 1))


def rc_command(kind: str, lines: int) -> list[str]:
    """The command of an rc job of ``kind`` printing ``lines`` numbered lines."""
    pause = "0.15" if kind == "slow" else "0.01"
    body = f'i=1; while [ $i -le {lines} ]; do echo "line $i"; i=$((i+1)); sleep {pause}; done'
    if kind == "fail":
        body += "; exit 2"
    elif kind == "escape":
        body = "setsid sleep 300 </dev/null >/dev/null 2>&1 & " + body
    elif kind == "leak":
        # An escaped process (new session, no RC_JOB_ID, so no sweep finds it) holding 1 GiB
        # of the device's fake GPU: the holding file (named after its pid, docs/gpu.md) is
        # written right after the fork, so it exists before the job can end.
        body = (
            f'env -u {RC_MARKER} {LEAK_MARKER}="$RC_JOB_ID" setsid sleep 120 '
            "</dev/null >/dev/null 2>&1 & "
            'echo 1G > "$FLEET_TRIO_SIM_GPU_DIR/$!"; ' + body
        )
    return ["sh", "-c", body]


VERIFY_SCRIPT = f"""#!/bin/sh
# Chaos verify: the device's fake GPU must hold no memory of a live process.
dev=${{RC_DEVICE#*:}}; host=${{RC_DEVICE%%:*}}
dir="${{{GPU_ROOT_ENV}}}/${{host}}_${{dev}}"
for f in "$dir"/*; do
  pid=${{f##*/}}
  case "$pid" in ''|*[!0-9]*) continue;; esac
  if [ -d "/proc/$pid" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$pid/status" 2>/dev/null; then
    echo "fake VRAM still held by pid $pid" >&2
    exit 1
  fi
done
exit 0
"""


# -- the schedule ---------------------------------------------------------------------------


@attrs.frozen
class Step:
    """One scheduled action, ``at`` seconds after the schedule starts."""

    at: float
    action: str
    """``dispatch`` | ``submit`` | ``rc_kill`` | one of :data:`PROCESS_FAULTS` | ``link``."""
    target: str = ""
    """Node or worker name, device id (``chaos-w1:gpu0``), or link name."""
    kind: str = ""
    """Job kind, or link fault kind."""
    ref: str = ""
    """The job's name in the schedule (``n3``, ``r2``); ``rc_kill`` names the job it kills."""
    arg: float = 0.0
    """Lines of an rc job; fault duration or count."""

    def describe(self) -> str:
        parts = [f"{self.at:6.2f}s", self.action]
        for value in (self.target, self.kind, self.ref):
            if value:
                parts.append(value)
        if self.arg:
            parts.append(f"{self.arg:g}")
        return " ".join(parts)


@attrs.frozen
class FleetShape:
    nodes: tuple[str, ...] = ("node1", "node2")
    workers: tuple[str, ...] = ("worker1", "worker2")
    devices: tuple[str, ...] = ("chaos-w1:gpu0", "chaos-w1:gpu1", "chaos-w2:gpu0", "chaos-w2:gpu1")


def _pick(rng: random.Random, weights: Mapping[str, int]) -> str:
    names = list(weights)
    return rng.choices(names, weights=[weights[n] for n in names])[0]


def make_schedule(seed: int, duration: float = 3.0, shape: FleetShape = FleetShape()) -> list[Step]:
    """The schedule of ``seed``: a pure function of its arguments (a private RNG)."""
    rng = random.Random(f"fleet-trio-chaos/{seed}")
    steps: list[Step] = []
    fault = rng.choice(PROCESS_FAULTS)
    fault_at = round(rng.uniform(0.3, 0.7) * duration, 2)
    fault_target = ""
    if fault.startswith("node"):
        fault_target = rng.choice(shape.nodes)
    elif fault.startswith("worker"):
        fault_target = rng.choice(shape.workers)
    steps.append(Step(fault_at, fault, fault_target))
    for i in range(rng.randint(6, 10)):
        kind = _pick(rng, NODE_KINDS)
        at = round(rng.uniform(0, duration), 2)
        if i == 0 and fault == "node_stop":
            # a stubborn job in flight when the node drains: its interrupt must be visible
            kind, at = "stubborn", max(0.0, round(fault_at - rng.uniform(0.3, 1.0), 2))
        steps.append(Step(at, "dispatch", kind=kind, ref=f"n{i + 1}"))
    rc_refs: list[tuple[str, float]] = []
    for i in range(rng.randint(4, 6)):
        kind = _pick(rng, RC_KINDS)
        at = round(rng.uniform(0, duration), 2)
        lines = rng.randint(3, 12) if kind == "slow" else rng.randint(3, 40)
        ref = f"r{i + 1}"
        steps.append(Step(at, "submit", rng.choice(shape.devices), kind, ref, float(lines)))
        rc_refs.append((ref, at))
    for ref, at in rng.sample(rc_refs, k=min(len(rc_refs), rng.randint(0, 2))):
        steps.append(Step(round(at + rng.uniform(0.05, 1.0), 2), "rc_kill", ref=ref))
    links = [f"dispatcher->{n}" for n in shape.nodes] + [f"{w}->controller" for w in shape.workers]
    if fault == "node_stop":  # keep the polls of the draining node clean
        links.remove(f"dispatcher->{fault_target}")
    for _ in range(rng.randint(1, 2)):
        kind = rng.choice(LINK_FAULTS)
        arg = (
            round(rng.uniform(0.3, 1.0), 2)
            if kind in ("latency", "half_open")
            else float(rng.randint(1, 2))
        )
        if kind == "latency":
            arg = round(rng.uniform(0.02, 0.2), 3)
        steps.append(
            Step(round(rng.uniform(0, duration), 2), "link", rng.choice(links), kind, "", arg)
        )
    return sorted(steps, key=lambda s: (s.at, s.action, s.ref))


def link_fault_window(step: Step) -> float:
    """How long a ``link`` step's fault lasts: ``arg`` seconds for ``half_open``, else
    :data:`LINK_FAULT_WINDOW`."""
    return step.arg if step.kind == "half_open" else LINK_FAULT_WINDOW


def format_schedule(seed: int, steps: Sequence[Step]) -> str:
    return "\n".join([f"schedule of seed {seed}:", *("  " + s.describe() for s in steps)])


# -- records (plain values: the checker's input) ---------------------------------------------


@attrs.frozen
class NodeJobRecord:
    """A dispatched job as the dispatcher and the node's run counter saw it."""

    ref: str
    job_id: str
    kind: str
    node: str | None
    """The node that acked it (``None``: nobody did)."""
    acked_at: float | None
    state: str
    """The dispatcher's record state."""
    error: str | None
    states_seen: tuple[str, ...]
    terminal_at: float | None
    runs: Mapping[str, int]
    """node name → how many times the job's command started there."""
    sent_at: float | None = None
    """When the dispatch began (the node may hold the job from then on, before its 202
    reaches the dispatcher); ``None``: use ``acked_at``."""


@attrs.frozen
class RcJobRecord:
    ref: str
    job_id: str
    kind: str
    device: str
    worker: str
    lines: int
    state: str
    """The controller's job state."""
    assigned: bool
    reports: tuple[tuple[str, int | None, str], ...]
    """Every accepted E5 report ``(state, exit_code, reason)``, ``running`` included."""
    log_chunks: tuple[bytes, ...]
    started_at: float | None
    finished_at: float | None
    reason: str = ""
    """The controller's reason for the job's end (``worker lost``, ``cancelled`` …)."""


@attrs.frozen
class MarkedProcess:
    pid: int
    marker: str
    job_id: str


@attrs.frozen
class Holding:
    device: str
    pid: int
    nbytes: int
    job_id: str
    """From the holder's ``FLEET_TRIO_SIM_LEAK_JOB``; ``""`` when unknown."""


@attrs.frozen
class Records:
    seed: int
    began: float
    settled: float
    node_jobs: tuple[NodeJobRecord, ...] = ()
    rc_jobs: tuple[RcJobRecord, ...] = ()
    marked: tuple[MarkedProcess, ...] = ()
    holdings: tuple[Holding, ...] = ()
    quarantined: Mapping[str, str] = attrs.field(factory=dict)
    """device id → the fault reason for devices the controller holds ``unhealthy``/``fault``."""
    process_events: tuple[ProcessEvent, ...] = ()
    shutdowns: tuple[ShutdownRecord, ...] = ()


@attrs.frozen
class Violation:
    promise: str
    """``terminal`` | ``run-once`` | ``report`` | ``output`` | ``sweep`` | ``vram`` |
    ``shutdown``."""
    subject: str
    detail: str

    def __str__(self) -> str:
        return f"[{self.promise}] {self.subject}: {self.detail}"


# -- the checker ------------------------------------------------------------------------------

NL = b"\n"
TERMINAL_NODE = frozenset({"done", "error"})
TERMINAL_RC = frozenset({"succeeded", "failed", "killed", "lost"})


def _disrupted(
    events: Iterable[ProcessEvent],
    process: str,
    since: float | None,
    until: float | None,
    kinds: tuple[str, ...] = ("kill", "term"),
) -> bool:
    """Whether ``process`` was crashed (``kill``) or stopped (``term``) between ``since`` and
    ``until`` (``None``: ever after)."""
    if since is None:
        return False
    return any(
        e.process == process
        and e.kind in kinds
        and e.at >= since
        and (until is None or e.at <= until)
        for e in events
    )


def _first_after(
    events: Iterable[ProcessEvent], process: str, kind: str, since: float
) -> float | None:
    times = [e.at for e in events if e.process == process and e.kind == kind and e.at >= since]
    return min(times) if times else None


def _term_after(events: Iterable[ProcessEvent], process: str, since: float) -> float | None:
    return _first_after(events, process, "term", since)


def check_node_jobs(records: Records) -> list[Violation]:
    """Promise 1: every job acked by a node reaches exactly one terminal state that a poller
    can see, and is run at most once (by that node).

    * the states a poller saw hold at most one terminal state, and nothing after it;
    * no node started the job's command more than once;
    * when the job's node was neither crashed nor stopped while the job was in flight, the
      poller saw a terminal state;
    * a ``stubborn`` job (it ignores SIGTERM) in flight when its node is stopped outlives the
      drain; the node marks it ``error: "interrupted"`` before its kill grace, and a poller
      polling faster than the grace sees that mark.
    """
    out: list[Violation] = []
    events = records.process_events
    for job in records.node_jobs:
        subject = f"node job {job.ref} ({job.job_id})"
        for node, n in job.runs.items():
            if n > 1:
                out.append(Violation("run-once", subject, f"ran {n} times on {node}"))
        if job.node is None:
            continue
        seen_terminal = [s for s in job.states_seen if s in TERMINAL_NODE]
        if len(seen_terminal) > 1:
            out.append(
                Violation(
                    "terminal", subject, f"polls saw several terminal states {job.states_seen}"
                )
            )
        if seen_terminal and job.states_seen[-1] not in TERMINAL_NODE:
            out.append(
                Violation("terminal", subject, f"a state after the terminal one {job.states_seen}")
            )
        visible = bool(seen_terminal) and job.error != LOST_404
        until = job.terminal_at if visible else None
        since = job.sent_at if job.sent_at is not None else job.acked_at
        disrupted = _disrupted(events, job.node, since, until)
        if not disrupted and not visible:
            out.append(
                Violation(
                    "terminal",
                    subject,
                    f"acked by {job.node} but no terminal state was visible to the poller "
                    f"(record {job.state} {job.error or ''}, polls saw {list(job.states_seen)})",
                )
            )
        if job.kind == "stubborn" and job.acked_at is not None and job.runs.get(job.node, 0):
            stop = _term_after(events, job.node, job.acked_at)
            would_end = job.acked_at + STUBBORN_SECONDS
            outlived = stop is not None and would_end > stop + NODE_DRAIN + TRAP_MARGIN
            if not outlived or stop is None:
                continue
            if not (job.error or "").startswith("interrupted"):
                out.append(
                    Violation(
                        "terminal",
                        subject,
                        f"in flight when {job.node} was stopped and outlived the drain, but "
                        f'the poller never saw error "interrupted" (saw '
                        f"{list(job.states_seen)}, record {job.state} {job.error or ''})",
                    )
                )
                continue
            seen_at = job.terminal_at
            if seen_at is not None and seen_at - stop > NODE_DRAIN + MARK_LEAD:
                out.append(
                    Violation(
                        "terminal",
                        subject,
                        f'the poller saw error "interrupted" {seen_at - stop:.2f}s after '
                        f"{job.node} was stopped: the mark must come when the "
                        f"{NODE_DRAIN:g}s drain ends, before the {NODE_KILL_GRACE:g}s kill "
                        "grace, not after the kill",
                    )
                )
    return out


def normalized_log(chunks: Sequence[bytes]) -> tuple[bytes, int]:
    """The job's log with chunk retransmissions removed (a chunk equal to the one before it:
    docs/worker.md, a chunk whose answer was lost is sent again), and how many were."""
    kept: list[bytes] = []
    dupes = 0
    for chunk in chunks:
        if kept and chunk == kept[-1]:
            dupes += 1
            continue
        kept.append(chunk)
    return b"".join(kept), dupes


def check_rc_jobs(records: Records) -> list[Violation]:
    """Promise 2: every rc job assigned to a worker gets exactly one terminal report, and its
    output arrives in order and complete up to that report.

    * every terminal report of a job says the same thing (a retransmission after a lost answer
      is the same report; two different outcomes are a violation);
    * an assigned job whose worker was neither crashed nor stopped while it ran, and that the
      worker acknowledged (``running``), has a terminal report;
    * the log (retransmitted chunks removed) is a prefix of the numbered lines, in order, and all
      of them when the job ended ``succeeded`` or ``failed`` by its own exit.
    """
    out: list[Violation] = []
    for job in records.rc_jobs:
        subject = f"rc job {job.ref} ({job.job_id} on {job.device})"
        terminal = [r for r in job.reports if r[0] != "running"]
        if len({r for r in terminal}) > 1:
            out.append(Violation("report", subject, f"different terminal reports {terminal}"))
        acknowledged = any(r[0] == "running" for r in job.reports)
        crashed = _disrupted(records.process_events, job.worker, job.started_at, None, ("kill",))
        if job.assigned and acknowledged and not terminal and not crashed:
            out.append(
                Violation(
                    "report",
                    subject,
                    f"assigned and running, but no terminal report (controller: {job.state} "
                    f"{job.reason!r})",
                )
            )
        log, _ = normalized_log(job.log_chunks)
        expected = rc_expected_output(job.lines)
        if not expected.startswith(log):
            out.append(
                Violation("output", subject, f"log is not an in-order prefix: {log[-200:]!r}")
            )
        elif (
            terminal
            and terminal[0][0] in ("succeeded", "failed")
            and terminal[0][1] in (0, 2)
            and log != expected
        ):
            out.append(
                Violation(
                    "output",
                    subject,
                    f"ended {terminal[0][0]} but the log has {log.count(NL)} of {job.lines} lines",
                )
            )
    return out


def check_sweep(records: Records) -> list[Violation]:
    """Promise 3a: no process carrying a job's marker survives the job's end, for every job
    whose supervisor reported its end (a node poll saw it terminal, or the worker reported
    it). Survivors of a crashed supervisor are not covered (nobody is left to sweep)."""
    ended: set[str] = set()
    for job in records.node_jobs:
        if job.state in TERMINAL_NODE and job.error != LOST_404:
            ended.add(job.job_id)
    for rc in records.rc_jobs:
        if any(r[0] != "running" for r in rc.reports):
            ended.add(rc.job_id)
    return [
        Violation(
            "sweep",
            f"job {p.job_id}",
            f"pid {p.pid} carrying {p.marker}={p.job_id} outlived the job's end",
        )
        for p in records.marked
        if p.job_id in ended and p.marker in (NODE_MARKER, RC_MARKER)
    ]


def check_vram(records: Records) -> list[Violation]:
    """Promise 3b: no fake VRAM stays held by a finished job without its device being
    quarantined by the verify pass (a fault whose reason starts with ``verify failed``)."""
    reported = {rc.job_id for rc in records.rc_jobs if any(r[0] != "running" for r in rc.reports)}
    out: list[Violation] = []
    for h in records.holdings:
        if h.job_id and h.job_id not in reported:
            continue  # its worker never concluded the job (crashed): no verify ran
        reason = records.quarantined.get(h.device, "")
        if not reason.startswith("verify failed"):
            out.append(
                Violation(
                    "vram",
                    h.device,
                    f"pid {h.pid} holds {h.nbytes} bytes (job {h.job_id or '?'}) and the "
                    f"device is not quarantined by verify ({reason or 'not quarantined'})",
                )
            )
    return out


def check_shutdowns(records: Records) -> list[Violation]:
    """Promise 4: every graceful shutdown completed within its documented bound."""
    return [
        Violation(
            "shutdown",
            s.process,
            f"took {s.seconds:.2f}s, bound {s.bound:g}s"
            + (" (did not exit: killed)" if s.exit_code is None else ""),
        )
        for s in records.shutdowns
        if s.exit_code is None or s.seconds > s.bound
    ]


CHECKS: tuple[Callable[[Records], list[Violation]], ...] = (
    check_node_jobs,
    check_rc_jobs,
    check_sweep,
    check_vram,
    check_shutdowns,
)


def check(records: Records) -> list[Violation]:
    """Every promise over ``records``; an empty list when all hold."""
    out: list[Violation] = []
    for fn in CHECKS:
        out.extend(fn(records))
    return out


# -- the runner --------------------------------------------------------------------------------

SETTLE_TIMEOUT = 15.0


@attrs.define
class SeedResult:
    seed: int
    schedule: list[Step]
    records: Records
    violations: list[Violation]
    notes: list[str]
    seconds: float

    @property
    def ok(self) -> bool:
        return not self.violations


def _scan_markers(job_ids: set[str]) -> list[MarkedProcess]:
    """Live processes whose environment carries one of ``job_ids`` (blocking /proc walk)."""
    found: list[MarkedProcess] = []
    keys = (
        (NODE_MARKER, b"FLEET_JOB_ID="),
        (RC_MARKER, b"RC_JOB_ID="),
        (LEAK_MARKER, b"FLEET_TRIO_SIM_LEAK_JOB="),
    )
    for pid in list_pids() or []:
        st = read_proc_stat(pid)
        if st is None or st.state == "Z":
            continue
        try:
            environ = read_proc_file(f"/proc/{pid}/environ")
        except OSError:
            continue
        for entry in environ.split(b"\0"):
            for name, key in keys:
                if entry.startswith(key):
                    value = entry[len(key) :].decode(errors="replace")
                    if value in job_ids:
                        found.append(MarkedProcess(pid, name, value))
    return found


def _holder_job(pid: int) -> str:
    try:
        environ = read_proc_file(f"/proc/{pid}/environ")
    except OSError:
        return ""
    key = LEAK_MARKER.encode() + b"="
    for entry in environ.split(b"\0"):
        if entry.startswith(key):
            return entry[len(key) :].decode(errors="replace")
    return ""


def _holdings(gpu_dirs: Mapping[str, str]) -> list[Holding]:
    out: list[Holding] = []
    for device, directory in gpu_dirs.items():
        try:
            held = read_holdings(directory)
        except Exception:
            continue
        for pid, nbytes in sorted(held.items()):
            out.append(Holding(device, pid, nbytes, _holder_job(pid)))
    return out


class _Play:
    """The state of one schedule being played."""

    def __init__(self, fleet: Fleet, seed: int, say: Callable[[str], None]) -> None:
        self.fleet = fleet
        self.seed = seed
        self.say = say
        self.node_refs: dict[str, tuple[str, str]] = {}
        """ref → (job id, kind)."""
        self.sent_at: dict[str, float] = {}
        """node job id → when its dispatch began."""
        self.rc_refs: dict[str, tuple[str, str, str, int]] = {}
        """ref → (job id, kind, device, lines)."""
        self.notes: list[str] = []
        self.restarting: set[str] = set()

    async def step(self, s: Step) -> None:
        fleet = self.fleet
        if s.action == "dispatch":
            job_id = f"s{self.seed}-{s.ref}"
            self.node_refs[s.ref] = (job_id, s.kind)
            self.sent_at[job_id] = trio.current_time()
            rec = await fleet.dispatcher.submit(s.kind, job_id=job_id)
            if rec.state == "unplaced":
                self.notes.append(f"{s.ref}: unplaced ({rec.error})")
        elif s.action == "submit":
            env = {"FLEET_TRIO_SIM_GPU_DIR": fleet.gpu_dirs[s.target]}
            try:
                job_id = fleet.ctrl.submit(
                    s.target, rc_command(s.kind, int(s.arg)), env=env, submitter="chaos@sim"
                )
            except SimError as exc:
                self.notes.append(f"{s.ref}: not submitted ({exc})")
                return
            self.rc_refs[s.ref] = (job_id, s.kind, s.target, int(s.arg))
        elif s.action == "rc_kill":
            ref = self.rc_refs.get(s.ref)
            if ref is not None:
                fleet.ctrl.kill(ref[0])
        elif s.action == "link":
            links = [*fleet.node_links.values(), *fleet.worker_links.values()]
            link = next(lk for lk in links if lk.name == s.target)
            link.drop_all()
            if s.kind == "latency":
                link.latency(s.arg)
            elif s.kind == "fail_http":
                link.fail_http(503, int(s.arg))
            elif s.kind == "drop":
                link.drop(int(s.arg))
            elif s.kind == "half_open":
                link.half_open(s.arg)
            # The fault lasts its window, then the link heals (connections held half-open
            # are closed): a partition longer than the controller's patience is not a fault
            # of the worker.
            await trio.sleep(link_fault_window(s))
            link.heal()
        elif s.action == "controller_restart":
            fleet.restart_controller(down_for=0.3)
        elif s.action in ("node_crash", "node_stop", "worker_crash", "worker_stop"):
            proc = fleet.node(s.target) if s.action.startswith("node") else fleet.worker(s.target)
            self.restarting.add(proc.name)
            try:
                if s.action.endswith("crash"):
                    await proc.kill(signal.SIGKILL)
                else:
                    await proc.stop()
                await proc.start()
            finally:
                self.restarting.discard(proc.name)
        else:  # pragma: no cover - make_schedule never produces it
            raise ValueError(f"unknown step {s.action!r}")


async def _settle(fleet: Fleet, play: _Play) -> None:
    """Heal every link, restart what is down, then wait (bounded) until every dispatched job
    is terminal at the dispatcher and every assigned rc job terminal at the controller."""
    for link in [*fleet.node_links.values(), *fleet.worker_links.values()]:
        link.heal()
    for proc in [*fleet.nodes, *fleet.workers]:
        if not proc.running:
            await proc.start()
    node_ids = [job_id for job_id, _ in play.node_refs.values()]

    def node_done() -> bool:
        recs = [fleet.dispatcher.record(j) for j in node_ids if _known(fleet, j)]
        return all(r.terminal for r in recs)

    rc_ids = [v[0] for v in play.rc_refs.values()]

    def rc_done() -> bool:
        return all(
            fleet.ctrl.job(j).state in TERMINAL_RC or fleet.ctrl.job(j).state == "queued"
            for j in rc_ids
        )

    with trio.move_on_after(SETTLE_TIMEOUT) as waited:
        await fleet.dispatcher.wait_for(node_done, timeout=SETTLE_TIMEOUT)
        await fleet.ctrl.wait_for(rc_done, timeout=SETTLE_TIMEOUT)
    if waited.cancelled_caught:
        play.notes.append(f"did not settle within {SETTLE_TIMEOUT:g}s")
    for j in rc_ids:
        if fleet.ctrl.job(j).state == "queued":
            fleet.ctrl.kill(j)  # its device is quarantined or busy: not assigned, not checked


def _known(fleet: Fleet, job_id: str) -> bool:
    try:
        fleet.dispatcher.record(job_id)
    except KeyError:
        return False
    return True


def _read_runs(fleet: Fleet) -> dict[str, dict[str, int]]:
    """job id → node name → runs, from each node's ``runs`` file (blocking)."""
    out: dict[str, dict[str, int]] = {}
    for node in fleet.nodes:
        path = os.path.join(fleet.root, node.name, "runs")
        try:
            with open(path) as f:
                lines = f.read().split()
        except FileNotFoundError:
            continue
        for job_id in lines:
            per = out.setdefault(job_id, {})
            per[node.name] = per.get(node.name, 0) + 1
    return out


def _collect(
    fleet: Fleet,
    play: _Play,
    began: float,
    runs: Mapping[str, Mapping[str, int]],
    marked: Sequence[MarkedProcess],
    holdings: Sequence[Holding],
    shutdowns_before: int,
) -> Records:
    url_to_node = {fleet.node_links[n.name].url: n.name for n in fleet.nodes}
    node_jobs = []
    for ref, (job_id, kind) in sorted(play.node_refs.items()):
        if not _known(fleet, job_id):
            continue
        r = fleet.dispatcher.record(job_id)
        node_jobs.append(
            NodeJobRecord(
                ref=ref,
                job_id=job_id,
                kind=kind,
                node=url_to_node.get(r.node or ""),
                acked_at=r.acked_at,
                state=r.state,
                error=r.error,
                states_seen=tuple(r.states_seen),
                terminal_at=r.terminal_at,
                runs=dict(runs.get(job_id, {})),
                sent_at=play.sent_at.get(job_id),
            )
        )
    host_to_worker = {w.host: w.name for w in fleet.workers}
    rc_jobs = []
    for ref, (job_id, kind, device, lines) in sorted(play.rc_refs.items()):
        job = fleet.ctrl.job(job_id)
        rc_jobs.append(
            RcJobRecord(
                ref=ref,
                job_id=job_id,
                kind=kind,
                device=device,
                worker=host_to_worker.get(device.split(":", 1)[0], ""),
                lines=lines,
                state=job.state,
                assigned=job.started_at is not None,
                reports=tuple(
                    (rep.state, rep.exit_code, rep.reason)
                    for rep in fleet.ctrl.status_reports(job_id)
                ),
                log_chunks=tuple(fleet.ctrl.log_chunks(job_id)),
                started_at=job.started_at,
                finished_at=job.finished_at,
                reason=job.kill_reason,
            )
        )
    quarantined = {
        d.device_id: d.detail or d.reason
        for d in fleet.ctrl.devices()
        if d.state == "unhealthy" and d.reason == "fault"
    }
    return Records(
        seed=play.seed,
        began=began,
        settled=trio.current_time(),
        node_jobs=tuple(node_jobs),
        rc_jobs=tuple(rc_jobs),
        marked=tuple(marked),
        holdings=tuple(holdings),
        quarantined=quarantined,
        process_events=tuple(e for e in fleet.events if e.at >= began),
        shutdowns=tuple(fleet.shutdowns[shutdowns_before:]),
    )


def _kill_pids(pids: Iterable[int]) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _cleanup(fleet: Fleet, records: Records, notes: list[str]) -> None:
    """Leave the fleet as the next seed expects it: no leftovers, every device ready."""
    leftovers = {p.pid for p in records.marked} | {h.pid for h in records.holdings}
    if leftovers:
        notes.append(f"killed {len(leftovers)} leftover process(es) {sorted(leftovers)}")
        _kill_pids(leftovers)
    for dev in fleet.ctrl.devices():
        if dev.state == "unhealthy":
            try:
                fleet.ctrl.clear(dev.device_id)
            except SimError as exc:
                notes.append(f"could not clear {dev.device_id}: {exc}")


async def run_schedule(
    fleet: Fleet,
    seed: int,
    schedule: Sequence[Step],
    *,
    say: Callable[[str], None] = lambda line: None,
) -> SeedResult:
    """Play ``schedule`` against ``fleet``, settle, collect, check, clean up."""
    play = _Play(fleet, seed, say)
    await fleet.wait_healthy()
    began = trio.current_time()
    shutdowns_before = len(fleet.shutdowns)
    async with trio.open_nursery() as nursery:
        for s in schedule:
            await trio.sleep_until(began + s.at)
            say(f"seed {seed}: {s.describe()}")
            nursery.start_soon(play.step, s, name=f"step {s.describe()}")
    await _settle(fleet, play)
    job_ids = {j for j, _ in play.node_refs.values()} | {v[0] for v in play.rc_refs.values()}
    runs = await trio.to_thread.run_sync(_read_runs, fleet)
    marked = await trio.to_thread.run_sync(_scan_markers, job_ids)
    holdings = await trio.to_thread.run_sync(_holdings, fleet.gpu_dirs)
    records = _collect(fleet, play, began, runs, marked, holdings, shutdowns_before)
    violations = check(records)
    notes = list(play.notes)
    for job in records.node_jobs:
        if len([n for n, c in job.runs.items() if c]) > 1:
            notes.append(f"{job.ref}: ran on {sorted(job.runs)} (an ack lost on the wire)")
    for rc in records.rc_jobs:
        _, dupes = normalized_log(rc.log_chunks)
        if dupes:
            notes.append(f"{rc.ref}: {dupes} log chunk(s) sent again after a lost answer")
    _cleanup(fleet, records, notes)
    return SeedResult(
        seed=seed,
        schedule=list(schedule),
        records=records,
        violations=violations,
        notes=notes,
        seconds=trio.current_time() - began,
    )


async def run_seed(
    fleet: Fleet,
    seed: int,
    duration: float = 3.0,
    *,
    say: Callable[[str], None] = lambda line: None,
) -> SeedResult:
    return await run_schedule(fleet, seed, make_schedule(seed, duration), say=say)


def verdict(result: SeedResult, duration: float) -> str:
    """The human verdict of one seed; on failure the schedule and how to reproduce it."""
    if result.ok:
        return f"seed {result.seed}: every promise held ({result.seconds:.1f}s)"
    lines = [f"seed {result.seed}: {len(result.violations)} broken promise(s):"]
    lines += [f"  {v}" for v in result.violations]
    lines += [format_schedule(result.seed, result.schedule)]
    lines += [f"  note: {n}" for n in result.notes]
    lines += [
        f"reproduce: fleet-trio sim chaos --seed {result.seed} --duration {duration:g}",
    ]
    return "\n".join(lines)


__all__ = [
    "CHECKS",
    "VERIFY_SCRIPT",
    "FleetShape",
    "Holding",
    "MarkedProcess",
    "NodeJobRecord",
    "RcJobRecord",
    "Records",
    "SeedResult",
    "Step",
    "Violation",
    "check",
    "check_node_jobs",
    "check_rc_jobs",
    "check_shutdowns",
    "check_sweep",
    "check_vram",
    "format_schedule",
    "make_schedule",
    "node_yaml",
    "normalized_log",
    "rc_command",
    "rc_expected_output",
    "run_schedule",
    "run_seed",
    "shell_tasks_yaml",
    "verdict",
    "yaml_str",
]
