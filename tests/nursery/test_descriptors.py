"""Descriptors (issue 25 item 4): clients that connect and close cannot make a server
unreachable, under a descriptor limit of 64 (a node started by hand from a shell).

Real processes, real sockets: ``fleet-trio node`` and ``fleet-trio worker`` (its tail listener)
with ``RLIMIT_NOFILE`` 64. 200 clients connect and close without a request, 100 of them open at
once so that ``accept`` fails with EMFILE. Then:

- every descriptor the clients took comes back promptly (before the header timeout could
  have closed them: the server saw each client's EOF);
- the server answers within a second of that (``ACCEPT_BACKOFF_MAX``), plus slack for a loaded
  machine;
- the episode costs at most 5 log lines, none of them a traceback.

Before the fix each such connection held its descriptor until the 120 s keep-alive timer, and
trio's accept loop logged a traceback every 100 ms.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import IO

import httpx
import pytest
import trio

from fleet_trio.gpu.fake import init_device
from fleet_trio.nursery.accept import ACCEPT_BACKOFF_MAX
from fleet_trio.nursery.httpserve import HEADER_TIMEOUT
from fleet_trio.sim import serve_controller
from fleet_trio.sim.controller import SimController
from fleet_trio.sim.fleet import free_port, wait_exit, worker_yaml
from tests.helpers import healthy, wait_until

LIMIT = 64
"""The descriptor limit of the server under test (``ulimit -n 64``)."""
HELD_AT_ONCE = 100
"""Clients open at the same time: more than the server's free descriptors (EMFILE)."""
CLIENTS = 200
SLACK = 1.0
"""Added to the answer bound (the accept loop's longest wait, 1 s) for a loaded machine."""
EPISODE_LINES = 5


def limit_descriptors(pid: int) -> None:
    """``prlimit --nofile=64`` on the running ``pid`` (soft and hard)."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (LIMIT, min(LIMIT, hard)))


def log_file(path: Path) -> IO[bytes]:
    """The file the process's stdout and stderr go to (its log)."""
    return path.open("wb")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def connect(port: int) -> trio.socket.SocketType | None:
    """A connected client socket (``None``: the server's accept queue was full for 2 s)."""
    sock = trio.socket.socket()
    with trio.move_on_after(2):
        await sock.connect(("127.0.0.1", port))
        return sock
    sock.close()
    return None


async def connect_and_close_flood(pid: int, port: int) -> None:
    """200 clients that connect and close without a request; the first 100 held open together
    until the server is out of descriptors."""
    held = []
    try:
        for _ in range(HELD_AT_ONCE):
            sock = await connect(port)
            if sock is not None:
                held.append(sock)
        await wait_until(
            lambda: open_fds(pid) >= LIMIT, what=f"the server at its {LIMIT} descriptors"
        )
    finally:
        for sock in held:
            sock.close()

    async def one() -> None:
        sock = await connect(port)
        if sock is not None:
            sock.close()

    for _ in range((CLIENTS - HELD_AT_ONCE) // 10):
        async with trio.open_nursery() as nursery:
            for _ in range(10):
                nursery.start_soon(one)


async def descriptors_back(pid: int, baseline: int) -> None:
    """The server's descriptors are back to ``baseline`` (plus a few), well before the header
    timeout could have closed the connections it had accepted."""
    await wait_until(
        lambda: open_fds(pid) <= baseline + 4,
        timeout=HEADER_TIMEOUT - 1.0,
        what=f"descriptors back to about {baseline} (EOF seen, connections closed)",
    )


def episode(log_path: Path, mark: int) -> list[str]:
    return log_path.read_text(errors="replace").splitlines()[mark:]


def check_episode(lines: list[str]) -> None:
    text = "\n".join(lines)
    assert "Traceback" not in text, text[:4000]
    assert len(lines) <= EPISODE_LINES, f"{len(lines)} log lines:\n" + "\n".join(lines[:40])


@pytest.mark.slow
async def test_node_answers_at_once_after_connect_and_close_clients(tmp_path: Path) -> None:
    gpu_dir = tmp_path / "gpu"
    init_device(str(gpu_dir))
    cfg = tmp_path / "node.yaml"
    cfg.write_text("tasks:\n  t:\n    command: [sh, -c, 'true']\n")
    port = free_port()
    argv = [
        sys.executable, "-m", "fleet_trio", "node", "-c", str(cfg), "--gpu", "fake",
        "--fake-gpu-dir", str(gpu_dir), "--listen", f"127.0.0.1:{port}",
        "--footprints", str(tmp_path / "fp.json"),
    ]  # fmt: skip
    log_path = tmp_path / "node.log"
    with trio.fail_after(120), log_file(log_path) as log:
        proc = await trio.lowlevel.open_process(
            argv, env=dict(os.environ), stdin=subprocess.DEVNULL, stdout=log, stderr=log
        )
        try:
            limit_descriptors(proc.pid)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                await wait_until(lambda: healthy(client), what="the node's health answering 200")
            baseline = open_fds(proc.pid)
            mark = len(log_path.read_text().splitlines())
            await connect_and_close_flood(proc.pid, port)
            await descriptors_back(proc.pid, baseline)
            with trio.fail_after(ACCEPT_BACKOFF_MAX + SLACK):
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                    assert (await client.get("/fleet/health")).status_code == 200
            check_episode(episode(log_path, mark))
            proc.terminate()
            code, _took = await wait_exit(proc, 30)
            assert code == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


@pytest.mark.slow
async def test_worker_tail_listener_answers_at_once_after_connect_and_close_clients(
    tmp_path: Path,
) -> None:
    ctrl = SimController(token="wtok", reaper_interval=0.05, startup_grace=0.0)
    tail_port = free_port()
    for sub in ("probe.d", "sheets", "verify.d"):
        (tmp_path / sub).mkdir()
    log_path = tmp_path / "worker.log"
    async with trio.open_nursery() as nursery:
        url: str = await nursery.start(serve_controller, ctrl)
        cfg = tmp_path / "worker.yaml"
        cfg.write_text(
            worker_yaml(
                controller_url=url,
                host="fdbox",
                devices=["gpu0"],
                state_dir=str(tmp_path),
                verify_dir=str(tmp_path / "verify.d"),
            )
            + f"tail_listen: 127.0.0.1:{tail_port}\n"
        )
        argv = [sys.executable, "-m", "fleet_trio", "worker", "-c", str(cfg)]
        base = f"http://127.0.0.1:{tail_port}"
        with trio.fail_after(120), log_file(log_path) as log:
            proc = await trio.lowlevel.open_process(
                argv, env=dict(os.environ), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            )  # fmt: skip
            try:
                limit_descriptors(proc.pid)
                await ctrl.wait_for(lambda: bool(ctrl.registrations()), timeout=30)

                async def listening() -> bool:
                    try:
                        async with httpx.AsyncClient(base_url=base) as client:
                            return (await client.get("/nope")).status_code == 404
                    except httpx.TransportError:
                        return False

                await wait_until(listening, interval=0.1, what="the tail listener answering")
                baseline = open_fds(proc.pid)
                mark = len(log_path.read_text().splitlines())
                await connect_and_close_flood(proc.pid, tail_port)
                await descriptors_back(proc.pid, baseline)
                with trio.fail_after(ACCEPT_BACKOFF_MAX + SLACK):
                    async with httpx.AsyncClient(base_url=base) as client:
                        assert (await client.get("/nope")).status_code == 404
                check_episode(episode(log_path, mark))
                proc.terminate()
                code, _took = await wait_exit(proc, 30)
                assert code == 0
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
        nursery.cancel_scope.cancel()
