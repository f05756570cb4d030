"""The web edge both roles share: Origin, Host and path-id checks before any route runs.

A node (and a worker's tail listener) on loopback with no token trusts whoever can open a TCP
connection to it. A web page the operator visits can do that too: its browser sends a
``no-cors`` POST or opens a websocket to ``127.0.0.1`` on the page's behalf, and a DNS name
that the attacker re-points at ``127.0.0.1`` (DNS rebinding) even makes the page same-origin
with the node. So every request passes :func:`refusal` first (installed as a quart hook by
:class:`EdgeGuard`, for HTTP routes and websockets alike, 404s included):

1. **Host.** On a loopback listener the ``Host`` header must name a loopback host
   (``localhost``, ``127.0.0.0/8``, ``::1``); a rebinding page's requests carry
   its own domain name there. A listener on a trusted network (``--listen-trusted-network``)
   is reached under names this code cannot know, so its Host is not checked.
2. **Origin.** Browsers send ``Origin`` on every websocket handshake and every POST (also in
   ``no-cors`` mode). A request carrying one is served only when it is the server's own
   (``scheme://Host``, what the node's own page ``/fleet/ui`` sends) or one the operator listed
   (``--allow-origin`` / ``allow_origins:``). ``Origin: null`` (a sandboxed frame, a file) is
   never the server's own.
3. **Fetch metadata.** A browser request without ``Origin`` (a cross-site ``<img>`` or
   ``no-cors`` GET) that says ``Sec-Fetch-Site: cross-site`` or ``same-site`` is refused too,
   except a top-level GET navigation (a link to the page).

A listed origin gets CORS: its ``OPTIONS`` preflight is answered 204 and every response to it
carries ``Access-Control-Allow-Origin``, so its page can read the answers too.

A refusal is **403** with the error envelope, before the route's own checks (token, body). The
dispatcher, ``curl`` and the ``fleet-trio tail`` client are not browsers: they send neither
``Origin`` nor fetch metadata, and only the Host rule applies to them (they send the address
they connect to, which on a loopback listener is a loopback one).

Then every path variable named ``job_id`` must be a valid id (:func:`fleet_trio.inputs.id_problem`),
else **400** ``invalid job_id: …``, before anything looks it up.

The checks are pure functions of the request's headers (:class:`EdgeRequest`); the quart part is
:meth:`EdgeGuard.install`.

Both roles also take from here listen addresses (:func:`split_host_port`), the loopback rule
(:func:`is_loopback_host`) and the error envelope (:func:`error_body`, :func:`unauthorized`).
"""

from __future__ import annotations

import ipaddress
import json
import logging
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

import attrs

from fleet_trio.inputs import id_problem, printable

if TYPE_CHECKING:  # quart is imported where a response is made: the parsers stay light
    from quart import Quart, Response

log = logging.getLogger(__name__)

DEFAULT_PORTS = {"http": 80, "https": 443}
"""Ports an origin leaves out."""

REASON_HOST = "host"
REASON_ORIGIN = "origin"
REASON_FETCH_SITE = "fetch-site"
REASON_JOB_ID = "job_id"

FORBIDDEN_ORIGIN = "forbidden: cross-origin request refused (origin {origin} is not allowed)"
FORBIDDEN_HOST = "forbidden: host {host} is not a loopback name on a loopback listener"
FORBIDDEN_FETCH_SITE = "forbidden: cross-site browser request refused"
MSG_UNAUTHORIZED = "unauthorized"
"""The 401 message of both roles (node.md §2.5)."""


class OriginError(ValueError):
    """An operator-listed origin that is not ``scheme://host[:port]``."""


# -- pure functions ------------------------------------------------------------------------------


def _split_host(host: str) -> tuple[str, int | None] | None:
    """``host[:port]`` (a ``Host`` header or an origin's netloc) → lower-cased name and port."""
    host = host.strip().lower()
    if not host:
        return None
    port_text = ""
    if host.startswith("["):
        end = host.find("]")
        if end < 0:
            return None
        name, rest = host[1:end], host[end + 1 :]
        if rest:
            if not rest.startswith(":"):
                return None
            port_text = rest[1:]
    elif host.count(":") == 1:
        name, port_text = host.split(":")
        if not port_text:
            return None
    else:  # a bare IPv6 address (not a valid Host) is kept whole
        name = host
    if not name:
        return None
    if port_text:
        if not (port_text.isascii() and port_text.isdigit()) or len(port_text) > 5:
            return None
        port = int(port_text)
        if port > 65535:
            return None
        return name, port
    return name, None


def split_host_port(addr: str) -> tuple[str, str]:
    """A listen address ``HOST:PORT`` (Go's ``net.SplitHostPort``); ``ValueError`` with Go's
    messages."""
    if addr.startswith("["):
        end = addr.find("]")
        if end < 0:
            raise ValueError("missing ']' in address")
        host, rest = addr[1:end], addr[end + 1 :]
        if not rest:
            raise ValueError("missing port in address")
        if not rest.startswith(":"):
            raise ValueError("unexpected characters after ']' in address")
        port = rest[1:]
        if ":" in port:
            raise ValueError("too many colons in address")
        return host, port
    i = addr.rfind(":")
    if i < 0:
        raise ValueError("missing port in address")
    host, port = addr[:i], addr[i + 1 :]
    if ":" in host:
        raise ValueError("too many colons in address")
    if "[" in host or "]" in host or "[" in port or "]" in port:
        raise ValueError("unexpected '[' or ']' in address")
    return host, port


def is_loopback_host(host: str) -> bool:
    """The loopback rule: ``localhost`` (any case), 127.0.0.0/8, ``::1`` and IPv4-mapped
    loopback (brackets allowed).

    Names under ``.localhost`` are not accepted: a browser that asks DNS for them (not every
    one hard-wires them to loopback) could be answered by a hostile resolver, the classic
    rebinding setup."""
    if host.lower() == "localhost":
        return True
    host = host.removeprefix("[").removesuffix("]")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback


def is_loopback_name(host: str) -> bool:
    """Whether a ``Host`` header value (``host[:port]``) names this machine's loopback
    (:func:`is_loopback_host`; a fully qualified ``localhost.`` too)."""
    split = _split_host(host)
    return split is not None and (split[0] == "localhost." or is_loopback_host(split[0]))


def _origin(scheme: str, host: str) -> str | None:
    """The origin of a ``Host``/netloc value (default port left out); ``None`` if invalid."""
    split = _split_host(host)
    if split is None:
        return None
    name, port = split
    shown = f"[{name}]" if ":" in name else name
    if port is None or DEFAULT_PORTS.get(scheme) == port:
        return f"{scheme}://{shown}"
    return f"{scheme}://{shown}:{port}"


def parse_origin(text: str) -> str | None:
    """The normalised form of an ``Origin`` value (``scheme://host[:port]``: lower case, the
    default port left out), or ``None`` when it is not a tuple origin (``null``, a path, user
    info, an unknown scheme)."""
    text = text.strip()
    if not text or text == "null" or not text.isascii() or not text.isprintable():
        return None
    try:
        parts = urlsplit(text)
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        return None
    if parts.path not in ("", "/") or parts.query or parts.fragment or "@" in parts.netloc:
        return None
    return _origin(scheme, parts.netloc)


def own_origin(scheme: str, host: str | None) -> str | None:
    """The origin a browser gives the server itself: its scheme (``ws``/``wss`` count as
    ``http``/``https``) and the request's ``Host``; ``None`` without a usable Host."""
    if not host:
        return None
    scheme = {"ws": "http", "wss": "https"}.get(scheme.lower(), scheme.lower())
    if scheme not in DEFAULT_PORTS:
        return None
    return _origin(scheme, host)


def check_allowed_origin(text: str) -> str:
    """An operator-listed origin, normalised; :class:`OriginError` when it is not one."""
    origin = parse_origin(text)
    if origin is None:
        raise OriginError(
            f"{printable(text, limit=80)!r} is not an origin: want scheme://host[:port] with "
            "scheme http or https and no path, e.g. https://dash.example:8443"
        )
    return origin


@attrs.frozen
class EdgePolicy:
    """What a listener accepts: ``loopback`` (the Host rule applies) and the listed origins
    (normalised by :func:`check_allowed_origin`)."""

    loopback: bool = True
    allowed_origins: frozenset[str] = frozenset()

    @classmethod
    def build(cls, *, loopback: bool, allow_origins: Iterable[str] = ()) -> EdgePolicy:
        """Raises :class:`OriginError` for a listed value that is not an origin."""
        return cls(
            loopback=loopback,
            allowed_origins=frozenset(check_allowed_origin(o) for o in allow_origins),
        )


class HeaderLookup(Protocol):
    """A case-insensitive header mapping (werkzeug's ``Headers``, a dict in tests)."""

    def get(self, key: str, /) -> str | None: ...


@attrs.frozen
class EdgeRequest:
    """The parts of a request the edge looks at (header values as received, or ``None``)."""

    method: str = "GET"
    scheme: str = "http"
    host: str | None = None
    origin: str | None = None
    sec_fetch_site: str | None = None
    sec_fetch_mode: str | None = None
    websocket: bool = False
    path: str = ""
    """For the log line only."""

    @classmethod
    def from_headers(
        cls,
        method: str,
        scheme: str,
        headers: HeaderLookup,
        *,
        websocket: bool = False,
        path: str = "",
    ) -> EdgeRequest:
        return cls(
            path=path,
            method=method.upper(),
            scheme=scheme,
            host=_single(headers, "Host"),
            origin=_single(headers, "Origin"),
            sec_fetch_site=headers.get("Sec-Fetch-Site"),
            sec_fetch_mode=headers.get("Sec-Fetch-Mode"),
            websocket=websocket,
        )


def _single(headers: HeaderLookup, name: str) -> str | None:
    """The header's value; a repeated header's values joined with ``", "`` (no host or origin
    then matches: a request naming two is refused, whichever a check would have looked at)."""
    getlist = getattr(headers, "getlist", None)
    if getlist is not None:
        values = getlist(name)
        if len(values) > 1:
            return ", ".join(values)
    return headers.get(name)


def refusal(req: EdgeRequest, policy: EdgePolicy) -> tuple[str, str] | None:
    """Why the edge refuses ``req`` — ``(reason, message)`` — or ``None`` to let it through."""
    if policy.loopback and req.host and not is_loopback_name(req.host):
        return REASON_HOST, FORBIDDEN_HOST.format(host=printable(req.host, limit=80))
    if req.origin is not None:
        origin = parse_origin(req.origin)
        if origin is not None and (
            origin in policy.allowed_origins or origin == own_origin(req.scheme, req.host)
        ):
            return None
        return REASON_ORIGIN, FORBIDDEN_ORIGIN.format(origin=printable(req.origin, limit=80))
    site = (req.sec_fetch_site or "").strip().lower()
    if site in ("cross-site", "same-site"):
        mode = (req.sec_fetch_mode or "").strip().lower()
        if mode == "navigate" and req.method in ("GET", "HEAD") and not req.websocket:
            return None  # a link to the page: harmless, the page holds no data
        return REASON_FETCH_SITE, FORBIDDEN_FETCH_SITE
    return None


def listen_is_loopback(listen: str) -> bool:
    """Whether a listen address ``HOST:PORT`` binds loopback only (then the Host rule
    applies). An address that does not parse counts as loopback: the stricter rule."""
    try:
        host, _port = split_host_port(listen)
    except ValueError:
        return True
    return is_loopback_host(host)


def path_id_problem(view_args: Mapping[str, Any] | None) -> str | None:
    """The 400 message for a ``job_id`` path variable that is not a valid id, or ``None``."""
    if not view_args or "job_id" not in view_args:
        return None
    problem = id_problem(str(view_args["job_id"]))
    return None if problem is None else f"invalid job_id: {problem}"


# -- the quart hook ------------------------------------------------------------------------------

CORS_METHODS = "GET, HEAD, POST"
CORS_HEADERS = "Authorization, Content-Type"
CORS_MAX_AGE = "600"


def cors_headers(origin: str) -> dict[str, str]:
    """What a response to a listed origin carries so its page may read it (CORS)."""
    return {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}


def preflight_response(origin: str, headers: HeaderLookup) -> Response:
    """204 to a listed origin's CORS preflight (``OPTIONS``): the methods and headers the
    routes use; ``Access-Control-Allow-Private-Network`` when the browser asks (a public page
    calling a loopback node)."""
    from quart import Response

    out = {
        **cors_headers(origin),
        "Access-Control-Allow-Methods": CORS_METHODS,
        "Access-Control-Allow-Headers": CORS_HEADERS,
        "Access-Control-Max-Age": CORS_MAX_AGE,
    }
    if (headers.get("Access-Control-Request-Private-Network") or "").lower() == "true":
        out["Access-Control-Allow-Private-Network"] = "true"
    return Response(b"", status=204, headers=out)


def error_body(message: str) -> bytes:
    """The error envelope: exactly ``status`` and ``error`` (node.md §2.1), one JSON line. A
    lone surrogate is written as its JSON escape, never a 500."""
    text = json.dumps(
        {"status": "error", "error": message}, ensure_ascii=False, separators=(",", ":")
    )
    return (text + "\n").encode("utf-8", errors="backslashreplace")


def error_response(message: str, status: int, headers: Mapping[str, str] | None = None) -> Response:
    """The error envelope as a response."""
    from quart import Response

    return Response(
        error_body(message),
        status=status,
        headers=dict(headers or {}),
        content_type="application/json",
    )


def unauthorized() -> Response:
    """401 ``unauthorized`` with ``WWW-Authenticate: Bearer`` (a missing or wrong token)."""
    return error_response(MSG_UNAUTHORIZED, 401, {"WWW-Authenticate": 'Bearer realm="fleet-trio"'})


@attrs.define
class EdgeGuard:
    """The checks of this module as ``before_request`` / ``before_websocket`` hooks of an app.

    ``refused`` counts the refusals by reason (``host``, ``origin``, ``fetch-site``,
    ``job_id``); it belongs to the app (no module-level state).
    """

    policy: EdgePolicy = attrs.field(factory=EdgePolicy)
    refused: Counter[str] = attrs.field(factory=Counter)

    def check(self, req: EdgeRequest, view_args: Mapping[str, Any] | None) -> Response | None:
        """The refusal response for a request, or ``None``."""
        refused = refusal(req, self.policy)
        if refused is not None:
            reason, message = refused
            self.refused[reason] += 1
            log.info(
                "edge: refused %s %s: %s",
                "websocket" if req.websocket else req.method,
                printable(req.path, limit=200),
                message,
            )
            return error_response(message, 403)
        problem = path_id_problem(view_args)
        if problem is not None:
            self.refused[REASON_JOB_ID] += 1
            return error_response(problem, 400)
        return None

    def listed_origin(self, req: EdgeRequest) -> str | None:
        """The request's ``Origin`` when it is an operator-listed one (CORS applies), else
        ``None`` (no Origin, the server's own, or refused anyway)."""
        if req.origin is None or not self.policy.allowed_origins:
            return None
        origin = parse_origin(req.origin)
        if origin is None or origin not in self.policy.allowed_origins:
            return None
        return None if origin == own_origin(req.scheme, req.host) else req.origin.strip()

    def install(self, app: Quart) -> None:
        """Run :meth:`check` before every HTTP request and websocket handshake of ``app``."""
        from quart import request, websocket

        async def _http() -> Response | None:
            req = EdgeRequest.from_headers(
                request.method, request.scheme, request.headers, path=request.path
            )
            refused = self.check(req, request.view_args)
            if refused is not None:
                return refused
            listed = self.listed_origin(req)
            if listed is not None and req.method == "OPTIONS":
                return preflight_response(listed, request.headers)
            return None

        async def _cors(response: Response) -> Response:
            listed = self.listed_origin(
                EdgeRequest.from_headers(request.method, request.scheme, request.headers)
            )
            if listed is not None:
                response.headers.update(cors_headers(listed))
            return response

        async def _ws() -> Response | None:
            req = EdgeRequest.from_headers(
                "GET", websocket.scheme, websocket.headers, websocket=True, path=websocket.path
            )
            return self.check(req, websocket.view_args)

        app.before_request(_http)
        app.after_request(_cors)
        app.before_websocket(_ws)
        app.extensions["fleet_trio_edge"] = self


def edge_guard(app: Quart) -> EdgeGuard | None:
    """The guard installed on ``app`` (tests read its ``refused`` counts)."""
    guard = app.extensions.get("fleet_trio_edge")
    return guard if isinstance(guard, EdgeGuard) else None


__all__ = [
    "FORBIDDEN_FETCH_SITE",
    "FORBIDDEN_HOST",
    "FORBIDDEN_ORIGIN",
    "MSG_UNAUTHORIZED",
    "REASON_FETCH_SITE",
    "REASON_HOST",
    "REASON_JOB_ID",
    "REASON_ORIGIN",
    "EdgeGuard",
    "EdgePolicy",
    "EdgeRequest",
    "OriginError",
    "check_allowed_origin",
    "cors_headers",
    "edge_guard",
    "error_body",
    "error_response",
    "is_loopback_host",
    "is_loopback_name",
    "listen_is_loopback",
    "own_origin",
    "parse_origin",
    "path_id_problem",
    "preflight_response",
    "refusal",
    "split_host_port",
    "unauthorized",
]
