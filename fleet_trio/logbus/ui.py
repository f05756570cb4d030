"""The quart side of the live log tail: the websocket handler body shared by the node and the
worker's listener (:func:`stream_tail`), and the browser page, ``GET /fleet/ui`` and
``GET /fleet/ui/jobs``.

The page (``static/tail.html``: plain HTML and JavaScript, no build step, no external
resources) lists the jobs of a :class:`~fleet_trio.logbus.bus.LogBus` and follows one of them
over the websocket tail (``GET /fleet/jobs/<id>/tail``, same origin; see ``docs/tail.md``).

:func:`mount_ui` adds both routes to any quart (or quart-trio) app, so the node and the
worker's listener serve the same page::

    mount_ui(app, lambda: ctx.bus, lambda auth: token_ok(auth))

``check_token`` gets an ``Authorization`` header value (or ``None``) and says whether it is
acceptable; the ``token`` query parameter is checked as ``Bearer <token>``. The page itself
holds no data and is served without a token (a browser cannot set a header on a navigation);
it passes its own ``?token=`` on to the jobs route (as a header) and the websocket (as the
query parameter).
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable
from importlib import resources
from typing import Any

import trio
from quart import Quart, Response, request, websocket

from fleet_trio.edge import error_response
from fleet_trio.logbus.bus import JobInfo, LogBus
from fleet_trio.logbus.fanout import MSG_TOO_MANY_TAILS, Tails, TailSlot
from fleet_trio.logbus.tail import CLOSE_INTERNAL, error_message, serve_tail
from fleet_trio.logbus.tail import dumps as tail_dumps

log = logging.getLogger(__name__)

PAGE_PATH = "/fleet/ui"
JOBS_PATH = "/fleet/ui/jobs"

PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",  # the page's URL may hold ?token=
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
        "connect-src 'self' ws: wss:; img-src data:; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"
    ),
}

UNAUTHORIZED_BODY = b'{"status":"error","error":"unauthorized"}'

TokenCheck = Callable[[str | None], bool]
"""``Authorization`` header value (or ``None``) → acceptable?"""


async def stream_tail(bus: LogBus, job_id: str, tails: Tails | None = None) -> Response | None:
    """Inside a quart websocket route whose token check passed: accept the socket, stream
    ``job_id``'s log with :func:`~fleet_trio.logbus.tail.serve_tail` (query parameters from the
    websocket's URL), and close with its code (1000 after ``end``, 4404 unknown job, 4400 bad
    query, 1011 internal). What the client sends is read and dropped.

    ``tails``: the server's open tails under their caps. Beyond a cap the socket is not
    accepted: the answer is 503 ``too many tails`` (the error envelope), returned for the
    route to return. The slot is given back however the tail ends (its end, the client
    gone, a cancel).

    Cancellation: the handler ends at once (the tree's role or services scope is cancelled,
    or the client went away); the close frame is then not sent, and a write still pending
    to a client that stopped reading is cut by the server (the client is dropped)."""
    slot: TailSlot | None = None
    if tails is not None:
        slot = tails.open(job_id, trio.current_time())
        if slot is None:
            return error_response(MSG_TOO_MANY_TAILS, 503)
    try:
        await _stream(bus, job_id, slot)
    finally:
        if slot is not None:
            slot.close()
    return None


async def _stream(bus: LogBus, job_id: str, slot: TailSlot | None) -> None:
    await websocket.accept()

    send_text = websocket.send

    async def discard_incoming() -> None:
        # The client has nothing to say; reading keeps quart's inbound queue from filling.
        while True:
            await websocket.receive()

    code = CLOSE_INTERNAL
    # counted until the close frame is written: a shutdown waits (bounded) for it
    with bus.streaming():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(discard_incoming)
            try:
                code = await serve_tail(bus, job_id, send_text, websocket.args, slot)
            except Exception:
                log.exception("tail of job %s failed", job_id)
                with trio.move_on_after(1):
                    await send_text(tail_dumps(error_message("internal error")))
            nursery.cancel_scope.cancel()
        with trio.move_on_after(5):
            await websocket.close(code)


@functools.cache
def page_html() -> bytes:
    """``static/tail.html``, read once."""
    return resources.files("fleet_trio.logbus").joinpath("static/tail.html").read_bytes()


NODE_HEADER = "Fleet-Node-Id"
"""The node id (or the worker's host) on ``GET /fleet/ui/jobs`` answers."""


def job_row(info: JobInfo) -> dict[str, Any]:
    """One job of ``GET /fleet/ui/jobs``."""
    return {
        "job_id": info.job_id,
        "state": info.state,
        "started": info.started,
        "ended": info.ended,
        "nbytes": info.nbytes,
        "task_type": info.meta.get("task_type", ""),  # a node job's task type
        "device": info.meta.get("device", ""),  # a worker job's device
    }


def token_ok(check_token: TokenCheck, source: Any = request) -> bool:
    """The current request's (or websocket's) ``Authorization`` header, or its ``token`` query
    parameter."""
    if check_token(source.headers.get("Authorization")):
        return True
    token = source.args.get("token")
    return token is not None and check_token(f"Bearer {token}")


def mount_ui(
    app: Quart,
    get_bus: Callable[[], LogBus],
    check_token: TokenCheck,
    *,
    endpoint_prefix: str = "fleet_ui",
    node_id: str = "",
) -> None:
    """Add ``GET /fleet/ui`` (the page) and ``GET /fleet/ui/jobs`` (its JSON) to ``app``.

    ``node_id`` (the node's id, the worker's host) is sent as the ``Fleet-Node-Id`` header
    of the job list; the page shows it in its heading.

    ``get_bus`` is called per request (the bus may be created after mounting). The page
    expects the websocket tail at ``/fleet/jobs/<id>/tail`` on the same origin.
    """
    html = page_html()  # fail at mount time if the package data is missing

    async def page() -> Response:
        return Response(
            html, status=200, headers=PAGE_HEADERS, content_type="text/html; charset=utf-8"
        )

    async def jobs() -> Response:
        if not token_ok(check_token):
            return Response(
                UNAUTHORIZED_BODY,
                status=401,
                headers={"WWW-Authenticate": 'Bearer realm="fleet-trio"'},
                content_type="application/json",
            )
        rows = [job_row(info) for info in get_bus().jobs()]
        return Response(
            json.dumps(rows, separators=(",", ":")),
            status=200,
            headers={"Cache-Control": "no-store", **({NODE_HEADER: node_id} if node_id else {})},
            content_type="application/json",
        )

    app.add_url_rule(PAGE_PATH, f"{endpoint_prefix}_page", page, methods=["GET"])
    app.add_url_rule(JOBS_PATH, f"{endpoint_prefix}_jobs", jobs, methods=["GET"])


__all__ = [
    "JOBS_PATH",
    "NODE_HEADER",
    "PAGE_PATH",
    "TokenCheck",
    "job_row",
    "mount_ui",
    "page_html",
    "stream_tail",
    "token_ok",
]
