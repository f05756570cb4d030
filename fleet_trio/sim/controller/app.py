"""Serving the simulated controller: the quart-trio app of the worker routes (E1–E7; the relay
E8/E9 and the client routes mount themselves on it), and the byte pump in front of hypercorn
that owns the public port. The pump is what lets the sim close a connection without answering
(``drop_next``) and cut every open connection on ``restart()``, as a dying process would.
"""

from __future__ import annotations

import functools
from typing import cast

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from fleet_trio.errors import WireError
from fleet_trio.sim.controller import protocol
from fleet_trio.sim.controller.records import INSTANCE_HEADER, MAX_WAIT, Reply, RequestRecord
from fleet_trio.sim.controller.state import SimController
from fleet_trio.sim.faults import splice
from fleet_trio.sim.rcwire import MAX_LOG_CHUNK


def response(reply: Reply) -> Response:
    """A :class:`Reply` as HTTP (a bare one as Go's ``WriteHeader``: no Content-Type, and no
    Content-Length on a 204)."""
    if reply.json:
        return Response(reply.body, status=reply.status, content_type="application/json")
    resp = Response(reply.body, status=reply.status)
    del resp.headers["Content-Type"]
    if reply.status == 204:
        resp.headers.pop("Content-Length", None)
    return resp


def record(ctrl: SimController, endpoint: str, body: bytes) -> RequestRecord:
    """Record the request being served (its parts, as the controller keeps them)."""
    return ctrl._record(
        endpoint,
        method=request.method,
        path=request.path,
        query=request.query_string.decode("latin-1"),
        headers={k: v for k, v in request.headers.items()},
        body=body,
    )


def authorize(ctrl: SimController) -> Response | None:
    """The refusal of a worker route for this request's token, or ``None``."""
    denied = ctrl._denial(request.headers.get("Authorization", ""))
    return None if denied is None else response(protocol.reply_error(*denied))


def create_app(ctrl: SimController) -> QuartTrio:
    """The quart-trio app serving ``ctrl`` (E1–E7)."""
    app = QuartTrio(__name__)
    app.config["MAX_CONTENT_LENGTH"] = 16 * MAX_LOG_CHUNK
    app.config["RESPONSE_TIMEOUT"] = MAX_WAIT + 30
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False

    async def handle(endpoint: str, **params: str) -> Response:
        body = cast(bytes, await request.get_data(as_text=False))
        rec = record(ctrl, endpoint, body)
        delay = ctrl.fault_plan.delay(endpoint)
        if delay > 0:
            await trio.sleep(delay)
        await ctrl._pass_gate(endpoint)
        fault = ctrl.fault_plan.take(endpoint)
        if fault is not None and fault.status is None:
            ctrl._mark(rec, "dropped")
            client = request.scope.get("client")
            scope = ctrl._conns.get(client[1]) if client else None
            if scope is not None:
                scope.cancel()
            await trio.sleep(1.0)  # the proxy has cut the socket; this answer goes nowhere
            return response(protocol.reply_empty(500))
        if fault is not None:
            ctrl._mark(rec, "injected")
            if fault.body is not None:
                return Response(
                    fault.body, status=fault.status or 503, content_type="application/json"
                )
            return response(
                protocol.reply_error(fault.status or 503, "injected", "simulated failure")
            )
        denied = authorize(ctrl)
        if denied is not None:
            return denied
        try:
            if endpoint == "register":
                reply = protocol.register(ctrl, body)
            elif endpoint == "labels":
                reply = protocol.labels(ctrl, params["worker_id"], body)
            elif endpoint == "heartbeat":
                reply = protocol.heartbeat(ctrl, params["worker_id"], body)
            elif endpoint == "assignments":
                wait = request.args.get("wait", "")
                reply = await protocol.assignments(ctrl, params["worker_id"], wait)
            elif endpoint == "status":
                reply = protocol.status(ctrl, params["job_id"], body)
            elif endpoint == "logs":
                reply = protocol.logs(ctrl, params["job_id"], body)
            else:
                reply = protocol.fault(ctrl, params["device_id"], body)
        except WireError as exc:
            code = "sheet_too_large" if exc.status == 413 else "bad_request"
            reply = protocol.reply_error(exc.status, code, str(exc))
        ctrl._notify()
        return response(reply)

    routes = [
        ("register", "/v1/workers/register", "POST"),
        ("labels", "/v1/workers/<worker_id>/labels", "POST"),
        ("heartbeat", "/v1/workers/<worker_id>/heartbeat", "POST"),
        ("assignments", "/v1/workers/<worker_id>/assignments", "GET"),
        ("status", "/v1/jobs/<job_id>/status", "POST"),
        ("logs", "/v1/jobs/<job_id>/logs", "POST"),
        ("fault", "/v1/devices/<device_id>/fault", "POST"),
    ]
    for name, rule, method in routes:

        async def view(_name: str = name, **params: str) -> Response:
            return await handle(_name, **params)

        app.add_url_rule(rule, name, view, methods=[method])

    from fleet_trio.sim.client_api import mount_client  # POST /v1/jobs & co. (rc run's side)
    from fleet_trio.sim.relay import mount_relay  # E8/E9 (tty/pipe jobs) and their sessions

    mount_relay(app, ctrl)
    mount_client(app, ctrl)

    @app.after_request
    async def _instance(resp: Response) -> Response:
        resp.headers[INSTANCE_HEADER] = ctrl.instance
        return resp

    async def _http_error(exc: HTTPException) -> Response:
        # Go's ServeMux answers: plain text, not the JSON envelope.
        code = exc.code or 500
        text = "404 page not found\n" if code == 404 else f"{exc.name}\n"
        resp = Response(text, status=code, content_type="text/plain; charset=utf-8")
        resp.headers["X-Content-Type-Options"] = "nosniff"
        allow = getattr(exc, "valid_methods", None)
        if code == 405 and allow:
            resp.headers["Allow"] = ", ".join(allow)
        return resp

    app.register_error_handler(HTTPException, _http_error)
    return app


async def _proxy(ctrl: SimController, backend_port: int, client: trio.SocketStream) -> None:
    async with client:
        if trio.current_time() < ctrl._down_until:
            return
        try:
            backend = await trio.open_tcp_stream("127.0.0.1", backend_port)
        except OSError:
            return
        async with backend:
            port = backend.socket.getsockname()[1]
            with trio.CancelScope() as scope:
                ctrl._conns[port] = scope
                try:
                    await splice(client, backend, scope)
                finally:
                    del ctrl._conns[port]


async def _reaper(ctrl: SimController) -> None:
    while True:
        await trio.sleep(ctrl.reaper_interval)
        ctrl.reap()


async def serve_controller(
    ctrl: SimController,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``ctrl`` until cancelled; ``started`` with the base URL (``http://host:port``)."""
    hc = HypercornConfig()
    hc.bind = ["127.0.0.1:0"]
    hc.accesslog = None
    hc.errorlog = None
    hc.graceful_timeout = 0.5
    hc.keep_alive_timeout = 120
    async with trio.open_nursery() as nursery:
        urls: list[str] = await nursery.start(hypercorn_serve, create_app(ctrl), hc)
        backend_port = int(urls[0].rsplit(":", 1)[1])
        listeners = await trio.open_tcp_listeners(port, host=host)
        bound = listeners[0].socket.getsockname()[1]
        ctrl._started_at = trio.current_time()
        nursery.start_soon(_reaper, ctrl)
        serve = functools.partial(trio.serve_listeners, handler_nursery=nursery)
        await nursery.start(serve, functools.partial(_proxy, ctrl, backend_port), listeners)
        shown = f"[{host}]" if ":" in host else host
        ctrl.base_url = f"http://{shown}:{bound}"
        task_status.started(ctrl.base_url)


__all__ = ["create_app", "serve_controller"]
