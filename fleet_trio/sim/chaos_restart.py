"""The restart chaos scenario: a node SIGKILLed and restarted at random moments while
dispatchers keep dispatching and polling (docs/chaos.md, "Restart scenario").

One seed is one schedule (:func:`make_restart_schedule`): jobs submitted at random moments
(quick ones, failing ones, short and long sleepers), one or two ``kill -9`` of the node at
random moments, each followed by a restart — sometimes itself killed half-way through its
start (during the journal's recovery) and started again. A run plays its seeds one after the
other against one real ``fleet-trio node`` process lineage (the journal carries over, job ids
are per seed); every seed can be replayed alone.

What is checked (:func:`check_restart`, sans-IO over what was recorded):

- **no acked id ever reads ``unknown job``** (a 404 poll) — its TTL is an hour;
- **every acked job reaches exactly one terminal state and keeps it**: the dispatcher's polls
  go on (``terminal_confirmations``) after the first ``done``/``error`` and never see
  another state;
- **no job runs twice**: each run appends the job id to the node's ``runs`` file; a job id
  dispatched again (after a refusal while the node was down) is answered from the journal;
- **no job process outlives the node that started it by more than the restart's grace**: the
  restarted node stops the previous run's processes before it serves, so when it is ready no
  process carries the ``FLEET_JOB_ID`` of a job dispatched before the kill.
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Callable, Iterable, Sequence

import attrs
import trio

from fleet_trio.gpu.fake import init_device
from fleet_trio.sim.chaos import runner, shell_tasks_yaml, yaml_str
from fleet_trio.sim.chaos.schedule import LOG_RUN, NODE_MARKER
from fleet_trio.sim.dispatcher import DispatchRecord, Observation, SimDispatcher
from fleet_trio.sim.fleet import NodeProcess, ProcessEvent, ShutdownRecord, free_port
from fleet_trio.sim.zygote import Zygote, open_zygote

RESTART_KILL_GRACE = 0.5
"""The node's ``kill_grace``: the grace of the restart's sweep too."""
SEED_DURATION = 1.0
"""Seconds of one seed's schedule (submits and kills)."""
LONG_SECONDS = 1.0
"""The ``long`` task's sleep: longer than a seed, so a kill usually finds it running."""
SETTLE_TIMEOUT = 20.0
CONFIRMATIONS = 3
"""Polls that must read the terminal state (the first and two more: it is kept)."""
TASKS = ("quick", "fail", "short", "long")


def restart_node_yaml(journal: str) -> str:
    """The node's config: the journal at ``journal``, a short grace, four tasks."""
    tasks = {
        "quick": f"{LOG_RUN}; echo '{{\"ok\": true}}'",
        "fail": f"{LOG_RUN}; echo boom >&2; exit 3",
        "short": f"{LOG_RUN}; sleep 0.3; echo '{{\"slept\": 0.3}}'",
        "long": f"{LOG_RUN}; sleep {LONG_SECONDS}; echo '{{\"slept\": {LONG_SECONDS}}}'",
    }
    return shell_tasks_yaml(
        tasks,
        drain_ms=500,
        kill_grace_s=RESTART_KILL_GRACE,
        node_lines=(f"  journal: {{path: {yaml_str(journal)}}}",),
    )


# -- the schedule ------------------------------------------------------------------------------


@attrs.frozen
class RestartStep:
    at: float
    """Seconds after the seed's start."""
    kind: str
    """``submit`` | ``kill`` (SIGKILL, then a restart) | ``resubmit`` (every job refused while
    the node was down is dispatched again, same id)."""
    task: str = ""
    job_id: str = ""
    kill_in_start: float | None = None
    """``kill``: the restart is itself killed this many seconds into its start."""

    def describe(self) -> str:
        if self.kind == "submit":
            return f"{self.at:5.2f}s submit {self.job_id} ({self.task})"
        if self.kind == "kill":
            extra = (
                f", restart killed after {self.kill_in_start:.2f}s"
                if self.kill_in_start is not None
                else ""
            )
            return f"{self.at:5.2f}s kill -9 + restart{extra}"
        return f"{self.at:5.2f}s re-dispatch the refused jobs"


def make_restart_schedule(seed: int, duration: float = SEED_DURATION) -> list[RestartStep]:
    rng = random.Random(seed)
    steps: list[RestartStep] = []
    for i in range(rng.randint(5, 9)):
        task = rng.choices(TASKS, weights=(4, 2, 3, 2))[0]
        steps.append(RestartStep(rng.uniform(0, duration), "submit", task, f"s{seed}-{i}-{task}"))
    kills = 1 if rng.random() < 0.85 else 2
    for _ in range(kills):
        in_start = rng.uniform(0.05, 0.6) if rng.random() < 0.2 else None
        steps.append(RestartStep(rng.uniform(0.1, duration), "kill", kill_in_start=in_start))
    steps.append(RestartStep(duration + 0.01, "resubmit"))
    return sorted(steps, key=lambda s: (s.at, s.kind))


def format_restart_schedule(seed: int, steps: Sequence[RestartStep]) -> str:
    return "\n".join([f"seed {seed}:", *(f"  {s.describe()}" for s in steps)])


# -- what is recorded and checked --------------------------------------------------------------


@attrs.frozen
class Leftover:
    """A process found carrying a job's marker when a restarted node became ready."""

    pid: int
    job_id: str
    ready_at: float


@attrs.define
class RestartRecords:
    seed: int
    records: list[DispatchRecord]
    observations: list[Observation]
    runs: dict[str, int]
    leftovers: list[Leftover] = attrs.Factory(list)
    leftover_dirs: list[str] = attrs.Factory(list)
    """Work dirs of a killed node still there when its successor was ready."""
    acked: set[str] = attrs.Factory(set)
    """Ids some node answered 202."""


@attrs.frozen
class RestartViolation:
    seed: int
    rule: str
    job_id: str
    detail: str

    def __str__(self) -> str:
        return f"seed {self.seed}: {self.rule}: {self.job_id}: {self.detail}"


def check_restart(rec: RestartRecords) -> list[RestartViolation]:
    out: list[RestartViolation] = []

    def bad(rule: str, job_id: str, detail: str) -> None:
        out.append(RestartViolation(rec.seed, rule, job_id, detail))

    polls: dict[str, list[Observation]] = {}
    for obs in rec.observations:
        if obs.kind == "poll" and obs.job_id is not None:
            polls.setdefault(obs.job_id, []).append(obs)
    by_id = {r.job_id: r for r in rec.records}
    for job_id in sorted(rec.acked):
        seen = polls.get(job_id, [])
        lost = [o for o in seen if o.status == 404]
        if lost:
            bad("unknown-job", job_id, f"{len(lost)} poll(s) read 404 {lost[0].detail!r}")
        r = by_id.get(job_id)
        if r is None or r.state not in ("done", "error"):
            bad("no-terminal", job_id, f"record ends {r.state if r else 'missing'}")
            continue
        states = [o.detail for o in seen if o.status == 200]
        first = next((i for i, s in enumerate(states) if s in ("done", "error")), None)
        if first is None:
            bad("no-terminal", job_id, "no poll read a terminal state")
        elif any(s != states[first] for s in states[first:]):
            bad("terminal-changed", job_id, f"states after the first terminal: {states[first:]}")
        if r.error is not None and r.error.startswith("lost"):
            bad("unknown-job", job_id, r.error)
    for job_id, n in sorted(rec.runs.items()):
        if n > 1:
            bad("ran-twice", job_id, f"ran {n} times")
    for left in rec.leftovers:
        bad(
            "outlived-node",
            left.job_id,
            f"pid {left.pid} alive when the restarted node was ready ({left.ready_at:.2f}s)",
        )
    for name in rec.leftover_dirs:
        bad("workdir-left", name, "a killed node's work dir outlived the restart")
    return out


# -- playing a seed ---------------------------------------------------------------------------


def scan_markers(job_ids: Iterable[str]) -> list[tuple[int, str]]:
    """Live processes whose ``FLEET_JOB_ID`` is one of ``job_ids`` (a blocking /proc walk)."""
    wanted = set(job_ids)
    if not wanted:
        return []
    return [(p.pid, p.job_id) for p in runner.scan_markers(wanted) if p.marker == NODE_MARKER]


def work_dirs(folder: str) -> set[str]:
    """The job work dirs (``fleet-job-*``) directly in ``folder`` (blocking)."""
    try:
        return {name for name in os.listdir(folder) if name.startswith("fleet-job-")}
    except OSError:
        return set()


@attrs.frozen
class RestartResult:
    seed: int
    steps: tuple[RestartStep, ...]
    violations: tuple[RestartViolation, ...]
    acked: int
    restarts: int
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.violations


class RestartLineage:
    """One node process (restarted many times) and its dispatcher, for a run of seeds."""

    def __init__(
        self,
        root: str,
        nursery: trio.Nursery,
        *,
        journal: bool = True,
        zygote: Zygote | None = None,
    ) -> None:
        self.root = root
        self.nursery = nursery
        self.node_dir = os.path.join(root, "node")
        self.events: list[ProcessEvent] = []
        self.shutdowns: list[ShutdownRecord] = []
        os.makedirs(self.node_dir, exist_ok=True)
        gpu = os.path.join(root, "gpu")
        init_device(gpu, "Fake GPU", 24.0)
        config = os.path.join(self.node_dir, "node.yaml")
        journal_path = os.path.join(self.node_dir, "journal.sqlite")
        with open(config, "w") as f:
            f.write(restart_node_yaml(journal_path))
        env = dict(os.environ, FLEET_TRIO_SIM_NODE_DIR=self.node_dir, TMPDIR=self.node_dir)
        env.pop("FLEET_TRIO_TEST_BREAK", None)
        self.node = NodeProcess(
            "node",
            config=config,
            gpu_dir=gpu,
            port=free_port(),
            env=env,
            nursery=nursery,
            events=self.events,
            shutdowns=self.shutdowns,
        )
        self.node.zygote, self.node.fifo_dir = zygote, root
        if not journal:  # proves the checker: without the journal a restart forgets
            self.node.role_argv.append("--no-journal")
        self.dispatcher = SimDispatcher(
            [self.node.url],
            health_interval=0.1,
            poll_interval=0.1,
            request_timeout=3.0,
            lost_after=30.0 if journal else 2.0,
            terminal_confirmations=CONFIRMATIONS,
        )

    async def start(self) -> None:
        await self.nursery.start(self.dispatcher.serve)
        await self.node.start()
        await self._wait_healthy()

    async def _wait_healthy(self) -> None:
        """Until the dispatcher's health probe sees the node again."""
        url = self.node.url
        await self.dispatcher.wait_for(lambda: self.dispatcher.healthy(url), timeout=SETTLE_TIMEOUT)

    async def _restart(self, step: RestartStep, before_kill: set[str], rec: RestartRecords) -> None:
        await self.node.kill()
        if step.kill_in_start is not None:
            with trio.move_on_after(step.kill_in_start):
                await self.node.start()
            await self.node.kill()
        dead_dirs = await trio.to_thread.run_sync(work_dirs, self.node_dir)
        await self.node.start()
        ready = trio.current_time()
        found = await trio.to_thread.run_sync(scan_markers, before_kill)
        left = dead_dirs & await trio.to_thread.run_sync(work_dirs, self.node_dir)
        await self._wait_healthy()
        rec.leftovers += [Leftover(pid, job, ready) for pid, job in found]
        rec.leftover_dirs += sorted(left)

    async def play(
        self, seed: int, steps: Sequence[RestartStep], say: Callable[[str], None] = print
    ) -> RestartResult:
        disp = self.dispatcher
        rec = RestartRecords(seed, [], [], {})
        started: dict[str, float] = {}
        restarts = 0
        t0 = trio.current_time()
        ids = [s.job_id for s in steps if s.kind == "submit"]

        async def submit(task: str, job_id: str) -> None:
            started.setdefault(job_id, trio.current_time())
            await disp.submit(task, job_id=job_id)

        async with trio.open_nursery() as nursery:
            for step in steps:
                await trio.sleep_until(t0 + step.at)
                if step.kind == "submit":
                    nursery.start_soon(submit, step.task, step.job_id)
                elif step.kind == "kill":
                    before = {j for j, at in started.items() if at <= trio.current_time()}
                    restarts += 1
                    await self._restart(step, before, rec)
                else:
                    await disp.wait_for(
                        lambda: all(_state(disp, j) != "pending" for j in ids),
                        timeout=SETTLE_TIMEOUT,
                    )
                    for s in steps:
                        if s.kind == "submit" and _state(disp, s.job_id) == "unplaced":
                            nursery.start_soon(submit, s.task, s.job_id)
        notes: list[str] = []
        acked = [disp.record(j) for j in ids if disp.record(j).node is not None]
        try:
            await disp.wait_for(lambda: all(_settled(r) for r in acked), timeout=SETTLE_TIMEOUT)
        except trio.TooSlowError:
            notes.append("not every acked job settled within the timeout")
        rec.records = [disp.record(j) for j in ids]
        rec.acked = {r.job_id for r in rec.records if any(a[1] == 202 for a in r.attempts)}
        mine = set(ids)
        rec.observations = [o for o in disp.observations() if o.job_id in mine]
        rec.runs = {j: n for j, n in runner.read_runs(self.node_dir).items() if j in mine}
        violations = check_restart(rec)
        return RestartResult(
            seed, tuple(steps), tuple(violations), len(rec.acked), restarts, tuple(notes)
        )


def _settled(r: DispatchRecord) -> bool:
    """Terminal and confirmed by more polls (or given up as lost: a 404 run)."""
    if r.state not in ("done", "error"):
        return False
    return r.terminal_polls >= CONFIRMATIONS or (r.error or "").startswith("lost")


def _state(disp: SimDispatcher, job_id: str) -> str:
    rec = disp.find(job_id)
    return "pending" if rec is None else rec.state  # pending: its submit has not begun yet


async def run_restart_seeds(
    root: str,
    seeds: Sequence[int],
    *,
    journal: bool = True,
    duration: float = SEED_DURATION,
    fork: bool = True,
) -> list[RestartResult]:
    """Play ``seeds`` one after the other against one node lineage under ``root``; ``fork``:
    every start of the node is a fork of one :mod:`~fleet_trio.sim.zygote`."""
    results: list[RestartResult] = []
    async with contextlib.AsyncExitStack() as stack:
        zygote = await stack.enter_async_context(open_zygote()) if fork else None
        nursery = await stack.enter_async_context(trio.open_nursery())
        lineage = RestartLineage(root, nursery, journal=journal, zygote=zygote)
        try:
            await lineage.start()
            for seed in seeds:
                steps = make_restart_schedule(seed, duration)
                results.append(await lineage.play(seed, steps))
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(30):
                await lineage.node.kill()
                # what the last incarnation left: every job process with a marker
                ids = {s.job_id for r in results for s in r.steps if s.kind == "submit"}
                found = await trio.to_thread.run_sync(scan_markers, ids)
                runner.kill_pids(pid for pid, _job in found)
            nursery.cancel_scope.cancel()
    return results


def restart_verdict(result: RestartResult) -> str:
    head = (
        f"seed {result.seed}: {'ok' if result.ok else 'FAILED'} "
        f"({result.acked} acked, {result.restarts} restart(s))"
    )
    lines = [head, *(f"  {v}" for v in result.violations), *(f"  note: {n}" for n in result.notes)]
    if not result.ok:
        lines.append(format_restart_schedule(result.seed, result.steps))
    return "\n".join(lines)


__all__ = [
    "Leftover",
    "RestartLineage",
    "RestartRecords",
    "RestartResult",
    "RestartStep",
    "RestartViolation",
    "check_restart",
    "format_restart_schedule",
    "make_restart_schedule",
    "restart_node_yaml",
    "restart_verdict",
    "run_restart_seeds",
    "scan_markers",
]
