"""The CONTRACT v2 HTTP front end (node.md §2): a quart-trio app with three routes.

None of the handlers does GPU work or waits on a job, a sampler or a process: health reads
the sampler's cached snapshot (and stats the footprint file, §11 R), dispatch validates,
registers and acks, polls read the job table.

Status codes, bodies and the check order are §2's. Every non-2xx answer of the three routes
is the error envelope ``{"status":"error","error":"<message>"}``; paths and methods outside
the contract (404/405) get the same envelope (the design note of §2.1 allows it).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import attrs
import cattrs
import trio
from quart import Response, request, websocket
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from fleet_trio.auth import bearer_ok
from fleet_trio.edge import EdgeGuard, EdgePolicy, error_response, unauthorized
from fleet_trio.errors import WireError
from fleet_trio.inputs import id_problem
from fleet_trio.logbus.bus import LogBus
from fleet_trio.logbus.fanout import Tails
from fleet_trio.logbus.ui import mount_ui, stream_tail, token_ok
from fleet_trio.node.after_send import AfterSend, after_response, sends_after
from fleet_trio.node.delivery import (
    DEFAULT_ACK_DEADLINE,
    MSG_CLIENT_GONE,
    NOT_WRITTEN,
    Delivery,
)
from fleet_trio.node.jobs import (
    MSG_JOURNAL_UNAVAILABLE,
    NOT_ACKED,
    Ack,
    JobState,
    JobStore,
    Registration,
)
from fleet_trio.node.journal import JOURNAL_LOST, RESULT_LOST, ResultLost
from fleet_trio.node.linger import PollLinger
from fleet_trio.node.metrics import NodeMetrics
from fleet_trio.node.tasks import PreparedJob, TaskRegistry, TaskRunner, job_log_meta
from fleet_trio.node.wire import (
    MAX_DISPATCH_BODY,
    MSG_DRAINING,
    MSG_SNAPSHOT_STALE,
    MSG_SNAPSHOT_UNAVAILABLE,
    MSG_TOO_LARGE,
    MSG_UNKNOWN_JOB,
    GpuDeviceWire,
    Health,
    ack_body,
    check_content_type,
    dumps,
    footprint_from_wire,
    job_body,
    make_converter,
    msg_previously_failed,
    parse_dispatch,
    snapshot_usable,
)
from fleet_trio.nursery.peer import peer_of

log = logging.getLogger(__name__)

BODY_TIMEOUT = 30
"""Quart's BODY_TIMEOUT: the whole request body must arrive within 30 s (§2.1 read)."""
RESPONSE_TIMEOUT = 30
"""Quart's RESPONSE_TIMEOUT: a response must be produced within 30 s (§2.1 write)."""


class SnapshotLike(Protocol):
    @property
    def total_gb(self) -> float: ...
    @property
    def free_gb(self) -> float: ...
    @property
    def taken_at(self) -> float: ...


class VramStatus(Protocol):
    """The global sampler as health sees it (``fleet_trio.gpu.sampler.GlobalSampler``; a
    multi-GPU node's ``fleet_trio.gpu.devices.DeviceSampler`` also has ``gpu_devices``)."""

    def status(self, now: float) -> tuple[SnapshotLike | None, str | None]: ...


class FootprintEntryLike(Protocol):
    def to_wire(self) -> Mapping[str, Any]: ...


class FootprintSource(Protocol):
    """The footprint store as health sees it (``fleet_trio.gpu.FootprintStore``)."""

    async def reload_if_changed(self) -> bool: ...
    def entries(self) -> Sequence[FootprintEntryLike]: ...


@attrs.define
class NodeContext:
    """Everything the handlers read. Built once by ``server.py`` (or a test)."""

    node_id: str
    gpu_arch: str
    registry: TaskRegistry
    store: JobStore
    runner: TaskRunner
    sampler: VramStatus | None = None
    footprints: FootprintSource | None = None
    max_snapshot_age: float = 30.0
    token: str | None = None
    """Optional bearer token (opt-in; the v2 wire is unchanged without it)."""
    converter: cattrs.Converter = attrs.field(factory=make_converter, repr=False)
    """Built once: building a cattrs converter costs milliseconds, health is a hot path."""
    bus: LogBus = attrs.field(factory=LogBus, repr=False)
    """The jobs' live output (the tail route); the runner tees into it (docs/tail.md)."""
    metrics: NodeMetrics = attrs.field(factory=NodeMetrics, repr=False)
    """``GET /metrics`` (docs/metrics.md): this node's own registry."""
    edge: EdgePolicy = attrs.field(factory=EdgePolicy)
    """Origin/Host checks of every route (``fleet_trio.edge``, docs/security.md): a loopback
    listener by default (the Host rule on); ``serve_node`` turns the Host rule off for a
    non-loopback ``--listen`` and adds ``--allow-origin`` / ``node.allow_origins``."""
    linger: PollLinger = attrs.field(factory=PollLinger, repr=False)
    """The poll linger after the drain (docs/node.md "Linger"): only polls are served."""
    ack_deadline: float = DEFAULT_ACK_DEADLINE
    """A dispatch whose ack would be committed later than this after its arrival is answered
    503 ``ack deadline passed`` (docs/node.md "Delivery-checked acks")."""
    tails: Tails = attrs.field(factory=Tails, repr=False)
    """The live tails open now, under ``max_tails`` / ``max_tails_per_job`` (docs/tail.md)."""

    def __attrs_post_init__(self) -> None:
        # live log tail: the runner tees into this bus (a stand-in runner without one: no tee)
        if getattr(self.runner, "bus", False) is None:
            self.runner.bus = self.bus
            hold = getattr(self.runner, "hold_log_ends", None)
            listeners = getattr(self.store, "on_published", None)
            if hold is not None and listeners is not None:  # a log ends once its poll agrees
                listeners.append(hold())
        withdrawn = getattr(self.store, "on_withdrawn", None)
        if getattr(self.runner, "bus", None) is self.bus and withdrawn is not None:
            # an ack taken back: the log its 202 opened goes, the id is unknown again
            withdrawn.append(self.bus.discard_unwritten)
        self.metrics.attach(self)  # metrics: read at scrape time; the runner counts job ends
        if getattr(self.runner, "metrics", False) is None:
            self.runner.metrics = self.metrics


def _json(body: bytes, status: int) -> Response:
    return Response(body, status=status, headers={}, content_type="application/json")


def snapshot_problem(
    snap: SnapshotLike | None, reason: str | None, now: float, max_age: float
) -> str | None:
    """Health's checks 1–2 (+ the fifth guard): the 503 message, or ``None`` to serve.

    An age of exactly ``max_age`` is still served; strictly older is stale (§0, item 108).
    """
    if snap is None:
        stale = reason is not None and "stale" in reason
        return MSG_SNAPSHOT_STALE if stale else MSG_SNAPSHOT_UNAVAILABLE
    if now - snap.taken_at > max_age:
        return MSG_SNAPSHOT_STALE
    if not snapshot_usable(snap.total_gb, snap.free_gb):
        return MSG_SNAPSHOT_UNAVAILABLE
    return None


async def health(ctx: NodeContext) -> Response:
    """§2.2: 503 unavailable / 503 stale / 200 with exactly the ten fields."""
    if not bearer_ok(ctx.token, request.headers.get("Authorization")):
        return unauthorized()
    if ctx.linger.active:  # linger: polls only
        return error_response(MSG_DRAINING, 503)
    if ctx.store.journal_lost:  # deleted, replaced or moved under the node (docs/node.md)
        return error_response(JOURNAL_LOST, 503)
    now = trio.current_time()
    snap, reason = ctx.sampler.status(now) if ctx.sampler is not None else (None, None)
    message = snapshot_problem(snap, reason, now, ctx.max_snapshot_age)
    if message is not None or snap is None:
        return error_response(message or MSG_SNAPSHOT_UNAVAILABLE, 503)
    footprints = []
    if ctx.footprints is not None:
        try:
            await ctx.footprints.reload_if_changed()
        except Exception:
            log.exception("footprints: reload failed; serving what is in memory")
        for entry in ctx.footprints.entries():
            fp = footprint_from_wire(entry.to_wire())
            if fp.vram_peak_gb > 0 and math.isfinite(fp.vram_peak_gb):
                footprints.append(fp)
    body = Health(
        node_id=ctx.node_id,
        gpu_arch=ctx.gpu_arch,
        vram_total_gb=snap.total_gb,
        vram_free_gb=snap.free_gb,
        supported_task_types=ctx.registry.supported,
        loadable_model_families=ctx.registry.families,
        model_footprints=sorted(footprints, key=lambda f: (f.model_family, f.quant, f.task_type)),
        queue_depth=ctx.store.queue_depth,
        gpu_devices=_gpu_devices(ctx, now),
    )
    return _json(dumps(ctx.converter.unstructure(body)), 200)


def _gpu_devices(ctx: NodeContext, now: float) -> list[GpuDeviceWire] | None:
    """Multi-GPU: health's ``gpu_devices`` (``None``: absent, a single-device node)."""
    read = getattr(ctx.sampler, "gpu_devices", None)
    rows = read(now) if read is not None else None
    return None if rows is None else [GpuDeviceWire(**row) for row in rows]


async def _read_capped_body() -> bytes:
    """The request body, at most 1 MiB (Quart enforces ``MAX_CONTENT_LENGTH``)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.body:
        size += len(chunk)
        if size > MAX_DISPATCH_BODY:
            raise WireError(MSG_TOO_LARGE)
        chunks.append(chunk)
    return b"".join(chunks)


def _check_ids(job_id: str, task_type: str) -> None:
    """The documented id set (``fleet_trio.inputs``, docs/security.md) for the job id and a
    non-empty task type; an empty task type stays "unsupported" (§2.3). Raises a 400."""
    for name, value in (("job_id", job_id), ("task_type", task_type)):
        problem = id_problem(value) if value or name == "job_id" else None
        if problem is not None:
            raise WireError(f"invalid {name}: {problem}")


async def dispatch(ctx: NodeContext, *, arrived: float | None = None) -> Response:
    """§2.3, in its exact order; a gone client or a late request is not acked (``arrived``:
    when the request reached the handler; now when not given)."""
    arrived = trio.current_time() if arrived is None else arrived
    if not bearer_ok(ctx.token, request.headers.get("Authorization")):
        return unauthorized()
    try:
        check_content_type(request.headers.get("Content-Type"))  # 1
        try:
            body = await _read_capped_body()  # 2
        except RequestEntityTooLarge:
            raise WireError(MSG_TOO_LARGE) from None
        req = parse_dispatch(body)  # 2 + 3
        _check_ids(req.job_id, req.task_type)  # 3b: the id rules, before anything is stored
        store = ctx.store
        if store.draining:  # 4: a known id re-acks through a drain; only a new one gets 503
            known = await _known_job(ctx, req.job_id)
            return known if known is not None else error_response(MSG_DRAINING, 503)
        if store.journal_lost:  # a known id re-acks (its ack was saved); a new one: 503
            known = await _known_job(ctx, req.job_id)
            return known if known is not None else error_response(JOURNAL_LOST, 503)
        prepared = ctx.registry.prepare(req.task_type, req.payload_raw, req.job_id)  # 5
    except WireError as exc:
        return error_response(str(exc), exc.status)
    delivery = Delivery(peer_of(request.scope), arrived, ctx.ack_deadline)
    for attempt in range(2):
        if attempt:  # the registration this met was refused or withdrawn meanwhile: a new one
            try:
                prepared = ctx.registry.prepare(req.task_type, req.payload_raw, req.job_id)
            except WireError as exc:
                return error_response(str(exc), exc.status)
        # delivery check 1: a gone client or a late request is refused before anything is stored
        refusal = delivery.before_commit()
        if refusal is not None:
            prepared.cleanup()
            log.warning(NOT_ACKED, req.job_id, refusal, extra={"job_id": req.job_id})
            return error_response(delivery.refused or MSG_CLIENT_GONE, 503)
        # 6: no await between the lookup and the insert (exactly-once).
        ack = Ack(
            req.job_id,
            veto=delivery.before_commit,  # check 1 again, when the journal takes the ack
            gone=delivery.gone_before_202,
            release=trio.Event() if sends_after() else None,
        )
        outcome = ctx.store.register(
            req.job_id,
            functools.partial(ctx.runner.execute, prepared),
            work_dir=prepared.work_dir,
            discard=functools.partial(ctx.runner.discard, prepared),
            ack=ack,
        )
        if outcome is Registration.CREATED:
            return await _ack(ctx, prepared, delivery, ack)
        prepared.cleanup()
        known = await _known_job(ctx, req.job_id)
        if known is not None:
            return known
        if outcome is Registration.DRAINING or ctx.store.draining:  # drain began at 4–6
            return error_response(MSG_DRAINING, 503)
        if req.job_id in ctx.store.table:
            break  # a duplicate of an ack being refused
    return error_response(MSG_JOURNAL_UNAVAILABLE, 503)  # a duplicate of an ack that failed


async def _ack(ctx: NodeContext, prepared: PreparedJob, delivery: Delivery, ack: Ack) -> Response:
    """A new id is registered: commit its ack, check its client, answer 202 (or 503)."""
    store = ctx.store
    # GPU placement: the job's place in line is its ack's (jobs acked together start in any
    # order)
    ctx.runner.reserve(prepared)
    if ack.release is not None:
        # the job starts once its 202 is written, never competing with its own ack
        # (fleet_trio.node.after_send), and only if its client can have read it (delivery
        # check 3); a request that ends any other way takes its ack back
        def sent() -> None:
            lost = delivery.lost() if delivery.answered else NOT_WRITTEN
            if lost is None:
                store.release(ack)
            else:
                store.withdraw(ack, lost)

        def unsent() -> None:
            store.withdraw(ack, NOT_WRITTEN)

        after_response(sent, unsent=unsent)
    # with the journal: the ack is committed before the 202 (and before the job runs)
    refusal = await store.wait_ack(ack)
    if refusal is not None:
        # refused at its commit (delivery check 1: the client's 503 message), or not written
        lost = store.journal_lost  # the journal was deleted, replaced or moved: 503 journal lost
        return error_response(
            delivery.refused or (JOURNAL_LOST if lost else MSG_JOURNAL_UNAVAILABLE), 503
        )
    gone = delivery.gone()  # delivery check 2: the client is still there for its 202
    if gone is not None and store.withdraw(ack, f"{gone} before its 202 was written"):
        return error_response(MSG_CLIENT_GONE, 503)
    _open_job_log(ctx, prepared)  # live log tail: subscribable from the ack on
    delivery.answering()  # a reset once the client's kernel acknowledged the 202: delivered
    delivery.answered = True
    return _json(ack_body(ack.job_id), 202)


async def _known_job(ctx: NodeContext, job_id: str) -> Response | None:
    """The duplicate table of §2.3 for a known id (202, or 409 when it failed); ``None`` for
    an unknown id. An ack still being written is waited for."""
    store = ctx.store
    if store.table.pending(job_id):
        await store.wait_recorded(job_id)
    existing = store.get(job_id)
    if existing is None:
        return None
    if existing.state is JobState.ERROR:
        return error_response(msg_previously_failed(existing.error or ""), 409)
    store.hold(job_id)  # acked to this request too: its first client going no longer undoes it
    return _json(ack_body(job_id), 202)


async def job_status(ctx: NodeContext, job_id: str) -> Response:
    """§2.4: 200 with ``state`` (+ ``data`` / ``error``), or 404 ``unknown job``."""
    if not bearer_ok(ctx.token, request.headers.get("Authorization")):
        return unauthorized()
    view = ctx.store.get(job_id)
    if view is None:
        return error_response(MSG_UNKNOWN_JOB, 404)
    data = view.data
    if view.data_file is not None:  # a large result, kept in a file beside the journal
        try:
            data = await ctx.store.read_data(view)
        except ResultLost as exc:  # missing, empty or torn: a terminal error, never bad JSON
            log.warning("job %s: %s%s", job_id, RESULT_LOST, exc)
            ctx.linger.polled_terminal(job_id)
            body = job_body(view.job_id, "error", data=None, error=f"{RESULT_LOST}{exc}")
            return _json(body, 200)
        except OSError:
            return error_response("internal error", 500)
    if view.state.terminal:
        ctx.linger.polled_terminal(job_id)
    return _json(job_body(view.job_id, view.state.value, data=data, error=view.error), 200)


# -- live log tail (docs/tail.md) ----------------------------------------------------------------


def _open_job_log(ctx: NodeContext, job: PreparedJob) -> None:
    """Open the job's bus log at ack time, so a tail right after the 202 finds it.

    Only when the runner tees into this bus (else the log would never end). Never fails the
    dispatch: an id the bus refuses (``ValueError``) simply has no live log.
    """
    if getattr(ctx.runner, "bus", None) is not ctx.bus:
        return
    try:
        if ctx.bus.get(job.job_id) is None:
            ctx.bus.open(job.job_id, meta=job_log_meta(job))
    except ValueError:
        pass
    except Exception:
        log.exception("job %s: could not open its live log", job.job_id)


async def tail(ctx: NodeContext, job_id: str) -> Response | None:
    """``GET /fleet/jobs/<job_id>/tail`` (websocket): the job's log until its ``end``.

    A bad token is refused before the upgrade (HTTP 401, the error envelope). Otherwise the
    socket is accepted and :func:`~fleet_trio.logbus.tail.serve_tail` streams; the close code
    is its answer (1000 after ``end``, 4404 unknown job, 4400 bad query, 1011 internal).
    Beyond ``max_tails`` or ``max_tails_per_job``: HTTP 503 ``too many tails``, no upgrade.
    """
    # the bearer token from ``Authorization``, or (browsers) the ``token`` query parameter
    if not token_ok(lambda header: bearer_ok(ctx.token, header), websocket):
        return unauthorized()
    if ctx.linger.active:  # linger: polls only
        return error_response(MSG_DRAINING, 503)
    return await stream_tail(ctx.bus, job_id, ctx.tails)  # 503 too many tails beyond a cap


# -- end of the live log tail block --------------------------------------------------------------


async def metrics_endpoint(ctx: NodeContext) -> Response:
    """``GET /metrics`` (docs/metrics.md): Prometheus text, or OpenMetrics when asked for.

    Behind the node's token like every other route when one is set (scrape with
    ``authorization: {credentials_file: ...}``); open when none is, as the whole node is.
    """
    if not bearer_ok(ctx.token, request.headers.get("Authorization")):
        return unauthorized()
    if ctx.linger.active:  # linger: polls only
        return error_response(MSG_DRAINING, 503)
    body, content_type = ctx.metrics.render(request.headers.get("Accept"))
    return Response(body, status=200, content_type=content_type)


def create_app(ctx: NodeContext) -> QuartTrio:
    """The quart-trio app serving ``ctx``."""
    app = QuartTrio(__name__)
    app.asgi_app = AfterSend(app.asgi_app)  # type: ignore[method-assign]
    app.config["MAX_CONTENT_LENGTH"] = MAX_DISPATCH_BODY
    app.config["BODY_TIMEOUT"] = BODY_TIMEOUT
    app.config["RESPONSE_TIMEOUT"] = RESPONSE_TIMEOUT
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False
    # Origin/Host/path-id checks before every route, websockets and 404s included
    EdgeGuard(ctx.edge).install(app)

    async def _dispatch() -> Response:
        started = trio.current_time()
        response = await dispatch(ctx, arrived=started)
        ctx.metrics.dispatch_answered(response.status_code, trio.current_time() - started)
        return response

    get = ["GET"]
    app.add_url_rule("/fleet/health", "health", functools.partial(health, ctx), methods=get)
    app.add_url_rule("/fleet/dispatch", "dispatch", _dispatch, methods=["POST"])
    app.add_url_rule("/fleet/jobs/<job_id>", "job", functools.partial(job_status, ctx), methods=get)
    app.add_url_rule("/metrics", "metrics", functools.partial(metrics_endpoint, ctx), methods=get)

    # live log tail (docs/tail.md)
    app.add_websocket("/fleet/jobs/<job_id>/tail", "_tail", functools.partial(tail, ctx))

    # -- browser page of the live tail (docs/tail.md, "Browser page") --------------------------
    mount_ui(app, lambda: ctx.bus, lambda h: bearer_ok(ctx.token, h), node_id=ctx.node_id)
    # -- end of the browser page block ---------------------------------------------------------

    async def _http_error(exc: HTTPException) -> Response:
        headers: dict[str, str] = {}
        if exc.code == 405:
            allow = getattr(exc, "valid_methods", None)
            if allow:
                headers["Allow"] = ", ".join(allow)
        message = (exc.name or "error").lower()
        return error_response(message, exc.code or 500, headers)

    async def _internal(exc: Exception) -> Response:
        log.exception("unhandled error in a handler", exc_info=exc)
        return error_response("internal error", 500)

    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(Exception, _internal)
    return app


__all__ = [
    "BODY_TIMEOUT",
    "RESPONSE_TIMEOUT",
    "FootprintSource",
    "NodeContext",
    "VramStatus",
    "create_app",
    "dispatch",
    "health",
    "job_status",
    "metrics_endpoint",
    "snapshot_problem",
    "tail",
]
