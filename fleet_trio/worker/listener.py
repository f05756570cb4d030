"""The worker's live log tail: ``GET /fleet/jobs/<job_id>/tail`` (websocket), as the node serves it.

``tail_listen: HOST:PORT`` in ``worker.yaml`` turns it on (a key the Go worker ignores). The
route, its messages and close codes are the node's (:func:`fleet_trio.logbus.tail.serve_tail`,
docs/tail.md): JSON text frames ``output`` / ``skipped`` / ``end`` / ``error``; 1000 after
``end``, 4404 for an unknown job, 4400 for a bad query, 1011 when the server fails.

With ``tail_token`` set, the token is required, as ``Authorization: Bearer <token>`` or (for
browsers) the ``token`` query parameter, compared in constant time; a missing or wrong token
is refused before the upgrade (HTTP 401, the node's error envelope). Beyond ``max_tails`` open
tails, or ``max_tails_per_job`` of one job, a tail is refused before the upgrade too (HTTP 503
``too many tails``). Every other path answers 404 with the same envelope.

The listener serves only this route (plus the browser page and ``GET /metrics``, behind the same
token, docs/metrics.md) and only reads: it can never fail or delay a job.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING

import trio
from quart import Response, request, websocket
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from fleet_trio.auth import bearer, token_ok
from fleet_trio.edge import (
    EdgeGuard,
    EdgePolicy,
    OriginError,
    error_response,
    listen_is_loopback,
    unauthorized,
)
from fleet_trio.errors import FleetTrioError
from fleet_trio.logbus.bus import LogBus
from fleet_trio.logbus.fanout import TailLimits, Tails
from fleet_trio.logbus.ui import mount_ui, stream_tail
from fleet_trio.nursery.httpserve import hypercorn_config, serve_http

if TYPE_CHECKING:
    from fleet_trio.worker.metrics import WorkerMetrics

log = logging.getLogger(__name__)


class TailListenError(FleetTrioError):
    """The tail listener could not start (bind failed)."""


def create_tail_app(
    bus: LogBus,
    *,
    token: str | None = None,
    metrics: WorkerMetrics | None = None,
    edge: EdgePolicy | None = None,
    node_id: str = "",
    limits: TailLimits | None = None,
) -> QuartTrio:
    """A quart-trio app serving the tail route of ``bus`` (and ``GET /metrics`` when
    ``metrics`` is given, behind the same token: docs/metrics.md). ``edge``: the Origin/Host
    checks of every route (``fleet_trio.edge``; default: a loopback listener, no listed
    origins). ``limits``: the caps on open tails (``max_tails``, ``max_tails_per_job``;
    beyond them 503 ``too many tails``)."""
    tails = Tails(limits)
    app = QuartTrio(__name__)
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False
    EdgeGuard(edge if edge is not None else EdgePolicy()).install(app)

    @app.websocket("/fleet/jobs/<job_id>/tail")
    async def _tail(job_id: str) -> Response | None:
        authorized = token_ok(token, bearer(websocket.headers.get("Authorization")))
        if not authorized:
            query_token = websocket.args.get("token")
            authorized = query_token is not None and token_ok(token, query_token)
        if not authorized:
            return unauthorized()
        return await stream_tail(bus, job_id, tails)  # 503 too many tails beyond a cap

    async def _http_error(exc: HTTPException) -> Response:
        return error_response((exc.name or "error").lower(), exc.code or 500)

    app.register_error_handler(HTTPException, _http_error)
    if metrics is not None:
        worker_metrics = metrics

        async def _metrics() -> Response:
            if not token_ok(token, bearer(request.headers.get("Authorization"))):
                return unauthorized()
            body, content_type = worker_metrics.render(request.headers.get("Accept"))
            return Response(body, status=200, content_type=content_type)

        app.add_url_rule("/metrics", "metrics", _metrics, methods=["GET"])
    # the browser page (GET /fleet/ui and its job list), as on the node
    mount_ui(app, lambda: bus, lambda header: token_ok(token, bearer(header)), node_id=node_id)
    return app


async def serve_tail_listener(
    bus: LogBus,
    listen: str,
    *,
    token: str | None = None,
    metrics: WorkerMetrics | None = None,
    allow_origins: tuple[str, ...] = (),
    node_id: str = "",
    limits: TailLimits | None = None,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the tail route of ``bus`` on ``listen`` (``HOST:PORT``) until cancelled.

    ``started`` with the bound base URL (``http://HOST:PORT``; the websocket is
    ``ws://HOST:PORT/fleet/jobs/<job_id>/tail``). A bind failure raises
    :class:`TailListenError` before ``started``; a failure after it is logged and ends the
    listener without propagating (the worker keeps running its jobs). The Host rule of
    ``fleet_trio.edge`` applies when ``listen`` is a loopback address; ``allow_origins`` are
    the browser origins served besides the listener's own (docs/security.md); ``limits`` the
    caps on open tails (default 256 in all, 32 of one job).

    Cancellation: ends the listener at once; a write still pending to a tail client (one that
    stopped reading) is cut and the client dropped, so no client can hold the worker's stop.
    """
    try:
        edge = EdgePolicy.build(loopback=listen_is_loopback(listen), allow_origins=allow_origins)
    except OriginError as exc:
        raise TailListenError(f"tail_allow_origins: {exc}") from None
    app = create_tail_app(
        bus, token=token or None, metrics=metrics, edge=edge, node_id=node_id, limits=limits
    )
    serve = functools.partial(serve_http, app, hypercorn_config(listen), error=TailListenError)
    started = False
    try:
        async with trio.open_nursery() as nursery:
            urls: list[str] = await nursery.start(serve)  # a failed bind: TailListenError
            started = True
            task_status.started(urls[0] if urls else f"http://{listen}")
    except Exception as exc:
        if not started:
            problem: BaseException = exc
            while isinstance(problem, BaseExceptionGroup) and len(problem.exceptions) == 1:
                problem = problem.exceptions[0]
            if isinstance(problem, TailListenError):
                raise problem from problem.__cause__
            raise TailListenError(f"cannot listen on {listen}: {problem}") from problem
        log.exception("the tail listener on %s failed; live tails are off", listen)


__all__ = [
    "TailListenError",
    "create_tail_app",
    "serve_tail_listener",
    "token_ok",
]
