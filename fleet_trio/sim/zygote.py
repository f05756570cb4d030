"""A fork server for the sim's short-lived role processes (the shutdown-bound scenario).

Starting a node or a worker costs about a second of CPU, nearly all of it imports. The zygote
(``python -m fleet_trio.sim.zygote``) imports the role code once, then forks one child per
request: each child is a real, separate process (own pid, own session, real signals, real
exit), running the sim's role launcher (:func:`fleet_trio.sim.roles.main`) with the given
arguments, the same code a fresh ``python -m fleet_trio.sim.roles`` runs.

Protocol, one JSON object per line: requests on the zygote's stdin
``{"id": N, "argv": [...], "log": PATH}`` (and ``"env": {...}``, the child's whole
environment, when given); answers on its stdout ``{"id": N, "pid": PID}``
(or ``{"id": N, "error": TEXT}``) and, when a child ends, ``{"exit": PID, "code": CODE}``
(the code as :func:`os.waitstatus_to_exitcode` gives it). The zygote exits when its stdin
closes, once every child still running has been stopped (:func:`stop_children`: a scenario
killed mid-run must not leave its nodes running for good). It is not threaded and runs no
event loop, so forking it is safe.

:class:`Zygote` is the trio side; :class:`ForkedProcess` quacks like the parts of
``trio.Process`` the scenario uses (``pid``, ``returncode``, ``wait``, ``send_signal``,
``kill``).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import trio


def _child(argv: list[str], log_path: str, env: dict[str, str] | None) -> None:
    """In the forked child: a new session, stdio redirected, ``env`` (when given) as the
    whole environment, the role launcher. Never returns."""
    code = 1
    try:
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
            tempfile.tempdir = None  # read again from this environment's TMPDIR
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        from fleet_trio.sim.roles import main

        code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stderr.flush()
        finally:
            os._exit(code)


CHILDREN_STOP_WAIT = 60.0
"""Seconds the children still running when the zygote's stdin closes get to exit after
SIGTERM (a node's or a worker's documented stop bound, with room) before SIGKILL."""


def stop_children(children: set[int], wait: float = CHILDREN_STOP_WAIT) -> dict[int, int]:
    """SIGTERM every child in ``children``, reap each (SIGKILL for one still running after
    ``wait`` seconds); their exit codes by pid. ``children`` ends empty.

    For the zygote's stdin closing while children still run: the scenario that asked for
    them is gone (killed mid-run) or did not wait for them. Left alone they would run for good,
    with their jobs: a node drains on SIGTERM and sweeps its jobs' processes, a worker too.
    The pids are this process's unreaped children, so none of them can name another process.
    """
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    codes: dict[int, int] = {}
    deadline = time.monotonic() + wait
    while True:
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                children.discard(pid)
                codes[pid] = os.waitstatus_to_exitcode(status)
        if not children or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    for pid in list(children):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        children.discard(pid)
        codes[pid] = os.waitstatus_to_exitcode(status)
    return codes


def serve() -> int:
    """The zygote's loop (blocking): fork on request, report every child's exit."""
    import fleet_trio.cli
    import fleet_trio.node.server
    import fleet_trio.sim.roles
    import fleet_trio.worker.worker  # noqa: F401

    children: set[int] = set()
    buf = b""
    stdin = sys.stdin.fileno()

    def say(obj: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    while True:
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                children.discard(pid)
                say({"exit": pid, "code": os.waitstatus_to_exitcode(status)})
        ready, _, _ = select.select([stdin], [], [], 0.02)
        if not ready:
            continue
        chunk = os.read(stdin, 65536)
        if not chunk:
            for pid, code in stop_children(children).items():
                with contextlib.suppress(OSError):  # nobody may be reading any more
                    say({"exit": pid, "code": code})
            return 0
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            req = json.loads(line)
            try:
                pid = os.fork()
            except OSError as exc:
                say({"id": req["id"], "error": str(exc)})
                continue
            if pid == 0:
                _child(list(req["argv"]), str(req["log"]), req.get("env"))
            children.add(pid)
            say({"id": req["id"], "pid": pid})


LOST_EXIT_CODE = 255
"""The exit code given to a child that ended after its zygote did (no one is left to tell)."""


class ForkedProcess:
    """A child of the zygote, seen from the scenario.

    It is held through a pidfd from the moment its pid is known (while it runs, or as a zombie
    the zygote has not reaped yet): signals go through it, so a signal sent after the child
    has exited, before its exit message arrives, reaches no other process that took its pid.
    """

    def __init__(self, pid: int, *, exited: bool = False) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._exited = trio.Event()
        self._pidfd: int | None = None
        if not exited:
            with contextlib.suppress(OSError):  # gone already, or no pidfds: os.kill then
                self._pidfd = os.pidfd_open(pid)

    async def _outlive_zygote(self) -> None:
        """The zygote is gone: the child's end is seen through its pidfd (its exit code is
        not known any more: :data:`LOST_EXIT_CODE`)."""
        if self.returncode is not None:
            return
        fd = self._pidfd
        if fd is None:
            try:
                fd = self._pidfd = os.pidfd_open(self.pid)
            except OSError:  # gone already
                self._exit(LOST_EXIT_CODE)
                return
        try:
            await trio.lowlevel.wait_readable(fd)
        except BaseException:  # the scenario is closing: the fd goes (signals by pid again)
            self._close_pidfd()
            raise
        self._exit(LOST_EXIT_CODE)

    def _close_pidfd(self) -> None:
        fd, self._pidfd = self._pidfd, None
        if fd is not None:
            trio.lowlevel.notify_closing(fd)
            os.close(fd)

    def _exit(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
        self._close_pidfd()
        self._exited.set()

    async def wait(self) -> int:
        await self._exited.wait()
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            if self._pidfd is not None:
                signal.pidfd_send_signal(self._pidfd, sig)
            else:
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    def __init__(self, proc: trio.Process) -> None:
        self._proc = proc
        self._next = 0
        self._pending: dict[int, tuple[trio.Event, list[Any]]] = {}
        self._children: dict[int, ForkedProcess] = {}
        self._early: dict[int, int] = {}
        self._lock = trio.Lock()
        self.gone = False
        """The zygote has exited: no more spawns."""

    async def _read(self, nursery: trio.Nursery) -> None:
        """The zygote's answers, until it exits; then pending spawns fail and the children
        still running are watched through pidfds (a zygote killed by a terminal's Ctrl-C, or
        by anyone, must not leave ``wait()`` hanging)."""
        try:
            await self._answers()
        finally:
            self.gone = True
            for event, box in self._pending.values():
                box.append({"error": "the zygote has exited"})
                event.set()
            self._pending.clear()
            for child in self._children.values():
                nursery.start_soon(child._outlive_zygote)

    async def _answers(self) -> None:
        assert self._proc.stdout is not None
        buf = b""
        async for chunk in self._proc.stdout:
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                msg = json.loads(line)
                if "exit" in msg:
                    child = self._children.get(msg["exit"])
                    if child is None:
                        self._early[msg["exit"]] = msg["code"]
                    else:
                        child._exit(msg["code"])
                else:
                    event, box = self._pending.pop(msg["id"])
                    box.append(msg)
                    event.set()

    async def spawn(
        self, argv: list[str], log_path: str, env: Mapping[str, str] | None = None
    ) -> ForkedProcess:
        """Fork a child running ``python -m fleet_trio.sim.roles ARGV`` (stderr to
        ``log_path``, opened for writing: a file, or a FIFO someone reads), with ``env`` as
        its whole environment (default: the zygote's)."""
        assert self._proc.stdin is not None
        if self.gone:
            raise OSError("the zygote could not fork: it has exited")
        self._next += 1
        ident = self._next
        event: trio.Event = trio.Event()
        box: list[Any] = []
        self._pending[ident] = (event, box)
        request: dict[str, Any] = {"id": ident, "argv": argv, "log": log_path}
        if env is not None:
            request["env"] = dict(env)
        line = json.dumps(request) + "\n"
        async with self._lock:
            await self._proc.stdin.send_all(line.encode())
        await event.wait()
        msg = box[0]
        if "error" in msg:
            raise OSError(f"the zygote could not fork: {msg['error']}")
        pid = int(msg["pid"])
        early = self._early.pop(pid, None)  # it ended (and was reaped) before we knew it
        child = ForkedProcess(pid, exited=early is not None)
        self._children[pid] = child
        if early is not None:
            child._exit(early)
        return child


@asynccontextmanager
async def open_zygote() -> AsyncIterator[Zygote]:
    """Start a zygote; closing its stdin on exit ends it."""
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "fleet_trio.sim.zygote"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,  # a terminal's Ctrl-C is for the scenario, not for the zygote
    )
    zygote = Zygote(proc)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(zygote._read, nursery)
            try:
                yield zygote
            finally:
                assert proc.stdin is not None
                with trio.CancelScope(shield=True), trio.move_on_after(5):
                    await proc.stdin.aclose()
                    await proc.wait()
                nursery.cancel_scope.cancel()
    finally:
        if proc.returncode is None:
            proc.kill()
            with trio.CancelScope(shield=True):
                await proc.wait()


__all__ = ["ForkedProcess", "Zygote", "open_zygote", "serve", "stop_children"]


if __name__ == "__main__":
    sys.exit(serve())
