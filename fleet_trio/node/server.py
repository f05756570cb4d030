"""``serve_node``: the node process wired into the task tree (node.md §7.5, §7.6; design §3).

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
SIGKILL. Then the listener closes and the services stop.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import signal
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import attrs
import trio
from hypercorn.config import Config as HypercornConfig

from fleet_trio.errors import FleetTrioError
from fleet_trio.metrics import NodeMetrics
from fleet_trio.node.app import FootprintSource, NodeContext, VramStatus, create_app
from fleet_trio.node.config import (
    TRUSTED_NETWORK_WARNING,
    NodeConfig,
    check_listen,
    expand_path,
    os_hostname,
    resolve_listen,
    resolve_node_id,
)
from fleet_trio.node.jobs import INTERRUPTED, JobStore
from fleet_trio.node.tasks import JOB_MARKER, PreparedJob, TaskRegistry, TaskRunner
from fleet_trio.nursery import DEFAULT_SIGNALS, TaskTree, open_task_tree
from fleet_trio.nursery.httpserve import serve_http_bounded

log = logging.getLogger(__name__)

IDLE_TIMEOUT = 120.0
"""§2.1: an idle keep-alive connection is closed after 120 s."""
TAIL_PING_INTERVAL = 30.0
"""Seconds between server pings on a tail websocket (keeps it inside ``read_timeout``)."""


class NodeStartError(FleetTrioError):
    """The node refused to start (GPU probe, listen guard, bind); the CLI exits 1."""


@attrs.frozen
class NodeOptions:
    """Command-line overrides (every one optional)."""

    listen: str | None = None
    trusted_network: bool = False
    node_id: str | None = None
    gpu: str = "auto"
    fake_gpu_dir: str | None = None
    footprints: str | None = None
    token: str | None = None


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


def server_timeouts(hc: HypercornConfig, app: Any) -> dict[str, float | None]:
    """What §2.1's four server timeouts map to (checklist 43); ``None``: no equivalent.

    - ``read_header`` (5 s): hypercorn has no header timeout → ``None``;
    - ``read`` (30 s): Quart's ``BODY_TIMEOUT`` (the whole body must arrive in 30 s);
    - ``write`` (30 s): Quart's ``RESPONSE_TIMEOUT``;
    - ``idle`` (120 s): hypercorn's ``keep_alive_timeout``. Hypercorn's per-read
      ``read_timeout`` is also 120 s (it applies to every socket read, idle waits included,
      so a smaller value would cut the keep-alive short); it bounds a silent client.
    """
    return {
        "read_header": None,
        "read": float(app.config["BODY_TIMEOUT"]),
        "write": float(app.config["RESPONSE_TIMEOUT"]),
        "idle": float(hc.keep_alive_timeout),
        "socket_read": float(hc.read_timeout) if hc.read_timeout else None,
    }


def hypercorn_config(listen: str) -> HypercornConfig:
    """Hypercorn settings for the node (see :func:`server_timeouts` for the §2.1 mapping)."""
    hc = HypercornConfig()
    hc.bind = [listen]
    hc.keep_alive_timeout = IDLE_TIMEOUT
    hc.read_timeout = int(IDLE_TIMEOUT)
    hc.graceful_timeout = 1.0
    # live log tail: a tail client never writes, and read_timeout applies to websocket reads
    # too; pinging makes the client answer (pong) well within it.
    hc.websocket_ping_interval = TAIL_PING_INTERVAL
    hc.accesslog = None
    hc.errorlog = None
    return hc


async def serve_http(
    app: Any,
    hc: HypercornConfig,
    *,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """The HTTP server; ``started`` with the bound URLs. Runs until cancelled.

    Every write to a client has a deadline (:mod:`fleet_trio.nursery.httpserve`): a client
    that stops reading is dropped, never waited on.

    Cancellation: ends the server at once, cutting any write still in progress.
    """
    try:
        await serve_http_bounded(app, hc, task_status=task_status)
    except OSError as exc:
        raise NodeStartError(f"cannot listen on {', '.join(hc.bind)}: {exc}") from exc
    except BaseExceptionGroup as group:  # hypercorn binds inside its nurseries
        bind_errors, rest = group.split(OSError)
        if bind_errors is None or rest is not None:
            raise
        first = _first_leaf(bind_errors)
        raise NodeStartError(f"cannot listen on {', '.join(hc.bind)}: {first}") from first


def _first_leaf(group: BaseExceptionGroup[OSError]) -> OSError:
    first: BaseException = group
    while isinstance(first, BaseExceptionGroup):
        first = first.exceptions[0]
    assert isinstance(first, OSError)
    return first


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
    """The real GPU wiring (``fleet_trio.gpu``). Raises :class:`NodeStartError`.

    Cancellation: the probe runs in a worker thread the cancel abandons (a driver call that
    never returns cannot hold a shutdown)."""
    from fleet_trio.gpu import FootprintStore, GpuError, open_source
    from fleet_trio.gpu.sampler import GlobalSampler

    node = config.node
    t = node.timings
    try:
        source = await trio.to_thread.run_sync(
            functools.partial(
                open_source,
                options.gpu,
                index=node.gpu.index,
                fake_dir=options.fake_gpu_dir,
                smi_timeout=t.smi_timeout,
            ),
            abandon_on_cancel=True,  # a driver call that never returns cannot hold a shutdown
        )
    except GpuError as exc:
        raise NodeStartError(f"GPU probe failed: {exc}") from exc
    sampler = GlobalSampler(
        source,
        interval=t.health_sample_interval,
        max_age=t.max_snapshot_age,
        sample_timeout=t.smi_timeout,
    )
    arch = node.gpu.arch
    if arch == "auto":
        try:
            name = await source.device_name()
        except GpuError:
            name = ""
        try:
            from fleet_trio.gpu.arch import gpu_arch

            arch = gpu_arch(name)
        except ImportError:
            arch = "nvidia"
    path = options.footprints or node.footprints.path
    footprints = await FootprintStore.open(
        expand_path(path, config.base_dir), margin=node.footprints.margin
    )
    mode = "global" if node.sampler == "pdh" else node.sampler
    return GpuServices(
        sampler=sampler,
        footprints=footprints,
        arch=arch,
        source=source,
        sampler_mode=mode,
        render_interval=t.render_sample_interval,
    )


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

    source, store = gpu.source, gpu.footprints
    # one per-process query per tick for all running jobs, not one per job
    shared = SharedProcessView(source, JOB_MARKER, max_age=gpu.render_interval / 2)

    async def sample(job: PreparedJob, stop: trio.Event, pgid: int) -> float | None:
        return await measure_job_peak(
            source,
            pgid=pgid,
            marker=(JOB_MARKER, job.job_id),
            interval=gpu.render_interval,
            stop=stop,
            mode=gpu.sampler_mode,
            shared=shared,
        )

    async def record(job: PreparedJob, peak: float) -> None:
        await store.record(FootprintKey(job.family, job.quant, job.task.name), peak)  # type: ignore[attr-defined]

    return sample, record


async def serve_node(
    config: NodeConfig,
    options: NodeOptions = NodeOptions(),
    *,
    gpu: GpuServices | None = None,
    signals: Sequence[signal.Signals] = DEFAULT_SIGNALS,
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

    Cancellation: a cancel (or a signal, or ``request_shutdown``) runs the tree's bounded
    shutdown: 503 at once, the drain, survivors marked ``interrupted``, SIGTERM → ``kill_grace``
    → SIGKILL, the tails' ``end`` (:data:`~fleet_trio.nursery.tree.JOBS_CLOSED_BUDGET`), then
    the HTTP server is cancelled (writes to clients cut) and the services. Exits within
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
    node_id = resolve_node_id(options.node_id, node.node_id, hostname)
    store = store_factory(ttl=t.job_ttl, janitor_interval=t.janitor_interval)
    bus_holder: list[NodeContext] = []

    async def mark_interrupted() -> None:
        store.mark_interrupted()

    serving = False

    def stop_accepting() -> None:
        store.begin_drain()
        if serving:  # not on a failed start
            say(f"node {node_id}: draining for up to {t.drain_timeout:g}s")

    async def tails_end() -> None:
        # live log tail: every job has ended; a log opened at the ack of a job that never ran
        # ends as its poll does, and the open tails send their `end` and close normally before
        # the HTTP server goes (bounded by the task tree's JOBS_CLOSED_BUDGET; a client too
        # slow to take it is dropped when the server is cancelled)
        for ctx in bus_holder:
            ctx.bus.end_all("error", None, INTERRUPTED)
            await ctx.bus.wait_streams_done()

    async with open_task_tree(
        drain=t.drain_timeout,
        kill_grace=t.kill_grace,
        on_stop_accepting=stop_accepting,
        on_interrupt=mark_interrupted,
        on_jobs_closed=tails_end,
        signals=signals,
    ) as tree:
        with trio.CancelScope() as startup:
            tree.cancel_on_shutdown(startup)  # a signal during the start ends the start
            if gpu is None:
                gpu = await open_gpu(config, options)
            registry = TaskRegistry(config.tasks, base_dir=config.base_dir, work_root=work_root)
            sample, record = footprint_hooks(gpu)
            runner = TaskRunner(kill_grace=t.kill_grace, sample_peak=sample, record_peak=record)
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
            )
            bus_holder.append(ctx)
            store.set_spawn(tree.start_job)
            await tree.services.start(gpu.sampler.serve, name="vram-sampler")
            snap, reason = gpu.sampler.status(trio.current_time())
            if snap is None or not (math.isfinite(snap.total_gb) and snap.total_gb > 0):
                raise NodeStartError(
                    f"GPU probe returned no usable VRAM ({reason or 'total <= 0'})"
                )
            await tree.services.start(store.serve_janitor, name="janitor")
            app = create_app(ctx)
            urls: list[str] = await tree.role.start(
                serve_http, app, hypercorn_config(listen), name="http"
            )
            say(
                f"fleet-trio node {node_id} serving on {listen} "
                f"(vram total {snap.total_gb:.1f} GiB; tasks: {', '.join(registry.supported)})"
            )
            serving = True
            task_status.started(RunningNode(tree=tree, context=ctx, listen=listen, urls=urls))
        await tree.wait_shutdown()


def node_env_token() -> str | None:
    return os.environ.get("FLEET_TRIO_TOKEN") or None


__all__ = [
    "GpuServices",
    "NodeOptions",
    "NodeStartError",
    "RunningNode",
    "hypercorn_config",
    "node_env_token",
    "open_gpu",
    "serve_http",
    "serve_node",
    "server_timeouts",
]
