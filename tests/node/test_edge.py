"""The web edge (``fleet_trio.edge``, docs/security.md): Origin and Host checks on every route of
the node and of the worker's tail listener, and the id rules at the edge (issue: nothing gets in).

The rules are pure functions (tested first); then a real node and a real tail listener on
loopback sockets, with the headers a browser sends (and a raw websocket handshake, so the test
controls ``Host`` and ``Origin`` exactly).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from fleet_trio.edge import (
    REASON_FETCH_SITE,
    REASON_HOST,
    REASON_ORIGIN,
    EdgePolicy,
    EdgeRequest,
    OriginError,
    check_allowed_origin,
    edge_guard,
    is_loopback_name,
    own_origin,
    parse_origin,
    refusal,
)
from fleet_trio.logbus.bus import LogBus
from fleet_trio.node.app import create_app
from fleet_trio.node.config import config_from_mapping
from fleet_trio.worker.listener import serve_tail_listener
from tests.helpers import bare_node_context, read_head
from tests.node.harness import FakeSampler, echo_task, node_config, running_node

SPEC_ID = "a3f9-XYZ_0123456789abcdef.fleet~job"
EVIL = "http://evil.example"

# -- the pure rules ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("http://127.0.0.1:18811", "http://127.0.0.1:18811"),
        ("HTTP://LocalHost:80", "http://localhost"),
        ("https://dash.example:443", "https://dash.example"),
        ("https://dash.example:8443/", "https://dash.example:8443"),
        ("http://[::1]:18811", "http://[::1]:18811"),
        ("null", None),
        ("", None),
        ("file://", None),
        ("chrome-extension://abc", None),
        ("http://a/b", None),
        ("http://u:p@a", None),
        ("http://a:99999", None),
        ("http://a:-1", None),
        ("http://a\n.example", None),
        ("http://\u00fc.example", None),
    ],
)
def test_parse_origin(text: str, want: str | None) -> None:
    assert parse_origin(text) == want


@pytest.mark.parametrize(
    ("host", "want"),
    [
        ("127.0.0.1:18811", True),
        ("127.1.2.3", True),
        ("localhost:1", True),
        ("LOCALHOST.", True),
        ("app.localhost:8080", False),  # DNS may be asked for it: not trusted
        ("[::1]:18811", True),
        ("[::ffff:127.0.0.1]:80", True),
        ("evil.example:18811", False),
        ("localhost.evil.example", False),
        ("0.0.0.0:18811", False),
        ("10.0.0.1", False),
        ("[::1", False),
        ("127.0.0.1:notaport", False),
        ("", False),
    ],
)
def test_loopback_names(host: str, want: bool) -> None:
    assert is_loopback_name(host) is want


def test_own_origin() -> None:
    assert own_origin("http", "127.0.0.1:18811") == "http://127.0.0.1:18811"
    assert own_origin("ws", "127.0.0.1:18811") == "http://127.0.0.1:18811"
    assert own_origin("wss", "node.example:443") == "https://node.example"
    assert own_origin("http", None) is None


def test_refusal_rules() -> None:
    loop = EdgePolicy(loopback=True)
    here = "127.0.0.1:18811"

    def why(policy: EdgePolicy = loop, **kw: Any) -> str | None:
        refused = refusal(EdgeRequest(**{"host": here, **kw}), policy)
        return None if refused is None else refused[0]

    # the dispatcher, curl, the tail client: no Origin, no fetch metadata
    assert why(method="POST") is None
    assert why(host=None) is None
    # the node's own page (same origin), over HTTP and websocket
    assert why(origin="http://127.0.0.1:18811") is None
    assert why(origin="http://127.0.0.1:18811", scheme="ws", websocket=True) is None
    assert why(sec_fetch_site="same-origin", origin="http://127.0.0.1:18811") is None
    assert why(sec_fetch_site="none") is None  # typed into the address bar
    # another origin, also another port of the same host, and the opaque "null"
    assert why(origin=EVIL, method="POST") == REASON_ORIGIN
    assert why(origin="http://127.0.0.1:8000", method="POST") == REASON_ORIGIN
    assert why(origin="http://localhost:18811") == REASON_ORIGIN
    assert why(origin="null") == REASON_ORIGIN
    # DNS rebinding: the page's own name in Host, its Origin matching it
    assert why(host="evil.example:18811", origin="http://evil.example:18811") == REASON_HOST
    assert why(host="evil.example:18811") == REASON_HOST
    # cross-site without Origin: refused, except a top-level GET navigation (a link)
    assert why(sec_fetch_site="cross-site", sec_fetch_mode="no-cors") == REASON_FETCH_SITE
    assert why(sec_fetch_site="same-site", sec_fetch_mode="cors") == REASON_FETCH_SITE
    assert why(sec_fetch_site="cross-site", sec_fetch_mode="navigate") is None
    assert (
        why(sec_fetch_site="cross-site", sec_fetch_mode="navigate", method="POST")
        == REASON_FETCH_SITE
    )
    # the operator's list
    listed = EdgePolicy.build(loopback=True, allow_origins=["https://dash.example:8443/"])
    assert why(listed, origin="https://dash.example:8443") is None
    assert why(listed, origin="https://dash.example") == REASON_ORIGIN
    # a trusted-network listener: any Host, the Origin rule still applies
    open_net = EdgePolicy(loopback=False)
    assert why(open_net, host="node.tailnet.ts.net:18811") is None
    assert why(open_net, host="node.tailnet:18811", origin="http://node.tailnet:18811") is None
    assert why(open_net, host="node.tailnet:18811", origin=EVIL) == REASON_ORIGIN


def test_listed_origins_are_checked() -> None:
    assert check_allowed_origin("HTTPS://Dash.Example:443") == "https://dash.example"
    for bad in ("*", "null", "dash.example", "https://dash.example/path", "ftp://x"):
        with pytest.raises(OriginError, match="is not an origin"):
            check_allowed_origin(bad)


# -- a real node ---------------------------------------------------------------------------------


def echo_config(tmp_path: Path) -> Any:
    return node_config(tmp_path, {"echo": echo_task(tmp_path)})


async def raw_handshake(url: str, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
    """A websocket handshake by hand (so Host and Origin are exactly ours): status, body."""
    host_port = url.removeprefix("http://")
    host, port = host_port.rsplit(":", 1)
    lines = [
        f"GET {path} HTTP/1.1",
        "Upgrade: websocket",
        "Connection: Upgrade",
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Version: 13",
        *(f"{k}: {v}" for k, v in {"Host": host_port, **headers}.items()),
    ]
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream(host, int(port))
        async with stream:
            await stream.send_all(("\r\n".join(lines) + "\r\n\r\n").encode())
            data = await read_head(stream)
            head, _, body = data.partition(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            if status != 101:
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(body) < length:
                    chunk = await stream.receive_some(65536)
                    if not chunk:
                        break
                    body += chunk
            return status, body


async def test_cross_origin_dispatch_is_refused_before_any_work(tmp_path: Path) -> None:
    async with running_node(tmp_path, echo_config(tmp_path)) as h:
        ctx = h.node.context  # its store is what must stay empty
        body = json.dumps({"job_id": "x1", "task_type": "echo", "payload": {}}).encode()
        # a `no-cors` fetch from another page: no Content-Type, an Origin
        for headers in (
            {"Origin": EVIL},
            {"Origin": "null"},
            {"Origin": "http://127.0.0.1:1"},  # another port on the same host
            {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"},
            {"Host": "evil.example"},  # DNS rebinding
            {"Host": "evil.example", "Origin": "http://evil.example"},
        ):
            r = await h.client.post("/fleet/dispatch", content=body, headers=headers)
            assert r.status_code == 403, (headers, r.text)
            assert r.json()["status"] == "error" and r.json()["error"].startswith("forbidden")
            assert ctx.store.get("x1") is None
            assert ctx.store.queue_depth == 0
        # every route: health, poll, metrics, the page, 404s
        for path in ("/fleet/health", "/fleet/jobs/x1", "/metrics", "/fleet/ui", "/nope"):
            r = await h.client.get(path, headers={"Origin": EVIL})
            assert r.status_code == 403, path
        # the dispatcher (no Origin) and the node's own page (its own origin) still work
        r = await h.client.post("/fleet/dispatch", content=body)
        assert r.status_code == 202, r.text
        body2 = json.dumps({"job_id": "x2", "task_type": "echo", "payload": {}}).encode()
        own = {"Origin": h.node.url, "Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors"}
        r = await h.client.post("/fleet/dispatch", content=body2, headers=own)
        assert r.status_code == 202, r.text
        r = await h.client.get("/fleet/ui/jobs", headers=own)
        assert r.status_code == 200
        assert (await h.wait_terminal("x1"))["state"] == "done"


async def test_cross_origin_websocket_tail_is_refused(tmp_path: Path) -> None:
    async with running_node(tmp_path, echo_config(tmp_path)) as h:
        r = await h.dispatch("w1", "echo", {})
        assert r.status_code == 202
        await h.wait_terminal("w1")
        path = "/fleet/jobs/w1/tail"
        for headers in (
            {"Origin": EVIL},
            {"Origin": "null"},
            {"Host": "rebound.example:80", "Origin": "http://rebound.example"},
        ):
            status, body = await raw_handshake(h.node.url, path, headers)
            assert status == 403, headers
            assert json.loads(body)["error"].startswith("forbidden")
        # same origin (the page), and no Origin (the tail client): the handshake succeeds
        assert (await raw_handshake(h.node.url, path, {"Origin": h.node.url}))[0] == 101
        assert (await raw_handshake(h.node.url, path, {}))[0] == 101
        # an id outside the documented set: 400 before the upgrade
        status, body = await raw_handshake(h.node.url, "/fleet/jobs/a%0Ab/tail", {})
        assert status == 400 and b"invalid job_id" in body


async def test_allow_origin_flag_and_key(tmp_path: Path) -> None:
    from fleet_trio.node.server import NodeOptions, NodeStartError, serve_node

    cfg = node_config(
        tmp_path, {"echo": echo_task(tmp_path)}, allow_origins=["https://dash.example"]
    )
    ctx = bare_node_context(
        edge=EdgePolicy.build(
            loopback=True, allow_origins=[*cfg.node.allow_origins, "http://ops.example:3000"]
        ),
    )
    sampler = FakeSampler()
    sampler.publish(16, 1)
    ctx.sampler = sampler  # type: ignore[assignment]
    app = create_app(ctx)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:18811") as c:
        for origin in ("https://dash.example", "http://ops.example:3000"):
            assert (await c.get("/fleet/health", headers={"Origin": origin})).status_code == 200
        assert (await c.get("/fleet/health", headers={"Origin": EVIL})).status_code == 403
        # CORS for a listed origin: the preflight, and the header its page needs to read
        pre = {
            "Origin": "https://dash.example",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type, authorization",
            "Access-Control-Request-Private-Network": "true",
        }
        r = await c.options("/fleet/dispatch", headers=pre)
        assert r.status_code == 204
        assert r.headers["access-control-allow-origin"] == "https://dash.example"
        assert "POST" in r.headers["access-control-allow-methods"]
        assert "content-type" in r.headers["access-control-allow-headers"].lower()
        assert r.headers["access-control-allow-private-network"] == "true"
        r = await c.get("/fleet/health", headers={"Origin": "https://dash.example"})
        assert r.headers["access-control-allow-origin"] == "https://dash.example"
        assert r.headers["vary"] == "Origin"
        r = await c.get("/fleet/jobs/nope", headers={"Origin": "https://dash.example"})
        assert r.status_code == 404 and "access-control-allow-origin" in r.headers
        # no CORS for the server's own origin, nor without an Origin; a foreign preflight: 403
        r = await c.get("/fleet/health", headers={"Origin": "http://127.0.0.1:18811"})
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
        assert "access-control-allow-origin" not in (await c.get("/fleet/health")).headers
        r = await c.options("/fleet/dispatch", headers={**pre, "Origin": EVIL})
        assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
        assert (await c.options("/fleet/dispatch")).status_code == 405
    guard = edge_guard(app)
    assert guard is not None and guard.refused[REASON_ORIGIN] == 2
    # a bad --allow-origin stops the start with a clear error
    with pytest.raises(NodeStartError, match="--allow-origin: 'nope' is not an origin"):
        await serve_node(cfg, NodeOptions(allow_origins=("nope",)))


async def test_trusted_network_listener_skips_the_host_rule() -> None:
    ctx = bare_node_context(
        edge=EdgePolicy(loopback=False),
    )
    transport = httpx.ASGITransport(app=create_app(ctx))
    async with httpx.AsyncClient(transport=transport, base_url="http://node.tailnet:18811") as c:
        assert (await c.get("/fleet/jobs/nope")).status_code == 404
        r = await c.get("/fleet/jobs/nope", headers={"Origin": EVIL})
        assert r.status_code == 403


# -- ids at the edge -----------------------------------------------------------------------------

LONE_SURROGATE = "malformed dispatch body: a string holds a lone UTF-16"


@pytest.mark.parametrize(
    ("job_id", "task_type", "message"),
    [
        pytest.param("a\u0000b", "echo", "invalid job_id", id="job_id-nul"),
        pytest.param("a\ud800b", "echo", LONE_SURROGATE, id="job_id-lone-surrogate"),
        pytest.param("a\nINFO forged line", "echo", "invalid job_id", id="job_id-newline"),
        pytest.param("../etc", "echo", "invalid job_id", id="job_id-dot-dot"),
        pytest.param("-rf", "echo", "invalid job_id", id="job_id-leading-dash"),
        pytest.param("x" * 257, "echo", "invalid job_id", id="job_id-257-chars"),
        pytest.param("ok-id", "ec\u0000ho", "invalid task_type", id="task_type-nul"),
        pytest.param("ok-id", "e\ud800", LONE_SURROGATE, id="task_type-lone-surrogate"),
        pytest.param("ok-id", "e\u00fc", "invalid task_type", id="task_type-non-ascii"),
    ],
)
async def test_bad_ids_are_400_and_nothing_is_registered(
    tmp_path: Path, job_id: str, task_type: str, message: str
) -> None:
    async with running_node(tmp_path, echo_config(tmp_path)) as h:
        body = json.dumps({"job_id": job_id, "task_type": task_type, "payload": {}})
        for _attempt in range(2):  # a retry gets the same 400, never a 409
            r = await h.client.post(
                "/fleet/dispatch",
                content=body.encode(),
                headers={"Content-Type": "application/json"},
            )
            assert r.status_code == 400, r.text
            assert r.json() == {"status": "error", "error": r.json()["error"]}
            assert r.json()["error"].startswith(message)
            assert "\n" not in r.json()["error"] and "\x00" not in r.json()["error"]
            assert h.node.store.get(job_id) is None
            assert h.node.store.queue_depth == 0
            assert h.node.context.bus.jobs() == []


async def test_spec_id_stays_valid_and_polls_check_ids(tmp_path: Path) -> None:
    async with running_node(tmp_path, echo_config(tmp_path)) as h:
        r = await h.dispatch(SPEC_ID, "echo", {})
        assert r.status_code == 202 and r.json() == {"job_id": SPEC_ID, "status": "accepted"}
        assert (await h.wait_terminal(SPEC_ID))["state"] == "done"
        r = await h.client.get("/fleet/jobs/a%00b")
        assert r.status_code == 400 and r.json()["error"].startswith("invalid job_id")
        r = await h.client.get("/fleet/jobs/unknown-but-valid")
        assert r.status_code == 404 and r.json()["error"] == "unknown job"


async def test_ids_from_outside_cannot_forge_log_lines(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with running_node(tmp_path, echo_config(tmp_path)) as h:
        r = await h.dispatch("a\n2026-01-01T00:00:00.000Z ERROR forged", "echo", {})
        assert r.status_code == 400
        r = await h.client.get("/fleet/health", headers={"Origin": b"http://x\x85forged"})
        assert r.status_code == 403
    refused = refusal(EdgeRequest(origin="http://x\r\nforged\x1b[2J"), EdgePolicy())
    assert refused is not None and "\\r\\nforged\\x1b[2J" in refused[1]
    for record in caplog.records:
        assert "\n2026" not in record.getMessage()
        assert "\r\n" not in record.getMessage()


# -- the worker's tail listener ------------------------------------------------------------------


async def test_tail_listener_checks_origin_and_host() -> None:
    bus = LogBus()
    log = bus.open("t1")
    await log.write("stdout", b"secret\n")
    log.end("done", 0)
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_tail_listener, bus, "127.0.0.1:0")
        path = "/fleet/jobs/t1/tail"
        for headers in (
            {"Origin": EVIL},
            {"Origin": "http://127.0.0.1:1"},
            {"Host": "rebound.example", "Origin": "http://rebound.example"},
        ):
            status, body = await raw_handshake(url, path, headers)
            assert status == 403, headers
            assert json.loads(body)["status"] == "error"
        assert (await raw_handshake(url, path, {"Origin": url}))[0] == 101
        assert (await raw_handshake(url, path, {}))[0] == 101
        status, _ = await raw_handshake(url, "/fleet/jobs/a%00/tail", {})
        assert status == 400
        async with httpx.AsyncClient(base_url=url) as c:
            assert (await c.get("/fleet/ui/jobs", headers={"Origin": EVIL})).status_code == 403
            assert (await c.get("/fleet/ui/jobs")).status_code == 200
        nursery.cancel_scope.cancel()
    # listed origins come from tail_allow_origins / --allow-origin
    async with trio.open_nursery() as nursery:
        url = await nursery.start(
            lambda task_status: serve_tail_listener(
                bus, "127.0.0.1:0", allow_origins=("https://dash.example",), task_status=task_status
            )
        )
        headers = {"Origin": "https://dash.example"}
        assert (await raw_handshake(url, "/fleet/jobs/t1/tail", headers))[0] == 101
        nursery.cancel_scope.cancel()


def test_worker_config_key(tmp_path: Path) -> None:
    from fleet_trio.errors import ConfigError
    from fleet_trio.worker.config import load_worker_config

    base = "controller_url: http://c:8080\ndevices: [gpu0]\nhost: h\n"
    path = tmp_path / "w.yaml"
    path.write_text(base + "tail_allow_origins: ['https://dash.example:8443']\n")
    assert load_worker_config(path).tail_allow_origins == ("https://dash.example:8443",)
    for bad, key in (
        ("tail_allow_origins: https://x", "tail_allow_origins"),
        ("tail_allow_origins: ['*']", "tail_allow_origins[0]"),
        ("tail_allow_origins: [3]", "tail_allow_origins[0]"),
    ):
        path.write_text(base + bad + "\n")
        with pytest.raises(ConfigError) as info:
            load_worker_config(path)
        assert info.value.key == key, bad


def test_node_config_key() -> None:
    from fleet_trio.errors import ConfigError

    cfg = config_from_mapping({"node": {"allow_origins": ["https://dash.example"]}})
    assert cfg.node.allow_origins == ["https://dash.example"]
    with pytest.raises(ConfigError) as info:
        config_from_mapping({"node": {"allow_origins": ["https://x/y"]}}, path="n.yaml")
    assert info.value.key == "node.allow_origins[0]"


def test_refused_counts_are_per_app() -> None:
    ctx = bare_node_context()
    a, b = create_app(ctx), create_app(ctx)
    ga, gb = edge_guard(a), edge_guard(b)
    assert ga is not None and gb is not None and ga is not gb
    assert not ga.refused and not gb.refused


# -- the command line ----------------------------------------------------------------------------


def test_cli_allow_origin(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fleet_trio.cli import main

    worker_yaml = tmp_path / "w.yaml"
    worker_yaml.write_text(
        "controller_url: http://c:8080\ndevices: [gpu0]\nhost: h\n"
        "tail_allow_origins: ['https://a.example']\n"
    )
    args = ["worker", "-c", str(worker_yaml), "--check", "--allow-origin", "http://b.example:81"]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["tail_allow_origins"] == ["https://a.example", "http://b.example:81"]
    assert main(["worker", "-c", str(worker_yaml), "--check", "--allow-origin", "*"]) == 1
    assert "--allow-origin: '*' is not an origin" in capsys.readouterr().err
    # the node: a bad flag value stops the start with one error line, exit 1
    node_args = ["node", "--gpu", "fake", "--fake-gpu-dir", str(tmp_path), "--allow-origin", "x"]
    assert main(node_args) == 1
    assert "error: --allow-origin: 'x' is not an origin" in capsys.readouterr().err


async def test_a_repeated_origin_or_host_header_is_refused(tmp_path: Path) -> None:
    """Only the first of two ``Origin`` (or ``Host``) headers was checked: the node's own
    origin first and another after it passed. A repeated one is refused whatever it holds."""
    async with running_node(tmp_path, echo_config(tmp_path)) as h:
        own = h.node.url
        host = own.split("://", 1)[1]
        for headers in ([("Origin", own), ("Origin", EVIL)], [("Origin", own), ("Origin", own)]):
            r = await h.client.get("/fleet/health", headers=headers)
            assert r.status_code == 403, (headers, r.text)
        # two Host headers: the HTTP parser refuses them before the edge looks (raw: no
        # client library sends such a request)
        port = int(host.rsplit(":", 1)[1])
        with trio.fail_after(10):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            async with stream:
                request = f"GET /fleet/health HTTP/1.1\r\nHost: {host}\r\nHost: evil.example\r\n"
                await stream.send_all(request.encode() + b"\r\n")
                head = await read_head(stream)
        assert head.split(b" ", 2)[1] in (b"400", b"403"), head
