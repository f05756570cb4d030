"""The chaos runner: :func:`run_schedule` plays a schedule against a fleet from
:func:`~fleet_trio.sim.fleet.open_fleet`, lets it settle and collects the :class:`Records`;
:func:`run_seed` and :func:`verdict` wrap it for one seed."""

from __future__ import annotations

import collections
import contextlib
import os
import secrets
import signal
from collections.abc import Callable, Iterable, Mapping, Sequence

import attrs
import trio

from fleet_trio.gpu.fake import read_holdings
from fleet_trio.proc.procfs import (
    env_marker_value,
    list_pids,
    read_environ,
    read_proc_stat,
    stat_live,
)
from fleet_trio.sim.chaos.checker import (
    Holding,
    MarkedProcess,
    NodeJobRecord,
    RcJobRecord,
    Records,
    Violation,
    check,
    normalized_log,
)
from fleet_trio.sim.chaos.schedule import (
    LEAK_MARKER,
    NODE_MARKER,
    RC_MARKER,
    Step,
    format_schedule,
    link_fault_window,
    make_schedule,
    rc_command,
)
from fleet_trio.sim.controller import SimError
from fleet_trio.sim.controller.records import TERMINAL
from fleet_trio.sim.fleet import Fleet

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


def _environ(pid: int) -> bytes:
    """``pid``'s environment block (empty when it cannot be read)."""
    try:
        return read_environ(pid)
    except OSError:
        return b""


def scan_markers(job_ids: set[str]) -> list[MarkedProcess]:
    """Live processes whose environment carries one of ``job_ids`` (blocking /proc walk)."""
    found: list[MarkedProcess] = []
    for pid in list_pids() or []:
        st = read_proc_stat(pid)
        if st is None or not stat_live(st):
            continue
        environ = _environ(pid)
        for name in (NODE_MARKER, RC_MARKER, LEAK_MARKER):
            value = env_marker_value(environ, f"{name}=".encode())
            if value in job_ids:
                found.append(MarkedProcess(pid, name, value))
    return found


def _holdings(gpu_dirs: Mapping[str, str]) -> list[Holding]:
    out: list[Holding] = []
    for device, directory in gpu_dirs.items():
        try:
            held = read_holdings(directory)
        except Exception:
            continue
        for pid, nbytes in sorted(held.items()):
            job = env_marker_value(_environ(pid), f"{LEAK_MARKER}=".encode())
            out.append(Holding(device, pid, nbytes, job))
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
        self.run = secrets.token_hex(4)
        """This play's token in its node job ids (:meth:`node_job_id`)."""

    def node_job_id(self, ref: str) -> str:
        """``s<seed>-<token>-<ref>``: the survivors are looked for across the whole host by
        job id (:func:`scan_markers`), so an id is this play's alone; made of the seed and ref
        alone, it was carried as well by the jobs of another run of the same seed on the
        machine, taken for survivors (issue 25). An rc job's id is the controller's UUID."""
        return f"s{self.seed}-{self.run}-{ref}"

    async def step(self, s: Step) -> None:
        fleet = self.fleet
        if s.action == "dispatch":
            job_id = self.node_job_id(s.ref)
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
        return all(r.terminal for j in node_ids if (r := fleet.dispatcher.find(j)))

    rc_ids = [v[0] for v in play.rc_refs.values()]

    def rc_done() -> bool:
        return all(
            fleet.ctrl.job(j).state in TERMINAL or fleet.ctrl.job(j).state == "queued"
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


def read_runs(node_dir: str) -> dict[str, int]:
    """job id → runs, from a chaos node's ``runs`` file (blocking; none when it is missing)."""
    try:
        with open(os.path.join(node_dir, "runs")) as f:
            return dict(collections.Counter(f.read().split()))
    except FileNotFoundError:
        return {}


def _read_runs(fleet: Fleet) -> dict[str, dict[str, int]]:
    """job id → node name → runs, from each node's ``runs`` file (blocking)."""
    out: dict[str, dict[str, int]] = {}
    for node in fleet.nodes:
        for job_id, runs in read_runs(os.path.join(fleet.root, node.name)).items():
            out.setdefault(job_id, {})[node.name] = runs
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
        r = fleet.dispatcher.find(job_id)
        if r is None:
            continue
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


def kill_pids(pids: Iterable[int]) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _cleanup(fleet: Fleet, records: Records, notes: list[str]) -> None:
    """Leave the fleet as the next seed expects it: no leftovers, every device ready."""
    leftovers = {p.pid for p in records.marked} | {h.pid for h in records.holdings}
    if leftovers:
        notes.append(f"killed {len(leftovers)} leftover process(es) {sorted(leftovers)}")
        kill_pids(leftovers)
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
    marked = await trio.to_thread.run_sync(scan_markers, job_ids)
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


__all__ = ["SeedResult", "run_schedule", "run_seed", "verdict"]
