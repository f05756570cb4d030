"""FaultyLink: a loopback TCP proxy with injectable faults, in front of a tiny HTTP server."""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
import trio
import trio.testing

from fleet_trio.sim.faults import FaultyLink, serve_link
from fleet_trio.sim.fleet import free_port
from tests.helpers import read_head


async def _http_backend(tag: str, stream: trio.SocketStream) -> None:
    """Answers every GET on a keep-alive connection with 200 ``{"backend": tag}``."""
    buf = b""
    try:
        async with stream:
            while True:
                buf = await read_head(stream, buf)
                if b"\r\n\r\n" not in buf:
                    return
                _, buf = buf.split(b"\r\n\r\n", 1)
                body = json.dumps({"backend": tag}).encode()
                await stream.send_all(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return


async def backend(nursery: trio.Nursery, tag: str) -> int:
    serve = functools.partial(trio.serve_tcp, host="127.0.0.1")
    listeners = await nursery.start(serve, functools.partial(_http_backend, tag), 0)
    port: int = listeners[0].socket.getsockname()[1]
    return port


@asynccontextmanager
async def linked(tag: str = "one") -> AsyncIterator[tuple[FaultyLink, httpx.AsyncClient]]:
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            port = await backend(nursery, tag)
            link = FaultyLink("127.0.0.1", port, name="test")
            url = await nursery.start(serve_link, link)
            assert url == link.url == f"http://127.0.0.1:{link.port}"
            async with httpx.AsyncClient(base_url=url, timeout=5, trust_env=False) as client:
                yield link, client
            nursery.cancel_scope.cancel()


async def test_forwards_and_counts_connections() -> None:
    async with linked() as (link, client):
        for _ in range(3):
            r = await client.get("/x")
            assert r.status_code == 200 and r.json() == {"backend": "one"}
        assert link.connections == 1  # keep-alive: one connection for three requests
        assert any("forwarded" in what for _, what in link.events)


async def test_latency_is_added_and_heal_removes_it() -> None:
    async with linked() as (link, client):
        await client.get("/warm")
        assert link.delayed == 0
        link.latency(0.25)
        t0 = trio.current_time()
        assert (await client.get("/slow")).status_code == 200
        assert trio.current_time() - t0 >= 0.25
        assert link.delayed >= 1  # the request's bytes waited out the latency
        link.heal()
        before = link.delayed
        assert (await client.get("/fast")).status_code == 200
        assert link.delayed == before  # healed: forwarded without a wait
        assert [w for _, w in link.events if w.startswith(("latency", "heal"))] == [
            "latency 0.25s",
            "heal",
        ]


async def test_fail_http_answers_new_connections_then_passes() -> None:
    async with linked() as (link, client):
        link.fail_http(502, count=2)
        for _ in range(2):
            r = await client.get("/x")
            assert r.status_code == 502 and r.json() == {"error": "injected"}
            assert r.headers["connection"] == "close"
        r = await client.get("/x")
        assert r.status_code == 200 and r.json() == {"backend": "one"}
        assert link.connections == 3
        # a POST with a body gets the canned answer too
        link.fail_http()
        link.drop_all()  # the 200 left a pooled connection; force a new one
        await trio.testing.wait_all_tasks_blocked()
        r = await client.post("/fleet/dispatch", content=b'{"job_id": "j"}' * 100)
        assert r.status_code == 503


async def test_faults_apply_to_new_connections_and_drop_all_forces_one() -> None:
    async with linked() as (link, client):
        assert (await client.get("/x")).status_code == 200  # pooled connection now open
        link.fail_http(503)
        assert (await client.get("/x")).status_code == 200  # reused: the fault waits
        assert link.open_connections == 1
        link.drop_all()
        await trio.testing.wait_all_tasks_blocked()
        assert link.open_connections == 0
        assert (await client.get("/x")).status_code == 503  # the reconnect meets it
        assert ("drop_all 1" in [w for _, w in link.events]) and link.connections == 2


async def test_drop_closes_the_connection() -> None:
    async with linked() as (link, client):
        link.drop()
        with pytest.raises(httpx.TransportError):
            await client.get("/x")
        assert (await client.get("/x")).status_code == 200
        assert any(w.endswith("dropped") for _, w in link.events)


async def test_half_open_makes_the_client_time_out_and_heal_restores() -> None:
    async with linked() as (link, client):
        link.half_open(30)
        with pytest.raises(httpx.ReadTimeout):
            await client.get("/x", timeout=0.3)
        assert link.open_connections == 1  # accepted and held, never answered
        link.heal()
        await trio.testing.wait_all_tasks_blocked()
        assert link.open_connections == 0  # heal closed the held connection
        assert (await client.get("/x")).status_code == 200


async def test_retarget_and_a_dead_backend() -> None:
    async with linked("one") as (link, client), trio.open_nursery() as nursery:
        port_two = await backend(nursery, "two")
        assert (await client.get("/x")).json() == {"backend": "one"}
        link.retarget("127.0.0.1", port_two)
        assert (await client.get("/x")).json() == {"backend": "one"}  # open connection kept
        link.drop_all()
        await trio.testing.wait_all_tasks_blocked()
        assert (await client.get("/x")).json() == {"backend": "two"}
        # a backend that is not listening: the client's connection is closed
        link.retarget("127.0.0.1", free_port())
        link.drop_all()
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(httpx.TransportError):
            await client.get("/x")
        assert any("failed" in w for _, w in link.events)
        nursery.cancel_scope.cancel()


def test_bad_arguments_are_refused() -> None:
    link = FaultyLink("127.0.0.1", 1)
    with pytest.raises(ValueError, match="HTTP status"):
        link.fail_http(42)
    with pytest.raises(ValueError, match="latency"):
        link.latency(-1)
    link.drop(2)
    assert link.events[-1] == (0.0, "drop x2") and "not serving" in repr(link)
