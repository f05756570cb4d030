"""``serve_node``: the node process wired into the task tree (node.md §7.5, §7.6; design §3).

(Over 500 lines: the node's wiring: the GPU, the journal and the services are started in one order
and torn down in the reverse, read in one place.)

::

    root          (opened first; serves SIGTERM/SIGINT from its opening to its close)
    ├─ services   shutdown signals, global VRAM sampler (first sample before started), janitor
    ├─ role       the HTTP server (hypercorn with write deadlines: nursery/httpserve.py)
    └─ jobs       one task per dispatched job
    on_jobs_closed: the live tails' end (1.5 s)

The start (GPU probe, first sample, bind) runs in the tree's body, which the first signal
cancels.

Shutdown (SIGTERM or SIGINT): dispatch answers 503 ``node draining`` at once (the store's
draining flag is the tree's ``on_stop_accepting``), health and polls keep answering, the jobs
get ``drain_timeout``; survivors are marked ``error:"interrupted"`` (``on_interrupt``) before
the jobs scope is cancelled, and each job's process group gets SIGTERM → ``kill_grace`` →
SIGKILL. Then the poll linger (``poll_linger``, docs/node.md "Linger"): only
``GET /fleet/jobs/{id}`` is served until every job the shutdown ended has been polled in its
terminal state, or the linger's deadline passes. Then the listener closes and the services stop.

Start: with the job journal on (the default), the journal is opened (a corrupt, locked or
unwritable one refuses the start) and the previous run's jobs are recovered
(``fleet_trio.node.recovery``: finished ones answer polls again, in-flight ones end
``interrupted`` and their processes are stopped) before the listener opens.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import signal
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import attrs
import trio
from hypercorn.config import Config as HypercornConfig

from fleet_trio.edge import EdgePolicy, OriginError, listen_is_loopback
from fleet_trio.errors import NodeStartError
from fleet_trio.inputs import first_control, token_problem
from fleet_trio.logbus import LogBus
from fleet_trio.logbus.fanout import TailLimits, Tails
from fleet_trio.memory import MemoryBudget
from fleet_trio.node.app import FootprintSource, NodeContext, VramStatus, create_app
from fleet_trio.node.config import (
    TRUSTED_NETWORK_WARNING,
    NodeConfig,
    check_listen,
    expand_path,
    journal_path,
    os_hostname,
    resolve_listen,
    resolve_node_id,
    task_gpus,
    task_limits,
)
from fleet_trio.node.jobs import INTERRUPTED, JobStore
from fleet_trio.node.journal import (
    IDENTITY_CHECK_INTERVAL,
    Drop,
    Journal,
    JournalError,
    JournalWriter,
)
from fleet_trio.node.linger import PollLinger
from fleet_trio.node.metrics import NodeMetrics
from fleet_trio.node.placement import Placement, footprint_need
from fleet_trio.node.recovery import recover
from fleet_trio.node.retention import attach_result_budget
from fleet_trio.node.tasks import JOB_MARKER, PreparedJob, TaskRegistry, TaskRunner
from fleet_trio.nursery import DEFAULT_SIGNALS, TaskTree, open_task_tree
from fleet_trio.nursery.httpserve import HEADER_TIMEOUT, hypercorn_config, serve_http
from fleet_trio.proc.containment import (
    AnyContainment,
    CgroupContainment,
    ContainmentError,
    choose_for_agent,
    describe,
    recover_leftovers,
)
from fleet_trio.proc.limits import JobLimits, check_limits
from fleet_trio.statedir import symlink_problem

log = logging.getLogger(__name__)


@attrs.frozen
class NodeOptions:
    """Command-line overrides (every one optional)."""

    listen: str | None = None
    trusted_network: bool = False
    node_id: str | None = None
    gpu: str = "auto"
    fake_gpu_dir: str | None = None
    fake_gpus: int = 1
    """Multi-GPU: how many devices the fake GPU presents (``--fake-gpus``)."""
    footprints: str | None = None
    memory_budget: int | None = None
    """``--memory-budget``: overrides ``node.memory_budget``."""
    token: str | None = None
    token_from: str = "--token"
    """Where ``token`` came from, for its error message (``$FLEET_TRIO_TOKEN``)."""
    allow_origins: tuple[str, ...] = ()
    """``--allow-origin``: browser origins served besides the node's own (docs/security.md)."""
    journal: str | None = None
    """``--journal PATH``: the job journal's file (overrides ``node.journal.path``)."""
    no_journal: bool = False
    """``--no-journal``: keep jobs in memory only (a restart loses them)."""
    journal_moved: bool = False
    """``--journal-moved``: a journal recorded at another path was moved here, not copied."""


class SamplerService(VramStatus, Protocol):
    async def serve(self, *, task_status: trio.TaskStatus[None] = ...) -> None: ...


@attrs.define
class GpuServices:
    """What the node needs from ``fleet_trio.gpu``; tests pass fakes."""

    sampler: SamplerService
    footprints: FootprintSource | None = None
    arch: str = "nvidia"
    source: Any = None
    """The ``GpuSource`` for per-job sampling (``None``: jobs are not sampled)."""
    sampler_mode: str = "auto"
    render_interval: float = 0.5
    devices: tuple[Any, ...] = ()
    """Multi-GPU: the node's ``GpuDevice``s (index order); empty: ``source`` alone."""
    placement: Placement | None = None
    """Multi-GPU: which GPU job runs on which device (``None``: one anonymous device)."""


def server_timeouts(hc: HypercornConfig, app: Any) -> dict[str, float | None]:
    """What §2.1's four server timeouts map to (checklist 43); ``None``: no equivalent.

    - ``read_header`` (5 s): ``fleet_trio.nursery.httpserve.HEADER_TIMEOUT`` (hypercorn has
      none; the server adds it: from the accept, or from a next request's first byte);
    - ``read`` (30 s): Quart's ``BODY_TIMEOUT`` (the whole body must arrive in 30 s);
    - ``write`` (30 s): Quart's ``RESPONSE_TIMEOUT``;
    - ``idle`` (120 s): hypercorn's ``keep_alive_timeout``. Hypercorn's per-read
      ``read_timeout`` is also 120 s (it applies to every socket read, idle waits included,
      so a smaller value would cut the keep-alive short); it bounds a silent client.
    """
    return {
        "read_header": HEADER_TIMEOUT,
        "read": float(app.config["BODY_TIMEOUT"]),
        "write": float(app.config["RESPONSE_TIMEOUT"]),
        "idle": float(hc.keep_alive_timeout),
        "socket_read": float(hc.read_timeout) if hc.read_timeout else None,
    }


@attrs.define
class RunningNode:
    """What ``serve_node`` reports once it serves."""

    tree: TaskTree
    context: NodeContext
    listen: str
    urls: list[str]

    @property
    def url(self) -> str:
        return self.urls[0]

    @property
    def store(self) -> JobStore:
        return self.context.store

    def request_shutdown(self, reason: str = "shutdown requested") -> None:
        self.tree.request_shutdown(reason)


async def open_gpu(config: NodeConfig, options: NodeOptions) -> GpuServices:
    """The real GPU wiring (``fleet_trio.gpu``): every device of the machine (or those of
    ``node.gpu.devices``), one sampler per device, the placement. Raises
    :class:`NodeStartError`.

    Cancellation: the probe runs in worker threads the cancel abandons (a driver call that
    never returns cannot hold a shutdown)."""
    from fleet_trio.gpu import FootprintStore, GpuError
    from fleet_trio.gpu.devices import DeviceSampler
    from fleet_trio.gpu.source import open_devices, select_devices

    node = config.node
    t = node.timings
    wanted = node.gpu.devices or ((node.gpu.index,) if node.gpu.index else ())
    try:
        found = await open_devices(
            options.gpu,
            fake_dir=options.fake_gpu_dir,
            fake_gpus=options.fake_gpus,
            smi_timeout=t.smi_timeout,
        )
        devices = select_devices(found.devices, wanted)
        sampler = DeviceSampler(
            devices,
            interval=t.health_sample_interval,
            max_age=t.max_snapshot_age,
            sample_timeout=t.smi_timeout,
            primary_uuid=node.gpu.primary_gpu_uuid,
        )
    except GpuError as exc:
        where = f" ({config.path})" if config.path else ""
        raise NodeStartError(f"GPU probe failed: {exc}{where}") from exc
    if len(found.devices) == 1:
        # a one-GPU machine is the v2 node: one GPU job at a time, nothing pinned or gated
        placement = Placement.single()
    else:
        try:
            placement = Placement([d.uuid for d in devices])
        except ValueError as exc:  # AllocationError: two devices with one UUID
            raise NodeStartError(f"GPU probe failed: {exc}") from exc
        sampler.listeners.append(placement.update)
    primary = next((d for d in devices if d.uuid == node.gpu.primary_gpu_uuid), devices[0])
    source = primary.source
    arch = node.gpu.arch
    if arch == "auto":
        try:
            name = primary.name or await source.device_name()
        except GpuError:
            name = ""
        try:
            from fleet_trio.gpu.arch import gpu_arch

            arch = gpu_arch(name)
        except ImportError:
            arch = "nvidia"
    path = expand_path(options.footprints or node.footprints.path, config.base_dir)
    if problem := symlink_problem(path):  # never followed (docs/security.md)
        raise NodeStartError(f"footprints: {problem}")
    footprints = await FootprintStore.open(path, margin=node.footprints.margin)
    mode = "global" if node.sampler == "pdh" else node.sampler
    return GpuServices(
        sampler=sampler,
        footprints=footprints,
        arch=arch,
        source=source,
        sampler_mode=mode,
        render_interval=t.render_sample_interval,
        devices=tuple(devices),
        placement=placement,
    )


async def open_journal(config: NodeConfig, options: NodeOptions, node_id: str) -> Journal | None:
    """Open the job journal (``None`` when it is off). Raises :class:`NodeStartError` with
    the journal's one-line reason (corrupt, locked by another node, unwritable, not a file)."""
    settings = config.node.journal
    if options.no_journal or not settings.enabled:
        return None
    path = journal_path(
        options.journal or settings.path,
        node_id,
        options.footprints or config.node.footprints.path,
        config.base_dir,
    )
    journal = Journal(
        path,
        inline_max=settings.inline_max,
        sync=settings.sync,
        node_id=node_id,
        moved=options.journal_moved,
    )
    try:
        await trio.to_thread.run_sync(journal.open, limiter=trio.CapacityLimiter(1))
    except JournalError as exc:
        raise NodeStartError(str(exc)) from None
    return journal


async def start_journal(
    tree: TaskTree,
    store: JobStore,
    journal: Journal,
    kill_grace: float,
    *,
    registry: TaskRegistry | None = None,
    marker_sweep: bool = True,
) -> str | None:
    """Recover the previous run from ``journal`` into ``store`` (before the listener opens:
    no poll sees a state it will not keep, no dispatch races the sweep of the previous run's
    processes), then serve its writer in the services scope. Returns the line to announce.

    ``registry``: its work dirs take the journal's work tag (so do its jobs' sweep markers), and
    the previous run's dirs under that tag are removed (also those of acks that never
    committed). The previous runs' processes are found by that tag, whatever node id they ran
    under (:func:`~fleet_trio.node.recovery.sweep_tagged`); ``marker_sweep=False`` (the
    cgroup backend was in use and its recovery has run) replaces that sweep."""
    work_root = None
    if registry is not None:
        registry.work_tag = journal.work_tag
        work_root = registry.work_dir_root
    try:
        report = await recover(
            journal,
            store.table,
            kill_grace=kill_grace,
            work_root=work_root,
            marker_sweep=marker_sweep,
        )
    except JournalError as exc:
        journal.close()
        raise NodeStartError(str(exc)) from None
    except BaseException:
        journal.close()
        raise
    # the journal's identity is checked with each commit batch and on this timer: a journal
    # deleted, replaced or moved under the node is lost (health and dispatch 503 `journal lost`)
    writer = JournalWriter(journal, check_interval=IDENTITY_CHECK_INTERVAL)

    async def serve_writer(
        *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        try:
            await writer.serve(task_status=task_status)
        finally:
            writer.close()

    await tree.services.start(serve_writer, name="journal-writer")
    store.journal = writer
    if (
        report.restored
        or report.interrupted
        or report.expired
        or report.work_dirs_removed
        or report.swept
        or report.results_lost
    ):
        return report.describe()
    return None


def _journal_drop(store: JobStore, job_id: str, error: str) -> None:
    """An evicted result's job is ``error`` now: the journal says so too (when there is one)."""
    if store.journal is not None:
        store.journal.submit([Drop(job_id, error)])


def footprint_hooks(
    gpu: GpuServices,
) -> tuple[
    Callable[[PreparedJob, trio.Event, int], Any] | None, Callable[[PreparedJob, float], Any] | None
]:
    """The render-sampling hook (§5.3): per-job peak via ``measure_job_peak``."""
    if gpu.source is None or gpu.footprints is None:
        return None, None
    from fleet_trio.gpu import FootprintKey
    from fleet_trio.gpu.sampler import SharedProcessView, measure_job_peak

    store = gpu.footprints
    # per device: its source, and one per-process query per tick for all its running jobs
    sources: dict[str, Any] = {d.uuid: d.source for d in gpu.devices} or {"": gpu.source}
    shared = {
        uuid: SharedProcessView(src, JOB_MARKER, max_age=gpu.render_interval / 2)
        for uuid, src in sources.items()
    }

    async def sample_on(uuid: str, job: PreparedJob, stop: trio.Event, pgid: int) -> float | None:
        return await measure_job_peak(
            sources[uuid],
            pgid=pgid,
            marker=(JOB_MARKER, job.job_id),
            interval=gpu.render_interval,
            stop=stop,
            mode=gpu.sampler_mode,
            shared=shared[uuid],
        )

    async def sample(job: PreparedJob, stop: trio.Event, pgid: int) -> float | None:
        # on the device(s) the job was given; a job pinned to none sees (and is measured on)
        # every device. Several devices: the sum of their peaks.
        uuids = [u for u in job.devices if u in sources] or list(sources)
        if len(uuids) == 1:
            return await sample_on(uuids[0], job, stop, pgid)
        peaks: list[float | None] = []

        async def one(uuid: str) -> None:
            peaks.append(await sample_on(uuid, job, stop, pgid))

        async with trio.open_nursery() as nursery:
            for uuid in uuids:
                nursery.start_soon(one, uuid)
        seen = [p for p in peaks if p is not None]
        return sum(seen) if seen else None

    async def record(job: PreparedJob, peak: float) -> None:
        await store.record(FootprintKey(job.family, job.quant, job.task.name), peak)  # type: ignore[attr-defined]

    return sample, record


def need_hook(gpu: GpuServices) -> Callable[[PreparedJob], float | None] | None:
    """GPU placement: a job's known footprint (GiB) from the store, for the allocator."""
    footprints = gpu.footprints
    if footprints is None or gpu.placement is None:
        return None

    def need(job: PreparedJob) -> float | None:
        return footprint_need(footprints, job.family, job.quant, job.task.name)

    return need


def configured_limits(config: NodeConfig) -> list[tuple[str, JobLimits]]:
    """``(where, limits)`` of every enabled task: where names the task and the file."""
    where = f" in {config.path}" if config.path else ""
    return [(f"tasks.{t.name}{where}", task_limits(t)) for t in config.tasks if t.enabled]


def cgroup_recovered(containment: AnyContainment) -> bool:
    """Was the previous run contained by cgroups here (its ``jobs/`` was there at this start,
    so its job cgroups have been killed and removed)? Then the journal recovery's marker sweep
    is replaced by that, not run in addition (issue: "replaces the marker sweep")."""
    return isinstance(containment, CgroupContainment) and containment.previous


async def open_containment(
    mode: str,
    base: str,
    say: Callable[[str], None],
    limits: Sequence[tuple[str, JobLimits]] = (),
) -> AnyContainment:
    """The jobs' containment (docs/containment.md), said once; a crashed run's job cgroups are
    killed and removed (the recovery log says so). Raises :class:`NodeStartError` (one line)
    when ``containment: cgroup`` cannot be had, or a task's limit (``limits``: ``(where,
    limits)``) cannot: no cgroup backend, or its controller is not enabled for the jobs."""
    try:
        containment = choose_for_agent(mode, base=base)
    except ContainmentError as exc:
        raise NodeStartError(str(exc)) from None
    jobs_dir = containment.jobs_dir if isinstance(containment, CgroupContainment) else None
    problem = check_limits(jobs_dir, limits)
    if problem is not None:
        if isinstance(containment, CgroupContainment):
            containment.release()
        raise NodeStartError(problem)
    log.info("%s", describe(containment))  # the serving line names the backend
    if isinstance(containment, CgroupContainment):
        for line in await recover_leftovers(containment):
            say(f"recovery: {line}")
    return containment


async def serve_node(
    config: NodeConfig,
    options: NodeOptions = NodeOptions(),
    *,
    gpu: GpuServices | None = None,
    signals: Sequence[signal.Signals] = DEFAULT_SIGNALS,
    absorb_late_signals: bool = False,
    hostname: Callable[[], str] = os_hostname,
    announce: Callable[[str], None] | None = None,
    work_root: str | None = None,
    store_factory: Callable[..., JobStore] = JobStore,
    task_status: trio.TaskStatus[RunningNode] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve CONTRACT v2 until SIGTERM/SIGINT (or ``RunningNode.request_shutdown``).

    ``gpu=None`` wires the real GPU package (``options.gpu``: auto|nvml|smi|fake). Raises
    :class:`NodeStartError` when the node must not start (§7.5). ``store_factory`` builds the
    job table (``JobStore``'s keyword arguments; the sim passes a deliberately broken one).

    Everything runs in the task tree, the GPU probe included: the tree (and its signal
    handling) opens first, so a signal at any moment, a hung probe included, is a shutdown.

    Cancellation: a cancel (or a signal, or ``request_shutdown``) runs the shutdown the module
    docstring tells (the HTTP server's cancel cuts writes to clients); it exits within
    ``drain + 5 s + kill_grace + 3 s + 1.5 s`` whatever clients, jobs or the GPU do (see
    docs/node.md "Stopping").
    """
    say = announce if announce is not None else log.warning
    node = config.node
    t = node.timings
    listen = resolve_listen(options.listen, node.listen)
    check_listen(listen, options.trusted_network)
    if options.trusted_network:
        say(TRUSTED_NETWORK_WARNING.format(addr=listen))
    try:  # the Origin/Host checks of every route (docs/security.md)
        edge = EdgePolicy.build(
            loopback=listen_is_loopback(listen),
            allow_origins=(*node.allow_origins, *options.allow_origins),
        )
    except OriginError as exc:
        raise NodeStartError(f"--allow-origin: {exc}") from None
    node_id = resolve_node_id(options.node_id, node.node_id, hostname)
    if found := first_control(node_id):  # from --node-id (the config's is checked at load)
        raise NodeStartError(f"--node-id: must not contain a control character (found {found})")
    if problem := token_problem(options.token or ""):
        raise NodeStartError(f"{options.token_from}: {problem}")
    if work_root and (problem := symlink_problem(work_root)):
        raise NodeStartError(f"work root: {problem}")  # never followed (docs/security.md)
    store = store_factory(ttl=t.job_ttl, janitor_interval=t.janitor_interval)
    # memory budget: kept results and log histories share one ceiling (docs/node.md)
    budget = MemoryBudget(options.memory_budget or node.memory_budget)
    attach_result_budget(store.table, budget, on_drop=functools.partial(_journal_drop, store))
    linger = PollLinger()
    bus_holder: list[NodeContext] = []

    async def mark_interrupted() -> None:
        await store.mark_interrupted()

    serving = False

    def stop_accepting() -> None:
        store.begin_drain()
        linger.drain_began(store.table.in_flight_ids())
        why = tree.shutdown_reason  # a signal's name, None when the start failed
        if serving:
            say(f"node {node_id}: draining for up to {t.drain_timeout:g}s ({why or 'stopped'})")
        elif why is not None:  # a signal during the start (the GPU probe, the journal …)
            say(f"node {node_id}: {why} during startup: stopped before serving")

    async def tails_end() -> None:
        # live log tail: every job has ended; a log opened at the ack of a job that never ran
        # ends as its poll does, and the open tails send their `end` and close normally before
        # the HTTP server goes (bounded by the task tree's JOBS_CLOSED_BUDGET; a client too
        # slow to take it is dropped when the server is cancelled)
        for ctx in bus_holder:
            ctx.bus.end_all("error", None, INTERRUPTED)
            await ctx.bus.wait_streams_done()

    async with contextlib.AsyncExitStack() as tree_exit, open_task_tree(
        drain=t.drain_timeout,
        kill_grace=t.kill_grace,
        on_stop_accepting=stop_accepting,
        on_interrupt=mark_interrupted,
        on_jobs_closed=tails_end,
        linger=t.poll_linger,
        on_linger=linger.wait,
        signals=signals,
        absorb_late_signals=absorb_late_signals,
    ) as tree:
        with trio.CancelScope() as startup:
            tree.cancel_on_shutdown(startup)  # a signal during the start ends the start
            if gpu is None:
                gpu = await open_gpu(config, options)
            registry = TaskRegistry(
                config.tasks, base_dir=config.base_dir, work_root=work_root, node_id=node_id
            )
            if gpu.placement is not None:  # multi-GPU: a task that can never be placed, said once
                for name in registry.supported:
                    task = registry.get(name)
                    if task is not None and task_gpus(task) > len(gpu.placement.uuids):
                        say(
                            f"task {name}: gpus: {task_gpus(task)} but this node has "
                            f"{len(gpu.placement.uuids)} device(s); its jobs will fail"
                        )
            sample, record = footprint_hooks(gpu)
            containment = await open_containment(
                node.containment, node.cgroup_base, say, configured_limits(config)
            )
            if isinstance(containment, CgroupContainment):  # held to the tree's very end
                tree_exit.callback(containment.release)
            runner = TaskRunner(
                containment=containment,
                kill_grace=t.kill_grace,
                placement=gpu.placement,
                footprint_need=need_hook(gpu),
                sample_peak=sample,
                record_peak=record,
            )
            ctx = NodeContext(
                node_id=node_id,
                gpu_arch=gpu.arch,
                registry=registry,
                store=store,
                runner=runner,
                sampler=gpu.sampler,
                footprints=gpu.footprints,
                max_snapshot_age=t.max_snapshot_age,
                token=options.token or None,
                metrics=NodeMetrics(gpu=str(node.gpu.index)),
                edge=edge,
                bus=LogBus(budget=budget),
                linger=linger,
                ack_deadline=t.ack_deadline,
                tails=Tails(TailLimits(node.max_tails, node.max_tails_per_job)),
            )
            ctx.metrics.set_containment(containment.name)
            bus_holder.append(ctx)
            store.set_spawn(tree.start_job)
            await tree.services.start(gpu.sampler.serve, name="vram-sampler")
            snap, reason = gpu.sampler.status(trio.current_time())
            if snap is None or not (math.isfinite(snap.total_gb) and snap.total_gb > 0):
                raise NodeStartError(
                    f"GPU probe returned no usable VRAM ({reason or 'total <= 0'})"
                )
            journal = await open_journal(config, options, node_id)  # job journal (docs/node.md)
            if journal is not None:
                line = await start_journal(
                    tree,
                    store,
                    journal,
                    t.kill_grace,
                    registry=registry,
                    marker_sweep=not cgroup_recovered(containment),
                )
                if line:
                    say(line)
            await tree.services.start(store.serve_janitor, name="janitor")
            app = create_app(ctx)
            urls: list[str] = await tree.role.start(
                functools.partial(serve_http, error=NodeStartError),
                app,
                hypercorn_config(listen),
                name="http",
            )
            devices = f" on {len(gpu.devices)} GPUs" if len(gpu.devices) > 1 else ""
            bound = urls[0].partition("://")[2] if urls else listen  # port 0: the real port
            say(
                f"node {node_id} serving on {bound} "
                f"(vram total {snap.total_gb:.1f} GiB{devices}; "
                f"tasks: {', '.join(registry.supported)}; "
                f"containment: {containment.name})"
            )
            serving = True
            task_status.started(RunningNode(tree=tree, context=ctx, listen=listen, urls=urls))
        await tree.wait_shutdown()


__all__ = [
    "GpuServices",
    "NodeOptions",
    "NodeStartError",
    "RunningNode",
    "hypercorn_config",
    "need_hook",
    "open_gpu",
    "open_journal",
    "serve_http",
    "serve_node",
    "server_timeouts",
    "start_journal",
]
