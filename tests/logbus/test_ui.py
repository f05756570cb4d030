"""The browser page of the live tail (``fleet_trio.logbus.ui``, docs/tail.md "Browser page").

Without a browser: the page and its JSON route on a real node, and the token rules. With a
Chromium binary on the PATH: the page itself, driven headless over the Chrome DevTools
protocol (no Playwright), follows a job that prints coloured lines until its end.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from fleet_trio.logbus.ui import page_html
from tests.browser import NO_CHROMIUM, chromium, chromium_binary
from tests.helpers import wait_until
from tests.node.harness import colour_config, colour_dispatch, running_node

TOKEN = "s3cret-ui"
LONG_ID = "6af8cddd-03f6-40c0-b9fd-ac131ecb8ca9"
FIT_JS = """(() => {
  const side = document.getElementById('side');
  const right = side.getBoundingClientRect().left + side.clientWidth;
  const cells = [...document.querySelectorAll('#jobs td')];
  return {scroll: side.scrollWidth, client: side.clientWidth, cells: cells.length,
          past: cells.filter(c => c.getBoundingClientRect().right > right + 0.5)
                     .map(c => c.className)};
})()"""


# -- without a browser ---------------------------------------------------------------------------


def test_page_is_package_data() -> None:
    html = page_html()
    assert html.startswith(b"<!doctype html>")
    # no external resources: no http(s) URL is loaded by the page
    assert not re.search(rb"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    assert b"innerHTML" not in html


async def test_page_and_jobs_route(tmp_path: Path) -> None:
    async with running_node(tmp_path, colour_config(tmp_path)) as h:
        r = await h.client.get("/fleet/ui")
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/html")
        assert "charset=utf-8" in r.headers["content-type"]
        assert r.content == page_html()
        assert "default-src 'none'" in r.headers["content-security-policy"]
        assert r.headers["referrer-policy"] == "no-referrer"

        r = await h.client.get("/fleet/ui/jobs")
        assert r.status_code == 200 and r.json() == []

        await colour_dispatch(h, "ui-1", lines=2)
        await h.wait_terminal("ui-1")
        await colour_dispatch(h, "ui-2", lines=1, exit=3)
        await h.wait_terminal("ui-2")
        r = await h.client.get("/fleet/ui/jobs")
        assert r.status_code == 200
        assert r.headers["content-type"] == "application/json"
        rows = r.json()
        assert [row["job_id"] for row in rows] == ["ui-2", "ui-1"]  # newest first
        for row in rows:
            assert set(row) == {"job_id", "state", "started", "ended", "nbytes"} | {
                "task_type",
                "device",
            }
            assert row["ended"] >= row["started"] > 0
            assert row["task_type"] == "colour"  # the page shows the task type
        assert r.headers["fleet-node-id"] == h.node.context.node_id  # and the node id
        assert [row["state"] for row in rows] == ["error", "done"]
        one_line = len(b"\x1b[31mred 0\x1b[0m plain \x1b[1;32mbold green 0\x1b[0m <b>&amp;\n")
        assert rows[1]["nbytes"] == 2 * one_line + len(b'{"ok": true, "n": 2}')

        # only GET; other paths under /fleet/ui are 404 with the envelope
        assert (await h.client.post("/fleet/ui/jobs")).status_code == 405
        r = await h.client.get("/fleet/ui/nope")
        assert r.status_code == 404 and r.json()["status"] == "error"


async def test_token_rules(tmp_path: Path) -> None:
    async with running_node(tmp_path, colour_config(tmp_path), token=TOKEN) as h:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        await colour_dispatch(h, "ui-t", auth, lines=1)
        # the page holds no data: served without a token
        assert (await h.client.get("/fleet/ui")).status_code == 200
        # the jobs route: 401 (the error envelope) without / with a wrong token
        for headers, params in [
            ({}, {}),
            ({"Authorization": "Bearer nope"}, {}),
            ({}, {"token": "nope"}),
            ({"Authorization": TOKEN}, {}),  # not a bearer header
        ]:
            r = await h.client.get("/fleet/ui/jobs", headers=headers, params=params)
            assert r.status_code == 401, (headers, params)
            assert r.json() == {"status": "error", "error": "unauthorized"}
            assert r.headers["www-authenticate"].startswith("Bearer")
        # the header or the query parameter is enough (a wrong header + a good query too)
        for headers, params in [
            (auth, {}),
            ({}, {"token": TOKEN}),
            ({"Authorization": "Bearer nope"}, {"token": TOKEN}),
        ]:
            r = await h.client.get("/fleet/ui/jobs", headers=headers, params=params)
            assert r.status_code == 200, (headers, params)
            assert [row["job_id"] for row in r.json()] == ["ui-t"]


# -- the page's ANSI parser, run by Node.js when there is one ------------------------------------

PARSER_CASES = r"""
const st = newAnsiState();
const out = [];
for (const chunk of JSON.parse(process.argv[1])) out.push(parseAnsi(st, chunk));
console.log(JSON.stringify(out));
"""


def run_parser(chunks: list[str]) -> list[list[dict[str, str]]]:
    node = shutil.which("node") or shutil.which("nodejs")
    if node is None:
        pytest.skip("no Node.js on this machine: the page's ANSI parser is not run")
    script = re.search(rb"<script>(.*)</script>", page_html(), re.S)
    assert script
    parser = script.group(1).decode().split("// -- page")[0]
    done = subprocess.run(
        [node, "-e", parser + PARSER_CASES, json.dumps(chunks)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    result: list[list[dict[str, str]]] = json.loads(done.stdout)
    return result


def test_ansi_parser() -> None:
    out = run_parser(
        [
            "a\x1b[31mred\x1b[0m \x1b[1;92mbold\x1b[22m thin\x1b[2K\x1b[",  # cut escape
            "44mon blue\x1b[mreset \x1b[38;5;196;33myellow\x1b[39m\x1bZ<b>&amp;",
        ]
    )
    assert out == [
        [
            {"text": "a", "cls": ""},
            {"text": "red", "cls": "fg1"},
            {"text": " ", "cls": ""},
            {"text": "bold", "cls": "b fg10"},
            {"text": " thin\u241b[2K", "cls": "fg10"},
        ],
        [
            {"text": "on blue", "cls": "fg10 bg4"},
            {"text": "reset ", "cls": ""},
            {"text": "yellow", "cls": "fg3"},
            {"text": "\u241bZ<b>&amp;", "cls": ""},
        ],
    ]


# -- a real headless Chromium over the DevTools protocol ----------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(chromium_binary() is None, reason=NO_CHROMIUM)
async def test_page_in_headless_chromium(tmp_path: Path) -> None:
    binary = chromium_binary()
    assert binary is not None
    async with running_node(tmp_path, colour_config(tmp_path), token=TOKEN) as h:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        # a job id as long as a real one (a UUID) beside the short one
        await colour_dispatch(h, LONG_ID, auth, lines=1)
        await colour_dispatch(h, "ui-live", auth, lines=6, pause=0.2)
        async with chromium(binary, tmp_path) as cdp:
            url = f"{h.node.url}/fleet/ui?job=ui-live&token={TOKEN}"
            target = await cdp.call("Target.createTarget", url="about:blank")
            attached = await cdp.call(
                "Target.attachToTarget", targetId=target["targetId"], flatten=True
            )
            session = attached["sessionId"]
            await cdp.call(  # a 1280-pixel-wide window (issue 28 §9)
                "Emulation.setDeviceMetricsOverride",
                session,
                width=1280,
                height=800,
                deviceScaleFactor=1,
                mobile=False,
            )
            await cdp.call("Page.enable", session)
            await cdp.call("Page.navigate", session, url=url)
            state_js = "document.getElementById('final')?.dataset.state || ''"

            async def done() -> bool:
                try:  # the first evaluations may land on about:blank or mid-navigation
                    return bool(await cdp.evaluate(session, state_js) == "done")
                except RuntimeError:
                    return False

            await wait_until(done, timeout=30, interval=0.1, what="the page's final state done")
            text = await cdp.evaluate(session, "document.getElementById('log').textContent")
            for i in range(6):
                assert f"red {i} plain bold green {i} <b>&amp;\n" in text
            assert "\x1b" not in text and "\u241b" not in text
            assert "[done, exit code 0]" in text
            red = await cdp.evaluate(
                session,
                "[...document.querySelectorAll('#log span.fg1')].map(s => s.textContent).join('|')",
            )
            assert "red 0" in red and "plain" not in red
            bold_green = await cdp.evaluate(
                session,
                "[...document.querySelectorAll('#log span.b.fg2')]"
                ".map(s => getComputedStyle(s).fontWeight).join(',')",
            )
            assert bold_green and all(int(w) >= 600 for w in bold_green.split(","))
            # the escaped text was never parsed as HTML
            assert await cdp.evaluate(session, "document.querySelectorAll('#log b').length") == 0
            assert (
                await cdp.evaluate(session, "document.getElementById('final').dataset.exitCode")
                == "0"
            )
            # the job list came through the token as well
            listed = await cdp.evaluate(
                session,
                "new Promise(r => { const f = () => { const rows = [...document.querySelectorAll("
                "'#jobs tr')].map(t => t.dataset.job); rows.length ? r(rows) : setTimeout(f, 50) };"
                " f() })",
            )
            assert sorted(listed) == sorted(["ui-live", LONG_ID])
            # the job list fits its panel at 1280 px: no sideways scroll, every column shown
            fit = await cdp.evaluate(session, FIT_JS)
            assert fit["scroll"] <= fit["client"], fit
            assert fit["cells"] == 10 and fit["past"] == [], fit
            # the page names the node and each job's task type
            node_id = h.node.context.node_id
            heading = await cdp.evaluate(session, "document.getElementById('heading').textContent")
            assert heading == f"fleet-trio jobs · {node_id}"
            task = await cdp.evaluate(session, "document.querySelector('#jobs td.tt').textContent")
            assert task == "colour"
            assert node_id in await cdp.evaluate(session, "document.title")
