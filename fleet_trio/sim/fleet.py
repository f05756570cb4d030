"""A small fleet on one box, as real processes: the launcher of the chaos scenarios.

(Over 500 lines: the process launcher and the fleet built on it share the readiness and exit
bookkeeping of real child processes.)

* :class:`NodeProcess` runs ``python -m fleet_trio node -c node.yaml --gpu fake`` on a fixed
  loopback port (kept across restarts), ready when it prints ``serving on``;
* :class:`WorkerProcess` runs ``python -m fleet_trio worker -c worker.yaml``, ready when the
  simulated controller has a new registration from its host;
* :func:`open_fleet` starts the simulated rc controller in-process, the workers behind one
  :class:`~fleet_trio.sim.faults.FaultyLink` each (worker → controller), the nodes behind one
  link each (dispatcher → node) and a :class:`~fleet_trio.sim.dispatcher.SimDispatcher`, and
  stops everything on exit.

Every start, kill, stop and exit is recorded as a :class:`ProcessEvent`; every graceful stop
as a :class:`ShutdownRecord` (how long it took against its documented bound).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Protocol

import attrs
import trio

from fleet_trio.nursery.tree import DEFAULT_INTERRUPT_BUDGET, JOBS_CLOSED_BUDGET, SHUTDOWN_SLACK
from fleet_trio.sim.controller import SimController, serve_controller
from fleet_trio.sim.dispatcher import SimDispatcher, serve_dispatcher
from fleet_trio.sim.faults import FaultyLink, serve_link
from fleet_trio.sim.zygote import Zygote, open_zygote
from fleet_trio.worker.worker import WorkerTimings
from fleet_trio.worker.worker import shutdown_bound as worker_shutdown_bound

ROLE_LAUNCHER = "fleet_trio.sim.roles"
"""Every process of the fleet runs ``python -m fleet_trio.sim.roles [...] -- node|worker ...``:
the production command line, through the sim's launcher, which can inject the test-only
defects (:attr:`ManagedProcess.defects`) and shrink the worker's shutdown timings."""

GPU_ROOT_ENV = "FLEET_TRIO_SIM_GPU_ROOT"
"""Set in every worker's environment: the folder holding one fake GPU folder per device,
named ``HOST_DEVICE`` (what a verify script looks at)."""

OUTPUT_CAP = 256 * 1024
READY_TIMEOUT = 30.0
SPAWN_TIMEOUT = 30.0
"""Seconds a fork of the zygote may take to be answered (its imports at the fleet's start)."""
KILL_WAIT = 10.0

NODE_DRAIN = 0.5
NODE_KILL_GRACE = 1.5
NODE_POLL_LINGER = 5.0
"""The node's default ``poll_linger`` (docs/node.md "Linger")."""


def node_stop_bound(drain: float, kill_grace: float, linger: float) -> float:
    """docs/node.md "Stopping": drain + 5 s interrupt budget + kill grace + 3 s slack + 1.5 s for
    the live tails' end + the poll linger."""
    slack = SHUTDOWN_SLACK + JOBS_CLOSED_BUDGET
    return drain + DEFAULT_INTERRUPT_BUDGET + kill_grace + slack + linger


NODE_STOP_BOUND = node_stop_bound(NODE_DRAIN, NODE_KILL_GRACE, NODE_POLL_LINGER)

WORKER_STOP_BOUND = worker_shutdown_bound(WorkerTimings())
"""docs/worker.md "Stopping" for the production timings."""


@attrs.frozen
class ProcessEvent:
    at: float
    """``trio.current_time()``."""
    process: str
    kind: str
    """``start`` | ``ready`` | ``kill`` (a signal sent for a crash) | ``term`` (a graceful
    stop begins) | ``exit`` | ``restart`` (controller)."""
    detail: str = ""


@attrs.frozen
class ShutdownRecord:
    process: str
    seconds: float
    bound: float
    exit_code: int | None
    """``None``: it did not exit within ``bound`` (and was then killed)."""


EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
FREE_PORT_FLOOR = 10000
"""The lowest port :func:`free_port` picks from."""


def free_port() -> int:
    """A loopback port nobody listens on right now, for a process started next to listen on.

    Picked at random *outside* the kernel's ephemeral range (``ip_local_port_range``), from
    :data:`FREE_PORT_FLOOR` up to it and above it: the kernel never hands out such a port by
    itself (a ``bind`` to port 0 elsewhere, every outgoing connection), so it stays free until
    the process binds it, unless another caller picks the same one (about one chance in
    20,000 per pair). A port from the kernel's own pick, as this used to be, could be handed
    to the next server that binds port 0 in the meantime (a test's simulated controller took
    a worker's tail port that way). Only when the range leaves no room is it the kernel's pick.
    """
    try:
        with open(EPHEMERAL_RANGE) as f:
            low, high = (int(x) for x in f.read().split()[:2])
    except (OSError, ValueError):
        low = high = 0
    spans = [(FREE_PORT_FLOOR, low - 1), (max(high + 1, FREE_PORT_FLOOR), 65535)]
    ports = [p for first, last in spans if low and high >= low for p in range(first, last + 1)]
    if ports:
        pick = random.SystemRandom()
        for _ in range(64):
            port = pick.choice(ports)
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        chosen: int = s.getsockname()[1]
        return chosen


FileSpec = tuple[str, str, int]
"""``(path, text, mode)``: a file with that text and mode; mode 0 makes the folder ``path``."""


def _write_files(files: Sequence[FileSpec]) -> None:
    """Create the fleet's folders and files (blocking: run in a thread)."""
    for path, text, mode in files:
        if mode == 0:
            os.makedirs(path, exist_ok=True)
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, mode)


class RoleProcess(Protocol):
    """What the scenarios use of a role's process (a ``trio.Process``, or a zygote's child)."""

    @property
    def pid(self) -> int: ...
    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...
    def send_signal(self, sig: int) -> None: ...
    def kill(self) -> None: ...


async def wait_exit(proc: RoleProcess, limit: float) -> tuple[int | None, float]:
    """Wait up to ``limit`` seconds for ``proc`` to exit: its exit code (``None``: it was still
    running, and is SIGKILLed and reaped) and the seconds it took."""
    began = trio.current_time()
    code: int | None = None
    with trio.move_on_after(limit):
        code = await proc.wait()
    took = trio.current_time() - began
    if code is None:
        proc.kill()
        with trio.move_on_after(KILL_WAIT, shield=True):
            await proc.wait()
    return code, took


def _open_fifo(path: str) -> tuple[int, int]:
    """``(read end, guard)`` of the FIFO ``path``: the read end first (so opening a write end
    does not block), then a write end held until the process has exited, so that the reader
    sees no EOF before the process has opened the FIFO itself."""
    read_end = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        guard = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    except BaseException:
        os.close(read_end)
        raise
    return read_end, guard


class ManagedProcess:
    """One fleet-trio process that can be started, crashed, stopped and restarted."""

    stop_bound = 30.0

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        nursery: trio.Nursery,
        events: list[ProcessEvent],
        shutdowns: list[ShutdownRecord],
    ) -> None:
        self.name = name
        self.zygote: Zygote | None = None
        """Start as a fork of this zygote (the role code already imported: about a second of
        CPU less per start), else as a fresh interpreter. A fork's stderr comes through a FIFO
        made under ``fifo_dir``."""
        self.fifo_dir = ""
        self.starts = 0
        self.role_argv = list(argv)
        """The ``fleet-trio`` command line (after the launcher's ``--``)."""
        self.defects: list[str] = []
        """Test-only defects the next start injects (``skip-interrupted``, ``skip-sweep``)."""
        self.launcher_args: list[str] = []
        """More options for the sim's role launcher (e.g. ``--worker-drain 2``)."""
        self.env = dict(env)
        self.nursery = nursery
        self.events = events
        self.shutdowns = shutdowns
        self.proc: RoleProcess | None = None
        self.output = bytearray()
        self._seen: trio.Event = trio.Event()

    @property
    def argv(self) -> list[str]:
        return [sys.executable, "-m", ROLE_LAUNCHER, *self.launcher_argv]

    @property
    def launcher_argv(self) -> list[str]:
        """The role launcher's arguments (after ``python -m fleet_trio.sim.roles``)."""
        defects = [arg for d in self.defects for arg in ("--defect", d)]
        return [*defects, *self.launcher_args, "--", *self.role_argv]

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    def _event(self, kind: str, detail: str = "") -> None:
        self.events.append(ProcessEvent(trio.current_time(), self.name, kind, detail))

    async def _pump(self, stderr: trio.abc.ReceiveStream) -> None:
        async with stderr:
            async for chunk in stderr:
                self.output += chunk
                if len(self.output) > OUTPUT_CAP:
                    del self.output[: len(self.output) - OUTPUT_CAP]
                self._seen.set()
                self._seen = trio.Event()

    async def _ready(self) -> None:
        raise NotImplementedError

    async def start(self) -> None:
        """Spawn and wait until ready (``READY_TIMEOUT``)."""
        if self.running:
            raise RuntimeError(f"{self.name} is already running")
        self.output.clear()
        self._before_start()
        self.starts += 1
        stderr: trio.abc.ReceiveStream
        guard: int | None = None
        fifo = ""
        if self.zygote is None:
            proc = await trio.lowlevel.open_process(
                self.argv,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
            assert proc.stderr is not None
            self.proc, stderr = proc, proc.stderr
        else:
            fifo = await trio.to_thread.run_sync(self._make_fifo)
            read_end, guard = _open_fifo(fifo)
            stderr = trio.lowlevel.FdStream(read_end)
            try:
                # shielded and bounded: once asked, the zygote forks; a start cancelled meanwhile
                # must still learn the pid, or the child (blocked opening the FIFO, whose ends
                # are closed) is left running for good
                with trio.CancelScope(shield=True), trio.fail_after(SPAWN_TIMEOUT):
                    self.proc = await self.zygote.spawn(self.launcher_argv, fifo, self.env)
            except BaseException:
                os.close(guard)
                await stderr.aclose()
                raise
        assert self.proc is not None
        self._event("start", str(self.proc.pid))
        self.nursery.start_soon(self._pump, stderr, name=f"{self.name} stderr")
        self.nursery.start_soon(self._reap, self.proc, guard, fifo, name=f"{self.name} reap")
        try:
            with trio.fail_after(READY_TIMEOUT):
                await self._ready()
        except trio.TooSlowError:
            raise RuntimeError(f"{self.name} did not become ready:\n{self.tail()}") from None
        self._event("ready")

    def _before_start(self) -> None:
        return

    def _make_fifo(self) -> str:
        """A fresh FIFO for this start's stderr, under the fleet's ``fifo_dir``."""
        folder = os.path.join(self.fifo_dir, "stderr")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"{self.name}.{self.starts}")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.mkfifo(path, 0o600)
        return path

    async def _reap(self, proc: RoleProcess, guard: int | None = None, fifo: str = "") -> None:
        try:
            code = await proc.wait()
        finally:
            if guard is not None:
                os.close(guard)  # the pump's EOF comes once the process's own ends are closed
            if fifo:
                with contextlib.suppress(OSError):
                    os.unlink(fifo)
        self._event("exit", str(code))
        self._seen.set()
        self._seen = trio.Event()

    def tail(self, n: int = 4000) -> str:
        return self.output[-n:].decode(errors="replace")

    async def kill(self, sig: signal.Signals = signal.SIGKILL) -> None:
        """Send ``sig`` (a crash: nothing is timed) and wait for the exit."""
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        self._event("kill", sig.name)
        proc.send_signal(sig)
        await wait_exit(proc, KILL_WAIT)  # past it, SIGKILL

    async def stop(self, bound: float | None = None) -> ShutdownRecord | None:
        """SIGTERM and time the exit against ``bound`` (default: the documented bound);
        past it, SIGKILL. ``None`` when it was not running."""
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return None
        limit = self.stop_bound if bound is None else bound
        self._event("term")
        proc.send_signal(signal.SIGTERM)
        code, seconds = await wait_exit(proc, limit)
        record = ShutdownRecord(self.name, seconds, limit, code)
        self.shutdowns.append(record)
        return record


class NodeProcess(ManagedProcess):
    stop_bound = NODE_STOP_BOUND

    def __init__(
        self,
        name: str,
        *,
        config: str,
        gpu_dir: str,
        port: int,
        env: Mapping[str, str],
        nursery: trio.Nursery,
        events: list[ProcessEvent],
        shutdowns: list[ShutdownRecord],
        journal: str | None = None,
    ) -> None:
        argv = [
            "node",
            "-c",
            config,
            "--gpu",
            "fake",
            "--fake-gpu-dir",
            gpu_dir,
            "--listen",
            f"127.0.0.1:{port}",
            "--node-id",
            name,
        ]
        if journal is not None:  # the job journal, kept across restarts (docs/node.md)
            argv += ["--journal", journal]
        super().__init__(name, argv, env=env, nursery=nursery, events=events, shutdowns=shutdowns)
        self.port = port
        self.gpu_dir = gpu_dir
        self.url = f"http://127.0.0.1:{port}"

    async def _ready(self) -> None:
        while b"serving on" not in self.output:
            if not self.running:
                raise RuntimeError(f"{self.name} exited at start:\n{self.tail()}")
            await self._seen.wait()


class WorkerProcess(ManagedProcess):
    stop_bound = WORKER_STOP_BOUND

    def __init__(
        self,
        name: str,
        *,
        config: str,
        host: str,
        devices: Sequence[str],
        ctrl: SimController,
        env: Mapping[str, str],
        nursery: trio.Nursery,
        events: list[ProcessEvent],
        shutdowns: list[ShutdownRecord],
    ) -> None:
        argv = ["worker", "-c", config]
        super().__init__(name, argv, env=env, nursery=nursery, events=events, shutdowns=shutdowns)
        self.host = host
        self.devices = list(devices)
        self.ctrl = ctrl
        self._registered_before = 0

    def _registrations(self) -> int:
        return sum(
            1
            for r in self.ctrl.registrations()
            if isinstance(r, dict) and r.get("host") == self.host
        )

    def _before_start(self) -> None:
        self._registered_before = self._registrations()

    async def _ready(self) -> None:
        async def watch_exit() -> None:
            assert self.proc is not None
            await self.proc.wait()
            raise RuntimeError(f"{self.name} exited at start:\n{self.tail()}")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_exit)
            await self.ctrl.wait_for(
                lambda: self._registrations() > self._registered_before, timeout=READY_TIMEOUT
            )
            nursery.cancel_scope.cancel()


@attrs.define(eq=False)
class Fleet:
    root: str
    ctrl: SimController
    dispatcher: SimDispatcher
    nodes: list[NodeProcess]
    workers: list[WorkerProcess]
    node_links: dict[str, FaultyLink]
    """node name → the dispatcher → node link."""
    worker_links: dict[str, FaultyLink]
    """worker name → the worker → controller link."""
    events: list[ProcessEvent]
    shutdowns: list[ShutdownRecord]
    gpu_dirs: dict[str, str]
    """Fake GPU folder per node name and per worker device id (``host:gpuN``)."""

    def node(self, name: str) -> NodeProcess:
        return next(n for n in self.nodes if n.name == name)

    def worker(self, name: str) -> WorkerProcess:
        return next(w for w in self.workers if w.name == name)

    async def wait_healthy(self) -> None:
        """Until the dispatcher's latest health probe of every node succeeded (at most
        ``READY_TIMEOUT``)."""
        urls = [self.node_links[n.name].url for n in self.nodes]
        await self.dispatcher.wait_for(
            lambda: all(self.dispatcher.healthy(u) for u in urls), timeout=READY_TIMEOUT
        )

    def restart_controller(self, *, down_for: float = 0.0) -> str:
        new = self.ctrl.restart(down_for=down_for)
        self.events.append(ProcessEvent(trio.current_time(), "controller", "restart", new))
        return new


def _fake_gpu(path: str, name: str) -> FileSpec:
    return (os.path.join(path, "device.json"), json.dumps({"name": name, "total_gib": 80}), 0o644)


def worker_yaml(
    *, controller_url: str, host: str, devices: Sequence[str], state_dir: str, verify_dir: str
) -> str:
    """A worker.yaml for the fleet: short heartbeats and polls, no probes, no sheets."""
    lines = [
        f"controller_url: {json.dumps(controller_url)}",
        "token: wtok",
        f"host: {json.dumps(host)}",
        "devices:",
        *[f"  - {json.dumps(d)}" for d in devices],
        "heartbeat_interval: 500ms",
        "poll_wait: 2s",
        f"probe_dir: {json.dumps(os.path.join(state_dir, 'probe.d'))}",
        "probe_interval: 5m",
        f"verify_dir: {json.dumps(verify_dir)}",
        "verify_timeout: 5s",
        f"sheet_dir: {json.dumps(os.path.join(state_dir, 'sheets'))}",
    ]
    return "\n".join(lines) + "\n"


@asynccontextmanager
async def open_fleet(
    root: str,
    *,
    node_yaml: str,
    nodes: int = 2,
    workers: int = 2,
    devices: int = 2,
    verify_scripts: Mapping[str, str] | None = None,
    defects: Sequence[str] = (),
    worker_launcher_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    controller: SimController | None = None,
    on_ready: Callable[[Fleet], Awaitable[None]] | None = None,
    fork: bool = True,
) -> AsyncIterator[Fleet]:
    """Start the whole fleet under ``root`` (an empty folder) and stop it on exit.

    ``node_yaml`` is written as every node's config (``$FLEET_TRIO_SIM_NODE_DIR`` in a task's
    command is that node's own folder). ``verify_scripts`` (name → text) become every
    worker's ``verify_dir``. ``defects`` (test-only, ``fleet_trio.sim.roles``) are injected
    into every node and worker they apply to; ``worker_launcher_args`` go to every worker's
    launcher (e.g. shorter shutdown timings). On exit every process is stopped gracefully (its
    shutdown recorded), the dispatcher, links and controller are cancelled. ``fork``: start the
    nodes and workers (and every restart) as forks of one :mod:`~fleet_trio.sim.zygote`, which
    imports the role code once, instead of fresh interpreters (about a second of CPU each).
    """
    ctrl = controller or SimController(
        token="wtok",
        reaper_interval=0.2,
        heartbeat_timeout=3.0,
        worker_lost_after=6.0,
        startup_grace=0.0,
        kill_redelivery=1.0,
    )
    gpu_root = os.path.join(root, "gpu")
    base_env = {**os.environ, **(env or {}), GPU_ROOT_ENV: gpu_root}
    files: list[FileSpec] = [(gpu_root, "", 0)]
    events: list[ProcessEvent] = []
    shutdowns: list[ShutdownRecord] = []
    gpu_dirs: dict[str, str] = {}
    verify_dir = os.path.join(root, "verify.d")
    files.append((verify_dir, "", 0))
    for name, text in (verify_scripts or {}).items():
        files.append((os.path.join(verify_dir, name), text, 0o755))

    async with contextlib.AsyncExitStack() as stack:
        zygote = await stack.enter_async_context(open_zygote()) if fork else None
        nursery = await stack.enter_async_context(trio.open_nursery())
        ctrl_url: str = await nursery.start(serve_controller, ctrl)
        host, port = ctrl_url.rsplit("//", 1)[1].rsplit(":", 1)
        node_procs: list[NodeProcess] = []
        node_links: dict[str, FaultyLink] = {}
        for i in range(1, nodes + 1):
            name = f"node{i}"
            ndir = os.path.join(root, name)
            cfg = os.path.join(ndir, "node.yaml")
            files.append((cfg, node_yaml, 0o644))
            gdir = os.path.join(gpu_root, name)
            files.append(_fake_gpu(gdir, f"Fake GPU of {name}"))
            gpu_dirs[name] = gdir
            nport = free_port()
            link = FaultyLink("127.0.0.1", nport, name=f"dispatcher->{name}")
            await nursery.start(serve_link, link)
            node_links[name] = link
            node_env = dict(base_env, FLEET_TRIO_SIM_NODE_DIR=ndir)
            node_procs.append(
                NodeProcess(
                    name,
                    config=cfg,
                    gpu_dir=gdir,
                    port=nport,
                    env=node_env,
                    nursery=nursery,
                    events=events,
                    shutdowns=shutdowns,
                    journal=os.path.join(ndir, "journal.sqlite"),
                )
            )
        worker_procs: list[WorkerProcess] = []
        worker_links: dict[str, FaultyLink] = {}
        for i in range(1, workers + 1):
            name = f"worker{i}"
            whost = f"chaos-w{i}"
            wdir = os.path.join(root, name)
            for sub in ("probe.d", "sheets"):
                files.append((os.path.join(wdir, sub), "", 0))
            link = FaultyLink(host, int(port), name=f"{name}->controller")
            await nursery.start(serve_link, link)
            worker_links[name] = link
            devs = [f"gpu{d}" for d in range(devices)]
            for d in devs:
                gdir = os.path.join(gpu_root, f"{whost}_{d}")
                files.append(_fake_gpu(gdir, f"Fake GPU {whost}:{d}"))
                gpu_dirs[f"{whost}:{d}"] = gdir
            cfg = os.path.join(wdir, "worker.yaml")
            text = worker_yaml(
                controller_url=link.url,
                host=whost,
                devices=devs,
                state_dir=wdir,
                verify_dir=verify_dir,
            )
            files.append((cfg, text, 0o644))
            # present and empty (no probes, no sheets): a configured directory that does not
            # exist is a WARNING at the worker's start
            files += [(os.path.join(wdir, sub), "", 0) for sub in ("probe.d", "sheets")]
            worker_procs.append(
                WorkerProcess(
                    name,
                    config=cfg,
                    host=whost,
                    devices=devs,
                    ctrl=ctrl,
                    env=base_env,
                    nursery=nursery,
                    events=events,
                    shutdowns=shutdowns,
                )
            )
        dispatcher = SimDispatcher(
            [node_links[n.name].url for n in node_procs],
            health_interval=0.25,
            poll_interval=0.1,
            request_timeout=2.0,
            lost_after=1.0,
            terminal_confirmations=3,
        )
        fleet = Fleet(
            root=root,
            ctrl=ctrl,
            dispatcher=dispatcher,
            nodes=node_procs,
            workers=worker_procs,
            node_links=node_links,
            worker_links=worker_links,
            events=events,
            shutdowns=shutdowns,
            gpu_dirs=gpu_dirs,
        )
        from fleet_trio.sim.roles import NODE_DEFECTS, WORKER_DEFECTS

        for n in node_procs:
            n.defects = [d for d in defects if d in NODE_DEFECTS]
        for w in worker_procs:
            w.defects = [d for d in defects if d in WORKER_DEFECTS]
            w.launcher_args = list(worker_launcher_args)
        for p in [*node_procs, *worker_procs]:
            p.zygote, p.fifo_dir = zygote, root
        await trio.to_thread.run_sync(_write_files, files)
        try:
            async with trio.open_nursery() as starting:
                for p in [*node_procs, *worker_procs]:
                    starting.start_soon(p.start)
            await nursery.start(serve_dispatcher, dispatcher)
            if on_ready is not None:
                await on_ready(fleet)
            yield fleet
        finally:
            with trio.CancelScope(shield=True):
                async with trio.open_nursery() as stopping:
                    for p in [*node_procs, *worker_procs]:
                        stopping.start_soon(p.stop)
            nursery.cancel_scope.cancel()


__all__ = [
    "GPU_ROOT_ENV",
    "NODE_STOP_BOUND",
    "ROLE_LAUNCHER",
    "WORKER_STOP_BOUND",
    "Fleet",
    "ManagedProcess",
    "NodeProcess",
    "ProcessEvent",
    "ShutdownRecord",
    "WorkerProcess",
    "free_port",
    "open_fleet",
    "worker_yaml",
]
