"""The shutdown-bound chaos scenario: every peer misbehaves, the process still exits in time.

(Over 500 lines: one scenario: its plan, its two role players and its checker share the stop record
they produce and judge.)

One seed is one real process (a node on even seeds, a worker on odd ones) started through the
sim's role launcher (``fleet_trio.sim.roles``), given jobs, then stopped with SIGTERM while:

* a websocket tail client reads nothing (:mod:`fleet_trio.sim.stall`) from a job that floods
  its output (so the server's writes to that client are blocked);
* a job ignores SIGTERM (only the SIGKILL after the kill grace ends it);
* worker: the controller stops answering (a half-open link) before the signal, for a window
  or until the worker has exited;
* node, with ``hung_gpu``: the fake GPU's queries hang (``hang`` file, docs/gpu.md);
* sometimes a second SIGTERM follows the first.

The checks (:func:`check_stop`, pure): the process exits (code 0) within its documented bound
(:data:`NODE_BOUND`, :func:`worker_bound`); every acked job ends with exactly one terminal
state (node: as its pollers saw it while the node ran; worker: as the controller has it, a
``lost`` once the worker is gone included); no process carrying a job's marker survives.

:func:`make_stop_plan` is a pure function of the seed. :func:`run_stop_seeds` plays many seeds,
a few at a time (most of a seed is waiting).
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable, Sequence

import attrs
import httpx
import trio

from fleet_trio.gpu.fake import HANG_FILE, init_device
from fleet_trio.sim.chaos.checker import MarkedProcess, Violation
from fleet_trio.sim.chaos.runner import kill_pids, scan_markers
from fleet_trio.sim.chaos.schedule import NODE_MARKER, RC_MARKER, shell_tasks_yaml
from fleet_trio.sim.controller import SimController, serve_controller
from fleet_trio.sim.controller.records import TERMINAL
from fleet_trio.sim.dispatcher import NODE_TERMINAL
from fleet_trio.sim.faults import FaultyLink, serve_link
from fleet_trio.sim.fleet import (
    ROLE_LAUNCHER,
    RoleProcess,
    free_port,
    node_stop_bound,
    wait_exit,
    worker_yaml,
)
from fleet_trio.sim.roles import worker_timings
from fleet_trio.sim.stall import StalledTailClient, open_stalled_tail, wait_server_blocked
from fleet_trio.sim.zygote import open_zygote
from fleet_trio.worker.worker import shutdown_bound

NODE_DRAIN = 0.5
NODE_KILL_GRACE = 1.0
NODE_LINGER = 1.0
NODE_BOUND = node_stop_bound(NODE_DRAIN, NODE_KILL_GRACE, NODE_LINGER)
"""docs/node.md "Stopping" for this scenario's node (drain 500ms, kill grace 1s, poll linger 1s:
a poller sees the interrupted mark at least that long before the exit, a second SIGTERM or
not)."""

WORKER_DRAIN = 1.0
WORKER_KILL_GRACE = 0.5
WORKER_HURRY = 0.5
WORKER_LAUNCHER_ARGS = (
    f"--worker-drain={WORKER_DRAIN}",
    f"--worker-kill-grace={WORKER_KILL_GRACE}",
    f"--worker-hurry={WORKER_HURRY}",
)


class PortTaken(Exception):
    """The role could not listen on the port picked for it (someone else took it)."""


class NotReady(Exception):
    """The seed's preconditions (its role serving, its jobs running) did not come within
    :data:`READY_TIMEOUT` (a machine loaded far past the scenario's own load): no verdict, the
    seed is played again."""


def worker_bound() -> float:
    """docs/worker.md "Stopping" for this scenario's worker timings."""
    return shutdown_bound(worker_timings(WORKER_DRAIN, WORKER_KILL_GRACE, WORKER_HURRY))


FLOOD = "head -c 400000 /dev/urandom"
"""Enough binary output to block the writes to a tail client that reads nothing."""
JOB_SCRIPTS = {
    "stubborn": f"trap '' TERM; {FLOOD}; sleep 30",
    "slow": f"{FLOOD}; sleep 1.5",
    "quick": "echo '{\"ok\": true}'",
}
"""The jobs (``sh -c``), for both roles: node tasks and rc commands. ``stubborn`` ignores
SIGTERM (the ignore survives the ``exec`` of ``sleep``)."""
NODE_STDERR = {"stubborn": ">&2", "slow": ">&2", "quick": ""}

READY_TIMEOUT = 30.0
SEED_TRIES = 3
"""How often a seed is played when its start fails for a reason that is not the role's
(:class:`PortTaken`, :class:`NotReady`)."""
SETTLE_TIMEOUT = 10.0
POLL_INTERVAL = 0.05

WORKER_LOST_AFTER = 3.0
"""Seconds of heartbeat silence before a worker seed's controller calls its jobs ``lost``: six
heartbeats, so that a worker starved of CPU for a moment (many seeds at once on two loaded
cores) is not taken for gone while it reports its killed jobs; a silenced link still ends
them ``lost`` well within :data:`SETTLE_TIMEOUT`."""


@attrs.frozen
class StopPlan:
    seed: int
    role: str
    """``node`` (even seeds) or ``worker`` (odd seeds)."""
    jobs: tuple[str, ...]
    """Job kinds; the first one floods its output and gets the stalled tail reader."""
    stalled: int
    """Stalled tail readers (1 or 2) on the first job."""
    term_after: float
    """Seconds after the stalled readers are in place that SIGTERM comes."""
    second_term: float | None
    """Seconds after the first SIGTERM that a second one comes (``None``: none)."""
    silence: str
    """Worker: ``never`` | ``window`` | ``until_exit``: the controller stops answering just
    before the SIGTERM (for ``silence_window`` seconds, or until the worker has exited)."""
    silence_window: float
    hung_gpu: bool
    """Node: the fake GPU's queries hang from while the jobs run (their VRAM samples included)
    through the SIGTERM."""

    def describe(self) -> str:
        parts = [
            f"seed {self.seed}: {self.role}",
            f"jobs {','.join(self.jobs)}",
            f"{self.stalled} stalled tail reader(s)",
            f"SIGTERM after {self.term_after:.2f}s",
        ]
        if self.second_term is not None:
            parts.append(f"second SIGTERM {self.second_term:.2f}s later")
        if self.role == "worker" and self.silence != "never":
            what = f"{self.silence_window:.2f}s" if self.silence == "window" else "until exit"
            parts.append(f"controller silent {what}")
        if self.hung_gpu:
            parts.append("GPU queries hang")
        return "; ".join(parts)


async def _stop_all(proc: RoleProcess, stalled: Sequence[StalledTailClient]) -> None:
    """A seed's end, whatever happened: the stalled readers go, a role still running is
    killed and reaped."""
    for client in stalled:
        client.close()
    if proc.returncode is None:
        proc.kill()
        await proc.wait()


def make_stop_plan(seed: int, *, hung_gpu: bool = False) -> StopPlan:
    """The plan of ``seed`` (pure). ``hung_gpu`` switches the node's hung-GPU fault on."""
    rng = random.Random(f"stop-{seed}")
    role = "node" if seed % 2 == 0 else "worker"
    first = rng.choice(["stubborn", "stubborn", "slow"])
    jobs = [first]
    if role == "node":
        jobs += rng.sample(["stubborn", "slow", "quick"], rng.randint(0, 2))
    elif rng.random() < 0.6:
        jobs.append(rng.choice(["stubborn", "slow", "quick"]))
    silence = rng.choice(["never", "window", "until_exit"])
    return StopPlan(
        seed=seed,
        role=role,
        jobs=tuple(jobs),
        stalled=rng.choice([1, 1, 2]),
        term_after=round(rng.uniform(0.0, 0.6), 2),
        second_term=round(rng.uniform(0.2, 2.5), 2) if rng.random() < 0.3 else None,
        silence=silence if role == "worker" else "never",
        silence_window=round(rng.uniform(0.3, 2.0), 2),
        hung_gpu=hung_gpu and role == "node" and rng.random() < 0.5,
    )


@attrs.frozen
class StopRecord:
    plan: StopPlan
    exit_code: int | None
    """``None``: still running at the bound (then killed)."""
    seconds: float
    """From the first SIGTERM to the exit (or to the bound)."""
    bound: float
    jobs: dict[str, tuple[str, ...]]
    """Acked job id → the terminal states it showed, in order, repeats kept (node: what the
    pollers saw while the node ran; worker: the worker's terminal reports as the controller
    received them)."""
    marked: tuple[MarkedProcess, ...]
    final: dict[str, str] = attrs.field(factory=dict)
    """Worker: acked job id → the controller's state of it once settled (a ``lost`` when no
    report got through before the worker was written off). Node: empty."""
    notes: tuple[str, ...] = ()
    output_tail: str = ""


def check_stop(record: StopRecord) -> list[Violation]:
    """The three promises of the scenario over one record (no I/O)."""
    out: list[Violation] = []
    name = f"{record.plan.role} (seed {record.plan.seed})"
    if record.exit_code is None:
        out.append(Violation("shutdown", name, f"still running {record.bound:g}s after SIGTERM"))
    elif record.exit_code != 0:
        out.append(Violation("shutdown", name, f"exit code {record.exit_code}"))
    elif record.seconds > record.bound:
        out.append(
            Violation("shutdown", name, f"took {record.seconds:.2f}s (bound {record.bound:g}s)")
        )
    for job_id, states in sorted(record.jobs.items()):
        distinct = sorted(set(states))
        final = record.final.get(job_id)
        if len(distinct) > 1:
            out.append(Violation("terminal", f"job {job_id}", f"terminal states {distinct}"))
        elif record.plan.role == "node" and not distinct:
            out.append(Violation("terminal", f"job {job_id}", "no terminal state seen"))
        elif record.plan.role == "worker" and final not in TERMINAL:
            out.append(Violation("terminal", f"job {job_id}", f"ended {final!r} at the controller"))
    for p in record.marked:
        out.append(
            Violation("sweep", f"job {p.job_id}", f"pid {p.pid} ({p.marker}) survived the exit")
        )
    return out


# -- playing one seed --------------------------------------------------------------------------


async def _record(
    plan: StopPlan,
    marker: str,
    log_path: str,
    notes: list[str],
    code: int | None,
    took: float,
    bound: float,
    jobs: dict[str, tuple[str, ...]],
    final: dict[str, str] | None = None,
) -> StopRecord:
    """The seed's record. Processes of its jobs still alive after it are SIGKILLed now; those
    carrying ``marker`` (the role's own job marker) are kept in it."""
    marked = await trio.to_thread.run_sync(scan_markers, set(jobs))
    if marked:
        kill_pids(p.pid for p in marked)
    return StopRecord(
        plan=plan,
        exit_code=code,
        seconds=took,
        bound=bound,
        jobs=jobs,
        marked=tuple(p for p in marked if p.marker == marker),
        final=final or {},
        notes=tuple(notes),
        output_tail=_read_tail(log_path),
    )


def _exited(proc: RoleProcess) -> bool:
    return proc.returncode is not None


async def _second_term(proc: RoleProcess, after: float | None) -> None:
    if after is None:
        return
    await trio.sleep(after)
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)


async def _stall(
    port: int, path: str, count: int, notes: list[str], headers: dict[str, str] | None = None
) -> list[StalledTailClient]:
    clients: list[StalledTailClient] = []
    for _ in range(count):
        try:
            with trio.fail_after(10):
                client = await trio.to_thread.run_sync(
                    open_stalled_tail, "127.0.0.1", port, path, headers
                )
        except (OSError, trio.TooSlowError) as exc:
            notes.append(f"stalled reader not connected: {exc}")
            continue
        clients.append(client)
    for client in clients:
        with trio.move_on_after(10) as waited:
            await wait_server_blocked(client, port)
        if waited.cancelled_caught:
            notes.append("the server's writes to a stalled reader never blocked")
    return clients


def _read_tail(path: str) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 3000))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


Spawner = Callable[[list[str], str], Awaitable[RoleProcess]]
"""``(launcher arguments, stderr log path) → a started role process``."""


async def spawn_fresh(role_args: list[str], log_path: str) -> RoleProcess:
    """``python -m fleet_trio.sim.roles ROLE_ARGS`` as a new process."""
    log = await trio.to_thread.run_sync(open, log_path, "wb")
    try:
        return await trio.lowlevel.open_process(
            [sys.executable, "-m", ROLE_LAUNCHER, *role_args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,
        )
    finally:
        log.close()


def node_job_id(plan: StopPlan, run: str, index: int, kind: str) -> str:
    """The id of a node seed's ``index``-th job in the play ``run`` (a random token per play).

    The survivors are looked for across the whole host (:func:`scan_markers`), by job id:
    an id made of the seed alone (``stop38-0-stubborn``) is carried just as well by the job of
    another run of the same seed on the machine (a second checkout's suite, or a run killed
    earlier whose node still runs), which the check then reported as this seed's survivor
    and SIGKILLed (issue 25). A worker seed's ids are the controller's UUIDs already."""
    return f"stop{plan.seed}-{run}-{index}-{kind}"


async def play_node(plan: StopPlan, root: str, spawn: Spawner = spawn_fresh) -> StopRecord:
    """One node seed under ``root`` (an empty folder)."""
    gpu = os.path.join(root, "gpu")
    await trio.to_thread.run_sync(init_device, gpu)
    tasks = {
        kind: script.replace(FLOOD, f"{FLOOD} {NODE_STDERR[kind]}")
        for kind, script in JOB_SCRIPTS.items()
    }
    cfg = os.path.join(root, "node.yaml")
    text = shell_tasks_yaml(
        tasks, drain_ms=int(NODE_DRAIN * 1000), kill_grace_s=NODE_KILL_GRACE, linger_s=NODE_LINGER
    )
    await trio.Path(cfg).write_text(text)
    port = free_port()
    argv = [
        "--", "node", "-c", cfg, "--gpu", "fake",
        "--fake-gpu-dir", gpu, "--listen", f"127.0.0.1:{port}", "--node-id", f"stop{plan.seed}",
        "--footprints", os.path.join(root, "fp.json"),
    ]  # fmt: skip
    log_path = os.path.join(root, "node.log")
    notes: list[str] = []
    proc = await spawn(argv, log_path)
    seen: dict[str, list[str]] = {}
    job_ids: list[str] = []
    stalled: list[StalledTailClient] = []
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
            with trio.fail_after(READY_TIMEOUT):
                while True:
                    if proc.returncode is not None:
                        output = _read_tail(log_path)
                        if "Address already in use" in output:
                            raise PortTaken(output)
                        raise RuntimeError(f"the node exited at start:\n{output}")
                    with contextlib.suppress(httpx.TransportError):
                        if (await http.get("/fleet/health")).status_code == 200:
                            break
                    await trio.sleep(0.05)
            run = secrets.token_hex(4)  # this play's own ids (see node_job_id)
            for i, kind in enumerate(plan.jobs):
                job_id = node_job_id(plan, run, i, kind)
                body = {"job_id": job_id, "task_type": kind, "payload": {}}
                if (await http.post("/fleet/dispatch", json=body)).status_code == 202:
                    job_ids.append(job_id)
                    seen[job_id] = []

            async def poll(job_id: str) -> None:
                async with httpx.AsyncClient(
                    base_url=f"http://127.0.0.1:{port}", timeout=2
                ) as poller:
                    while proc.returncode is None:
                        try:
                            r = await poller.get(f"/fleet/jobs/{job_id}")
                        except httpx.TransportError:
                            await trio.sleep(POLL_INTERVAL)
                            continue
                        if r.status_code == 200:
                            state = r.json().get("state", "")
                            if state in NODE_TERMINAL:
                                error = r.json().get("error") or ""
                                seen[job_id].append(f"{state}:{error}" if error else state)
                        await trio.sleep(POLL_INTERVAL)

            async with trio.open_nursery() as nursery:
                for job_id in job_ids:
                    nursery.start_soon(poll, job_id)
                first = job_ids[0] if job_ids else None
                if first is not None:
                    # the first job floods; wait until it runs, then stop reading its tail
                    with trio.move_on_after(10):
                        while True:  # the node has no event to wait on: poll, as a client does
                            r = await http.get(f"/fleet/jobs/{first}")
                            if r.json().get("state") != "accepted":
                                break
                            await trio.sleep(0.05)
                    stalled = await _stall(port, f"/fleet/jobs/{first}/tail", plan.stalled, notes)
                if plan.hung_gpu:  # while the jobs run: their samples hang too (issue 13 item 6)
                    await trio.Path(gpu, HANG_FILE).write_text("")
                await trio.sleep(plan.term_after)
                if _exited(proc):
                    notes.append(f"the node had exited ({proc.returncode}) before the SIGTERM")
                proc.send_signal(signal.SIGTERM)
                nursery.start_soon(_second_term, proc, plan.second_term)
                code, took = await wait_exit(proc, NODE_BOUND)
                nursery.cancel_scope.cancel()
    finally:
        await _stop_all(proc, stalled)
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(gpu, HANG_FILE))
    jobs = {j: tuple(seen[j]) for j in job_ids}
    return await _record(plan, NODE_MARKER, log_path, notes, code, took, NODE_BOUND, jobs)


async def play_worker(plan: StopPlan, root: str, spawn: Spawner = spawn_fresh) -> StopRecord:
    """One worker seed under ``root`` (an empty folder): its own simulated controller behind a
    faulty link."""
    ctrl = SimController(
        token="wtok",
        reaper_interval=0.1,
        heartbeat_timeout=0.8,
        worker_lost_after=WORKER_LOST_AFTER,
        startup_grace=0.0,
    )
    host = f"stop{plan.seed}"
    devices = ["gpu0", "gpu1"]
    for sub in ("probe.d", "sheets", "verify.d"):
        await trio.Path(root, sub).mkdir(parents=True, exist_ok=True)
    tail_port = free_port()
    log_path = os.path.join(root, "worker.log")
    notes: list[str] = []
    stalled: list[StalledTailClient] = []
    job_ids: list[str] = []
    bound = worker_bound()
    async with trio.open_nursery() as nursery:
        url: str = await nursery.start(serve_controller, ctrl)
        ctrl_host, ctrl_port = url.rsplit("//", 1)[1].rsplit(":", 1)
        link = FaultyLink(ctrl_host, int(ctrl_port), name=f"{host}->controller")
        await nursery.start(serve_link, link)
        cfg = os.path.join(root, "worker.yaml")
        text = worker_yaml(
            controller_url=link.url,
            host=host,
            devices=devices,
            state_dir=root,
            verify_dir=os.path.join(root, "verify.d"),
        )
        await trio.Path(cfg).write_text(text + f"tail_listen: 127.0.0.1:{tail_port}\n")
        proc = await spawn([*WORKER_LAUNCHER_ARGS, "--", "worker", "-c", cfg], log_path)
        try:

            def registered() -> bool:
                return bool(ctrl.registrations()) or proc.returncode is not None

            await ctrl.wait_for(registered, timeout=READY_TIMEOUT)
            if proc.returncode is not None:
                raise RuntimeError(f"the worker exited at start:\n{_read_tail(log_path)}")
            for i, kind in enumerate(plan.jobs):
                job_ids.append(ctrl.submit(f"{host}:{devices[i]}", ["sh", "-c", JOB_SCRIPTS[kind]]))

            def started() -> bool:
                return all(
                    "running" in ctrl.statuses(j) or ctrl.job(j).state in TERMINAL for j in job_ids
                )

            try:
                await ctrl.wait_for(started, timeout=READY_TIMEOUT)
            except trio.TooSlowError:
                states = {j: ctrl.statuses(j) for j in job_ids}
                raise NotReady(f"jobs not running after {READY_TIMEOUT:g}s: {states}") from None
            output = await trio.to_thread.run_sync(_read_tail, log_path)
            if "running without the live log tail" in output:
                raise PortTaken(output)
            stalled = await _stall(tail_port, f"/fleet/jobs/{job_ids[0]}/tail", plan.stalled, notes)
            await trio.sleep(plan.term_after)
            if plan.silence != "never":
                link.half_open(3600.0)
                link.drop_all()  # every connection, pooled ones too, goes to the silent link
            if _exited(proc):
                notes.append(f"the worker had exited ({proc.returncode}) before the SIGTERM")
            proc.send_signal(signal.SIGTERM)
            async with trio.open_nursery() as during:
                during.start_soon(_second_term, proc, plan.second_term)
                if plan.silence == "window":

                    async def heal_later() -> None:
                        await trio.sleep(plan.silence_window)
                        link.heal()

                    during.start_soon(heal_later)
                code, took = await wait_exit(proc, bound)
                during.cancel_scope.cancel()
        finally:
            await _stop_all(proc, stalled)
        link.heal()

        def settled() -> bool:
            return all(ctrl.job(j).state in TERMINAL for j in job_ids)

        with trio.move_on_after(SETTLE_TIMEOUT):
            await ctrl.wait_for(settled, timeout=SETTLE_TIMEOUT)
        nursery.cancel_scope.cancel()
    jobs: dict[str, tuple[str, ...]] = {}
    final: dict[str, str] = {}
    for j in job_ids:
        jobs[j] = tuple(s for s in ctrl.statuses(j) if s in TERMINAL)
        final[j] = ctrl.job(j).state
        if final[j] not in jobs[j]:
            notes.append(f"{j}: {final[j]} at the controller (reports: {list(jobs[j])})")
    return await _record(plan, RC_MARKER, log_path, notes, code, took, bound, jobs, final)


async def play_stop_seed(plan: StopPlan, root: str, spawn: Spawner = spawn_fresh) -> StopRecord:
    """One seed under ``root``; its process started by ``spawn`` (a fresh interpreter, or a
    fork of :mod:`fleet_trio.sim.zygote`). A start that lost its port to another process, or
    whose jobs were not running in time, is tried again (:data:`SEED_TRIES` plays in all)."""
    for attempt in range(SEED_TRIES):
        where = os.path.join(root, f"try{attempt}") if attempt else root
        await trio.Path(where).mkdir(parents=True, exist_ok=True)
        try:
            if plan.role == "node":
                return await play_node(plan, where, spawn)
            return await play_worker(plan, where, spawn)
        except* (PortTaken, NotReady):  # raised inside the play's nursery: a group
            if attempt == SEED_TRIES - 1:
                raise
    raise AssertionError("unreachable")


@attrs.frozen
class StopResult:
    record: StopRecord
    violations: list[Violation]

    @property
    def ok(self) -> bool:
        return not self.violations


def stop_verdict(result: StopResult) -> str:
    plan = result.record.plan
    if result.ok:
        notes = "".join(f"\n  note: {n}" for n in result.record.notes)
        return (
            f"{plan.describe()}: exit in {result.record.seconds:.2f}s "
            f"(bound {result.record.bound:g}s), every promise held{notes}"
        )
    lines = [f"{plan.describe()}: {len(result.violations)} broken promise(s):"]
    lines += [f"  {v}" for v in result.violations]
    lines += [f"  note: {n}" for n in result.record.notes]
    lines += ["  output:", *("    " + ln for ln in result.record.output_tail.splitlines()[-25:])]
    return "\n".join(lines)


async def run_stop_seeds(
    root: str,
    seeds: Sequence[int],
    *,
    hung_gpu: bool = False,
    concurrency: int = 6,
    fork: bool = True,
    say: Callable[[str], None] = lambda line: None,
) -> list[StopResult]:
    """Play every seed (``concurrency`` at a time), each in ``root/seed-N``; results by seed.

    ``fork``: start the processes as forks of one :mod:`~fleet_trio.sim.zygote` (the role
    code imported once), else as fresh interpreters."""
    results: list[StopResult] = []
    limiter = trio.CapacityLimiter(concurrency)

    async def one(seed: int, spawn: Spawner) -> None:
        async with limiter:
            plan = make_stop_plan(seed, hung_gpu=hung_gpu)
            record = await play_stop_seed(plan, os.path.join(root, f"seed-{seed}"), spawn)
            result = StopResult(record, check_stop(record))
            say(stop_verdict(result))
            results.append(result)

    async with contextlib.AsyncExitStack() as stack:
        spawn: Spawner = spawn_fresh
        if fork:
            zygote = await stack.enter_async_context(open_zygote())
            spawn = zygote.spawn
        async with trio.open_nursery() as nursery:
            for seed in seeds:
                nursery.start_soon(one, seed, spawn)
    return sorted(results, key=lambda r: r.record.plan.seed)


__all__ = [
    "NODE_BOUND",
    "StopPlan",
    "StopRecord",
    "StopResult",
    "check_stop",
    "make_stop_plan",
    "play_stop_seed",
    "run_stop_seeds",
    "stop_verdict",
    "worker_bound",
]
