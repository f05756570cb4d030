"""A real headless Chromium driven over the Chrome DevTools protocol (no Playwright), for the
tests that open a page in a browser: :func:`chromium_binary` finds one on the PATH (None: the
test skips with ``NO_CHROMIUM``), :func:`chromium` runs it for one block and yields a
:class:`Cdp` client."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio
from trio_websocket import WebSocketConnection, open_websocket_url


def chromium_binary() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Cdp:
    """A minimal Chrome DevTools protocol client (flattened sessions) over trio-websocket."""

    def __init__(self, ws: WebSocketConnection) -> None:
        self.ws = ws
        self.ids = itertools.count(1)

    async def call(self, method: str, session: str | None = None, **params: Any) -> Any:
        msg_id = next(self.ids)
        msg: dict[str, Any] = {"id": msg_id, "method": method, "params": params}
        if session is not None:
            msg["sessionId"] = session
        await self.ws.send_message(json.dumps(msg))
        while True:  # events and other replies are skipped (one call at a time)
            reply = json.loads(await self.ws.get_message())
            if reply.get("id") == msg_id:
                if "error" in reply:
                    raise RuntimeError(f"CDP {method}: {reply['error']}")
                return reply.get("result", {})

    async def evaluate(self, session: str, expression: str) -> Any:
        result = await self.call(
            "Runtime.evaluate",
            session,
            expression=expression,
            returnByValue=True,
            awaitPromise=True,
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"page error: {result['exceptionDetails']}")
        return result["result"].get("value")


@asynccontextmanager
async def chromium(binary: str, tmp_path: Path) -> AsyncIterator[Cdp]:
    """Chromium headless; the DevTools websocket URL is read from its stderr."""
    profile = tmp_path / "chromium-profile"
    profile.mkdir()
    argv = [
        binary,
        "--headless=new",
        "--remote-debugging-port=0",
        f"--user-data-dir={profile}",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-gpu",
        "--disable-extensions",
        "about:blank",
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        argv.insert(1, "--no-sandbox")  # Chromium refuses to run as root with its sandbox
    proc = await trio.lowlevel.open_process(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    assert proc.stderr is not None
    stderr = proc.stderr
    try:
        async with trio.open_nursery() as nursery:
            seen = b""
            with trio.fail_after(30):
                while b"DevTools listening on " not in seen or not seen.endswith(b"\n"):
                    chunk = await stderr.receive_some(4096)
                    if not chunk:
                        raise RuntimeError(f"chromium exited: {seen.decode(errors='replace')}")
                    seen += chunk
            match = re.search(rb"DevTools listening on (ws://\S+)", seen)
            assert match, seen

            async def drain() -> None:  # a full stderr pipe would block Chromium
                while await stderr.receive_some(65536):
                    pass

            nursery.start_soon(drain)
            async with open_websocket_url(match.group(1).decode(), max_message_size=16 << 20) as ws:
                yield Cdp(ws)
            nursery.cancel_scope.cancel()
    finally:
        proc.terminate()
        with trio.move_on_after(10) as cs:
            cs.shield = True
            await proc.wait()
        if proc.returncode is None:
            proc.kill()


NO_CHROMIUM = (
    "no Chromium on this machine: none of chromium, chromium-browser, google-chrome is on the "
    "PATH, so the page is not run in a browser (its routes and ANSI parser are tested above)"
)
