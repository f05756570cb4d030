"""Acceptance (issue "nothing gets in"): a page served from another origin, in a real headless
Chromium, tries a ``no-cors`` dispatch and the websocket tail against a running node and a
worker's tail listener. Neither succeeds, judged on the server side (the edge refused the
requests, no job is registered, no tail was served), and the node's own page still works.

The other origin is a tiny HTTP server on another loopback port: ``127.0.0.1:A`` and
``127.0.0.1:B`` are different origins but the same site and the same (loopback) address space,
so the browser itself lets the requests go out (no Private Network Access block) and only the
edge stands in the way. Skipped where no Chromium is installed.
"""

from __future__ import annotations

import functools
import json
import logging
from pathlib import Path
from typing import Any

import pytest
import trio

import fleet_trio.logbus.ui as ui_module
from fleet_trio.logbus.bus import LogBus
from fleet_trio.worker.listener import serve_tail_listener
from tests.browser import NO_CHROMIUM, Cdp, chromium, chromium_binary
from tests.helpers import read_head, wait_until
from tests.node.harness import colour_config, colour_dispatch, running_node

EVIL_PAGE = b"<!doctype html><title>another origin</title><p>nothing to see"

# Runs in the other origin's page: the attacks of the issue, reporting what the page saw.
ATTACK_JS = """
(async () => {
  const out = {};
  const body = JSON.stringify({job_id: "evil-1", task_type: "colour", payload: {}});
  try {
    const r = await fetch(NODE + "/fleet/dispatch",
                          {method: "POST", mode: "no-cors", body: new Blob([body])});
    out.fetch = r.type;
  } catch (e) { out.fetch = "error: " + e; }
  try {
    const r = await fetch(NODE + "/fleet/dispatch", {method: "POST", mode: "no-cors",
        headers: {"Content-Type": "text/plain"},
        body: body.replace("evil-1", "evil-2")});
    out.fetch_text = r.type;
  } catch (e) { out.fetch_text = "error: " + e; }
  const tail = (url) => new Promise((resolve) => {
    const got = {opened: false, messages: []};
    const ws = new WebSocket(url);
    ws.onopen = () => { got.opened = true; };
    ws.onmessage = (e) => got.messages.push(String(e.data));
    ws.onclose = (e) => { got.code = e.code; resolve(got); };
    setTimeout(() => { got.timeout = true; resolve(got); }, 8000);
  });
  out.node_tail = await tail(NODE.replace("http", "ws") + "/fleet/jobs/victim/tail");
  out.worker_tail = await tail(WORKER.replace("http", "ws") + "/fleet/jobs/w-victim/tail");
  return out;
})()
"""


# Runs in the same page against a listener that lists its origin: both work.
LISTED_JS = """
(async () => {
  const out = {};
  const r = await fetch(LISTENER + "/fleet/ui/jobs");  // mode "cors": the answer is readable
  out.jobs = (await r.json()).map((row) => row.job_id);
  out.tail = await new Promise((resolve) => {
    const got = {opened: false, messages: []};
    const ws = new WebSocket(LISTENER.replace("http", "ws") + "/fleet/jobs/w-victim/tail");
    ws.onopen = () => { got.opened = true; };
    ws.onmessage = (e) => got.messages.push(String(e.data));
    ws.onclose = (e) => { got.code = e.code; resolve(got); };
    setTimeout(() => { got.timeout = true; resolve(got); }, 8000);
  });
  return out;
})()
"""


async def serve_page(
    html: bytes, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
) -> None:
    """The other origin: answers every GET with ``html`` (one request per connection)."""

    async def handler(stream: trio.SocketStream) -> None:
        with trio.move_on_after(10):
            if b"\r\n\r\n" not in await read_head(stream):
                return
            head = (
                b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n"
                b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(html)
            )
            await stream.send_all(head + html)
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, handler, 0, host="127.0.0.1")
        )
        port = listeners[0].socket.getsockname()[1]
        task_status.started(f"http://127.0.0.1:{port}")


async def final_state_is(cdp: Cdp, session: str, state_js: str, state: str) -> bool:
    return bool(await cdp.evaluate(session, state_js) == state)


async def open_page(cdp: Cdp, url: str) -> str:
    """A new tab on ``url``, loaded; its CDP session."""
    target = await cdp.call("Target.createTarget", url="about:blank")
    attached = await cdp.call("Target.attachToTarget", targetId=target["targetId"], flatten=True)
    session: str = attached["sessionId"]
    await cdp.call("Page.enable", session)
    await cdp.call("Page.navigate", session, url=url)

    async def loaded() -> bool:
        try:  # the first evaluations may land on about:blank or mid-navigation
            href = await cdp.evaluate(session, "location.href + ' ' + document.readyState")
        except RuntimeError:
            return False
        return bool(href.startswith(url) and href.endswith("complete"))

    await wait_until(loaded, timeout=30, interval=0.05, what=f"{url} loaded")
    return session


@pytest.mark.slow
@pytest.mark.skipif(chromium_binary() is None, reason=NO_CHROMIUM)
async def test_another_origin_gets_nothing_and_the_own_page_works(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    binary = chromium_binary()
    assert binary is not None
    caplog.set_level(logging.INFO, logger="fleet_trio.edge")
    served: list[str] = []  # server side: every tail the node or the listener streams
    real_serve_tail = ui_module.serve_tail

    async def counting_serve_tail(bus: LogBus, job_id: str, *args: Any) -> int:
        served.append(job_id)
        return await real_serve_tail(bus, job_id, *args)

    monkeypatch.setattr(ui_module, "serve_tail", counting_serve_tail)

    worker_bus = LogBus()  # the worker's side: a job whose output is a secret
    w_log = worker_bus.open("w-victim")
    await w_log.write("stdout", b"worker secret\n")

    async with running_node(tmp_path, colour_config(tmp_path)) as h, trio.open_nursery() as n:
        await colour_dispatch(h, "victim", lines=2)  # the node's side: a job to read
        await h.wait_terminal("victim")
        worker_url = await n.start(serve_tail_listener, worker_bus, "127.0.0.1:0")
        evil_url = await n.start(serve_page, EVIL_PAGE)
        assert evil_url != h.node.url and evil_url != worker_url

        async with chromium(binary, tmp_path) as cdp:
            session = await open_page(cdp, evil_url + "/")
            setup = (
                f"const NODE = {json.dumps(h.node.url)}; const WORKER = {json.dumps(worker_url)};"
            )
            seen = await cdp.evaluate(session, setup + ATTACK_JS)

            # -- server side: nothing got in --------------------------------------------------
            assert h.node.store.get("evil-1") is None and h.node.store.get("evil-2") is None
            assert [info.job_id for info in h.node.context.bus.jobs()] == ["victim"]
            assert served == [], served  # no tail was served, on either server
            refusals = [r.getMessage() for r in caplog.records if r.name == "fleet_trio.edge"]
            # the requests did reach the servers (the browser did not stop them): the edge did
            assert sum("refused POST /fleet/dispatch" in m for m in refusals) == 2, refusals
            assert any("refused websocket /fleet/jobs/victim/tail" in m for m in refusals)
            assert any("refused websocket /fleet/jobs/w-victim/tail" in m for m in refusals)
            assert all("cross-origin request refused" in m for m in refusals)
            # -- and what the page saw: opaque answers, sockets that never opened -----------
            assert seen["fetch"] == "opaque" and seen["fetch_text"] == "opaque", seen
            for name in ("node_tail", "worker_tail"):
                assert seen[name]["opened"] is False and seen[name]["messages"] == [], seen
                assert seen[name]["code"] == 1006, seen  # the handshake was refused

            # -- a listener that lists the page's origin serves it, reads included (CORS) ----
            listed_url = await n.start(
                functools.partial(
                    serve_tail_listener, worker_bus, "127.0.0.1:0", allow_origins=(evil_url,)
                )
            )
            w_log.end("done", 0)
            listed_js = LISTED_JS.replace("LISTENER", json.dumps(listed_url))
            seen = await cdp.evaluate(session, listed_js)
            assert seen["jobs"] == ["w-victim"], seen
            assert seen["tail"]["opened"] is True, seen
            frames = [json.loads(m) for m in seen["tail"]["messages"]]
            assert [f["type"] for f in frames] == ["output", "end"], frames
            assert frames[0]["data"] == "worker secret\n"
            assert served == ["w-victim"]

            # -- the node's own page (same origin) still works, websocket included ---------
            served.clear()
            await colour_dispatch(h, "own-page", lines=3, pause=0.1)
            session = await open_page(cdp, f"{h.node.url}/fleet/ui?job=own-page")
            state_js = "document.getElementById('final')?.dataset.state || ''"
            await wait_until(lambda: final_state_is(cdp, session, state_js, "done"), timeout=30)
            text = await cdp.evaluate(session, "document.getElementById('log').textContent")
            assert "red 2 plain bold green 2" in text
            assert served == ["own-page"]
            listed = await cdp.evaluate(
                session,
                "fetch('/fleet/ui/jobs').then(r => r.json()).then(rows => rows.map(r => r.job_id))",
            )
            assert listed == ["own-page", "victim"]
        n.cancel_scope.cancel()
