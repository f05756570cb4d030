"""The one home of shared test helpers.

* :func:`wait_until` — the one wait-for-a-condition helper: tests wait on the fact itself (a
  state, a file, a log line, a process gone), never on a bare settle sleep.
* :func:`quiet_for` — the one bounded "prove that nothing happened" wait against real
  processes (under the autojump clock no such wait is needed: virtual time proves it).
* :func:`elapse` — virtual time passing, under the autojump clock only.
* :func:`run_sh` runs a shell job to its end; :func:`sh_script` writes a shell script;
  :func:`new_dir` makes an empty directory.
* :func:`scenario_pause` — a pause that is part of the scenario under test (a fake's latency,
  a job that must still be running), named so that it is not mistaken for a settle sleep.
* Watching a job's output for ``child:<pid>`` (:class:`PidWatcher`), stopping a job (or
  cancelling its scope) on it or after a while, checking a pid is gone (:func:`gone_within`).
* A node context with nothing in it (:func:`bare_node_context`); a dispatch sent with a given
  ``Content-Type`` (:func:`dispatch_as`); an HTTP head read off a raw stream
  (:func:`read_head`); ``fleet-trio tail`` run as a command (:func:`run_tail_cli`), and a
  task printing numbered lines for it to follow (``LINES_SCRIPT``).
* A ``serve_*`` service run for one block: :func:`serving`; a GPU source to subclass in
  sampler tests: :class:`StubGpuSource`.
* ``fleet-trio`` run as a process that must stop cleanly on SIGTERM: :func:`fleet_trio_process`;
  ``fleet-trio ARGS`` run to its end, output captured: :func:`fleet` (``CLI`` is its argv).
* The controller client against the sim: :func:`controller` (``REG``, ``CLIENT_FAST``, the
  ``AUTH`` header), :func:`with_running_job`; ``GPUBOX``, a two-device worker config.
* The worker against the simulated controller: :func:`sim`, :func:`config`, :func:`running`,
  :func:`until_terminal`, :func:`started`, :func:`succeeded`, and the shrunk timings ``FAST`` /
  ``FAST_CLIENT``.
"""

from __future__ import annotations

import inspect
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import attrs
import httpx
import trio
import trio.testing
from hypothesis import strategies
from trio_websocket import ConnectionClosed, open_websocket_url

from fleet_trio.logbus.bus import End, Output
from fleet_trio.logbus.tail import TailEvent
from fleet_trio.logbus.tail import loads as tail_loads
from fleet_trio.node.app import NodeContext
from fleet_trio.node.jobs import JobStore
from fleet_trio.node.tasks import TaskRegistry, TaskRunner
from fleet_trio.proc import BufferSink, JobSpec, Result, StopToken
from fleet_trio.proc.procfs import Predicate, ProcStat, job_env_id, pid_alive
from fleet_trio.proc.run import run
from fleet_trio.sim import SimController, serve_controller
from fleet_trio.sim.harness import TEST_CLIENT_TIMINGS, TEST_WORKER_TIMINGS
from fleet_trio.sim.relay import RelaySession, operator
from fleet_trio.worker.client import (
    Assignment,
    ControllerClient,
    DeviceDecl,
    Registration,
    Timings,
)
from fleet_trio.worker.config import DeviceConfig, WorkerConfig, config_from_mapping
from fleet_trio.worker.worker import Worker, WorkerTimings, serve_worker

T = TypeVar("T")

PY = sys.executable
HOST = "gpubox"

WAIT_TIMEOUT = 30.0
"""Default bound of :func:`wait_until`: long enough for a loaded 2-core machine; a fact that
never comes fails the test after it, with what was awaited in the message."""
WAIT_INTERVAL = 0.01


def _describe(predicate: object, what: str | None) -> str:
    if what:
        return what
    name = getattr(predicate, "__qualname__", None) or repr(predicate)
    if name.endswith("<lambda>"):
        code = getattr(predicate, "__code__", None)
        if code is not None:
            return f"a lambda at {code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno}"
    return str(name)


async def wait_until(
    predicate: Callable[[], T | Awaitable[T]],
    *,
    timeout: float = WAIT_TIMEOUT,  # noqa: ASYNC109 - the bound is the helper's contract
    interval: float = WAIT_INTERVAL,
    what: str | None = None,
) -> T:
    """Poll ``predicate`` (sync or async) every ``interval`` until it returns something truthy;
    return that value. Fails with ``AssertionError`` naming what was awaited (``what``, else
    the predicate) and the last value seen once ``timeout`` (trio time) has passed.

    Under the autojump clock the polls and the timeout are virtual: there, wait only on facts
    that trio tasks produce (a real process may not act before the virtual timeout passes).
    """
    last: object = None
    with trio.move_on_after(timeout):
        while True:
            value = predicate()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return value  # type: ignore[return-value]
            last = value
            await trio.sleep(interval)
    raise AssertionError(
        f"timed out after {timeout:g} s waiting for {_describe(predicate, what)}"
        f" (last value: {last!r})"
    )


async def quiet_for(seconds: float, *, reason: str) -> None:
    """A bounded wait that proves (by nothing happening) what ``reason`` says, against real
    processes where no event marks "nothing happened". Assert the quiet fact right after it.
    Under the autojump clock, use :func:`elapse` instead: virtual time costs nothing."""
    assert reason, "say what the quiet wait proves"
    await trio.sleep(seconds)


async def elapse(seconds: float) -> None:
    """Let ``seconds`` of *virtual* time pass: only under the autojump clock, where a job's
    fake duration costs nothing and "nothing happened within T" is proven for free."""
    clock = trio.lowlevel.current_clock()
    assert isinstance(clock, trio.testing.MockClock), "elapse() needs the autojump clock"
    await trio.sleep(seconds)


async def scenario_pause(seconds: float, *, why: str) -> None:
    """A pause that is part of the scenario under test (a fake's latency, a job that must be
    running for a while), not a settle sleep. ``why`` says what it stands for."""
    assert why, "say what the pause stands for"
    await trio.sleep(seconds)


def sh_script(directory: Path, name: str, body: str, mode: int = 0o755) -> Path:
    """``directory/name``: a ``#!/bin/sh`` script running ``body``, with this mode."""
    path = directory / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(mode)
    return path


def new_dir(path: Path) -> Path:
    """``path``, made as a new empty directory."""
    path.mkdir()
    return path


async def run_sh(script: str, *, within: float = 10.0, **spec: Any) -> tuple[Result, str]:
    """Run ``sh -c script`` as a job (``spec``: further ``JobSpec`` fields), guarded by
    ``fail_after(within)``: its result and its output (stdout and stderr)."""
    sink = BufferSink()
    with trio.fail_after(within):
        res = await run(JobSpec(command=["sh", "-c", script], **spec), sink)
    return res, sink.text()


async def marker_ready(pid: int, value: str) -> None:
    """Until the process's ``RC_JOB_ID`` reads ``value``. A freshly spawned child is inside
    ``execve`` when ``open_process`` returns; its environ reads empty until the kernel has
    copied it onto the new stack."""
    await wait_until(lambda: job_env_id(pid) == (value, None), what=f"pid {pid}'s marker")


async def answer(client: httpx.AsyncClient, url: str, **kw: object) -> httpx.Response | None:
    """One ``GET``; ``None`` while nothing accepts connections there yet (a predicate for
    :func:`wait_until`: ``r = await wait_until(lambda: answer(client, "/fleet/health"))``)."""
    try:
        return await client.get(url, **kw)  # type: ignore[arg-type]
    except httpx.TransportError:
        return None


async def healthy(client: httpx.AsyncClient) -> bool:
    """``GET /fleet/health`` answers 200 (a node that is up and ready)."""
    r = await answer(client, "/fleet/health")
    return r is not None and r.status_code == 200


async def state_in(client: httpx.AsyncClient, job_id: str, *states: str) -> bool:
    """The node job's polled state (``GET /fleet/jobs/<id>``) is one of ``states`` (a
    predicate for :func:`wait_until`: ``wait_until(lambda: state_in(c, "j1", "done"))``)."""
    return (await client.get(f"/fleet/jobs/{job_id}")).json().get("state") in states


def logged(bus: object, job_id: str, nbytes: int) -> bool:
    """The log bus holds at least ``nbytes`` of the job's output (a predicate for
    :func:`wait_until`; ``bus`` is a node's or a worker's ``LogBus``)."""
    log = bus.get(job_id)  # type: ignore[attr-defined]
    return log is not None and log.nbytes >= nbytes


class CountingSource:
    """A device source that counts the reads it has answered (the test waits on them)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.reads = 0

    async def snapshot(self) -> Any:
        try:
            return await self.inner.snapshot()
        finally:
            self.reads += 1

    async def process_used_bytes(self) -> dict[int, int] | None:
        try:
            answer: dict[int, int] | None = await self.inner.process_used_bytes()
            return answer
        finally:
            self.reads += 1

    async def device_name(self) -> str:
        name: str = await self.inner.device_name()
        return name


async def gone_within(pid: int, seconds: float) -> bool:
    """True once ``pid`` is gone or a zombie, waiting for at most ``seconds``."""
    with trio.move_on_after(seconds):
        await wait_until(lambda: not pid_alive(pid), timeout=seconds, interval=0.02)
        return True
    return not pid_alive(pid)


class PidWatcher:
    """A sink that records output and wakes waiters once a ``child:<pid>`` line appears."""

    def __init__(self, inner: BufferSink) -> None:
        self.inner = inner
        self.seen = trio.Event()
        self._pid: int | None = None

    async def write(self, data: bytes) -> None:
        await self.inner.write(data)
        if self._pid is None:
            m = re.search(r"child:(\d+)", self.inner.text())
            if m:
                self._pid = int(m.group(1))
                self.seen.set()

    def pid(self) -> int:
        assert self._pid is not None, "the job never printed child:<pid>"
        return self._pid


async def stop_when_output(watcher: PidWatcher, stop: StopToken) -> None:
    await watcher.seen.wait()
    stop.set()


async def run_stopped_once_seen(spec: JobSpec, watcher: PidWatcher) -> Result:
    """``run(spec)`` into ``watcher``, with a stop request as soon as the job has printed its
    ``child:PID`` line."""
    stop = StopToken()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(stop_when_output, watcher, stop)
        return await run(spec, watcher, stop)


async def cancel_when_output(watcher: PidWatcher, scope: trio.CancelScope) -> None:
    """Cancel ``scope`` (a trio cancellation: a shutdown, not a stop) once the job has printed
    its ``child:PID`` line."""
    await watcher.seen.wait()
    scope.cancel()


async def stop_after(stop: StopToken, seconds: float) -> None:
    """The scenario's stop request, ``seconds`` into the job."""
    await scenario_pause(seconds, why="the stop request comes this long into the job")
    stop.set()


# ----------------------------------------------------------------------------------------------
# Processes carrying a job marker, and a scan over a fixed namespace (the recovery tests).

DEAD_BEEF = "00000000-dead-beef-0000-000000000000"


class FakeScan:
    """A scan over a fixed namespace; counts its calls."""

    def __init__(self, *procs: ProcStat, scanned: bool = True) -> None:
        self.procs = procs
        self.scanned = scanned
        self.calls = 0

    def __call__(self, predicate: Predicate, stop_at_first: bool) -> tuple[list[int], bool]:
        self.calls += 1
        if not self.scanned:
            return [], False
        out: list[int] = []
        for st in self.procs:
            if st.state == "Z" or not predicate(st):
                continue
            out.append(st.pid)
            if stop_at_first:
                break
        return out, True


def marked_env(value: str) -> dict[str, str]:
    """This environment with ``RC_JOB_ID=value``."""
    return {**os.environ, "RC_JOB_ID": value}


async def start_marked(value: str, *argv: str) -> trio.Process:
    """A process (``sleep 60`` unless ``argv``) carrying ``RC_JOB_ID=value``."""
    return await trio.lowlevel.open_process(
        list(argv) or ["sleep", "60"], env=marked_env(value), process_group=0
    )


async def stop(proc: trio.Process) -> None:
    """SIGKILL and reap, shielded."""
    with trio.CancelScope(shield=True):
        proc.send_signal(signal.SIGKILL)
        await proc.wait()


# ----------------------------------------------------------------------------------------------
# The real worker as a trio task against the simulated controller, with real job processes.
# Timers are shrunk (heartbeat 0.1 s, poll wait 0.5 s); every test runs under ``trio.fail_after``.

FAST = attrs.evolve(
    TEST_WORKER_TIMINGS,
    register_backoff=(0.05, 0.1),
    reregister_silence=300.0,
    heartbeat_interval=0.1,
    poll_wait=0.5,
    probe_interval=float("inf"),
)
FAST_CLIENT = TEST_CLIENT_TIMINGS  # the sim harness's: one running attempt, room for load


def sim(**kw: float) -> SimController:
    defaults: dict[str, float] = {
        "reaper_interval": 0.05,
        "heartbeat_timeout": 30.0,
        "worker_lost_after": 300.0,
        "startup_grace": 0.0,
    }
    defaults.update(kw)
    return SimController(token="wtok", **defaults)  # type: ignore[arg-type]


def config(
    url: str,
    devices: Sequence[str | DeviceConfig] = ("gpu0", "gpu1"),
    *,
    manual_clear: bool = False,
    **kw: Any,
) -> WorkerConfig:
    """``manual_clear``: no recovery proof, so two registrations compare equal even while other
    test runs' jobs (carrying RC_JOB_ID) come and go on this machine. ``kw``: further
    ``WorkerConfig`` fields (given at construction, so that host-level defaults such as
    ``hooks`` reach the devices)."""
    devs = tuple(d if isinstance(d, DeviceConfig) else DeviceConfig(name=d) for d in devices)
    return WorkerConfig(
        controller_url=url,
        token="wtok",
        host=HOST,
        devices=devs,
        sheet_dir="/nonexistent",
        require_manual_clear=manual_clear,
        **kw,
    )


def json_values(
    *, digits: int, text: int, items: int, keys: int, leaves: int
) -> strategies.SearchStrategy[object]:
    """Any JSON document, for fuzzing a parser: null, booleans, integers up to ``10**digits``,
    finite floats, strings up to ``text`` characters, nested in lists (up to ``items``) and
    objects (keys up to ``keys`` characters), at most ``leaves`` scalars in all."""
    scalars = strategies.one_of(
        strategies.none(),
        strategies.booleans(),
        strategies.integers(min_value=-(10**digits), max_value=10**digits),
        strategies.floats(allow_nan=False, allow_infinity=False),
        strategies.text(max_size=text),
    )
    return strategies.recursive(
        scalars,
        lambda inner: (
            strategies.lists(inner, max_size=items)
            | strategies.dictionaries(strategies.text(max_size=keys), inner)
        ),
        max_leaves=leaves,
    )


def write_worker_yaml(
    folder: Path, url: str, *, token: str = "wtok", host: str = HOST, extra: str = ""
) -> Path:
    """``folder/worker.yaml`` for a real ``fleet-trio worker`` against ``url``: heartbeat
    200 ms, poll wait 1 s, one device ``gpu0``; ``extra``: more top-level lines."""
    path = folder / "worker.yaml"
    path.write_text(
        f"controller_url: {url}\ntoken: {token}\nhost: {host}\nheartbeat_interval: 200ms\n"
        f"poll_wait: 1s\nsheet_dir: {folder}\n{extra}devices:\n  - gpu0\n"
    )
    return path


async def sim_worker(nursery: trio.Nursery, ctrl: SimController) -> Worker:
    """Serve ``ctrl`` in ``nursery``; a worker (not started) on it, with ``FAST`` timings."""
    url = await nursery.start(serve_controller, ctrl)
    return Worker(config(url), timings=FAST, client_timings=FAST_CLIENT)


async def operated_job(
    ctrl: SimController, command: list[str], stdio: str, typed: bytes, expect: bytes
) -> tuple[str, RelaySession]:
    """A relay job (``stdio`` ``tty`` or ``pipe``) on ``gpu0``: its operator types ``typed``,
    waits for ``expect``, then ends the input (tty: ``exit``; pipe: EOF); asserts the job
    succeeded. The job id and its operator (with the output it saw)."""
    job = ctrl.submit(dev("gpu0"), command, stdio=stdio)
    term = operator(ctrl, job)
    await term.wait_connected(timeout=10)
    await term.send(typed)
    await term.wait_output(expect, timeout=10)
    if stdio == "tty":
        await term.send(b"exit\n")
    else:
        await term.close_input()
    assert await until_terminal(ctrl, job) == ["running", "succeeded"]
    return job, term


def start_worker(nursery: trio.Nursery, worker: Worker) -> trio.Event:
    """Run ``serve_worker(worker)`` in ``nursery``; the event is set when it returns or raises."""
    done = trio.Event()

    async def run_worker() -> None:
        try:
            await serve_worker(worker)
        finally:
            done.set()

    nursery.start_soon(run_worker)
    return done


@asynccontextmanager
async def running(
    ctrl: SimController | None = None,
    *,
    devices: Sequence[str | DeviceConfig] = ("gpu0", "gpu1"),
    timings: WorkerTimings = FAST,
    client_timings: Timings = FAST_CLIENT,
    manual_clear: bool = False,
    configure: Callable[[WorkerConfig], WorkerConfig] | None = None,
) -> AsyncIterator[tuple[SimController, Worker]]:
    """A sim controller and a started worker; the worker is shut down (gracefully) at exit.
    ``configure`` adjusts the config (``lambda c: attrs.evolve(c, probe_dir=...)``)."""
    ctrl = ctrl if ctrl is not None else sim()
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_controller, ctrl)
        cfg = config(url, devices, manual_clear=manual_clear)
        worker = Worker(
            configure(cfg) if configure is not None else cfg,
            timings=timings,
            client_timings=client_timings,
        )
        done = start_worker(nursery, worker)
        await ctrl.wait_for(
            lambda: worker.registrations >= 1 and ctrl.polls(), timeout=WAIT_TIMEOUT
        )
        yield ctrl, worker
        worker.request_shutdown("test over")
        with trio.fail_after(15):
            await done.wait()
        nursery.cancel_scope.cancel()


def dev(name: str) -> str:
    return f"{HOST}:{name}"


TERMINAL = frozenset({"succeeded", "failed", "killed", "lost"})


async def until_terminal(ctrl: SimController, job_id: str, within: float = 10.0) -> list[str]:
    """The job's statuses once the sim controller has a terminal one."""
    await ctrl.wait_for(lambda: any(s in TERMINAL for s in ctrl.statuses(job_id)), within)
    return ctrl.statuses(job_id)


async def started(ctrl: SimController, device: str, command: Sequence[str], **kw: Any) -> str:
    """Submit ``command`` on ``device`` (``kw`` as for ``submit``) and wait until the job has
    reported ``running`` (and nothing else yet); its id."""
    job = ctrl.submit(device, command, **kw)
    await ctrl.wait_for(lambda: ctrl.statuses(job) == ["running"])
    return job


async def succeeded(
    ctrl: SimController, device: str, command: Sequence[str] = ("true",), **kw: Any
) -> str:
    """Submit ``command`` on ``device`` (``kw`` as for ``submit``), assert the job ran and
    succeeded; its id."""
    job = ctrl.submit(device, command, **kw)
    assert await until_terminal(ctrl, job) == ["running", "succeeded"]
    return job


class FakeHooks:
    """Hook seam double: records calls, fails acquire/verify on demand."""

    def __init__(self, *, acquire_fails: str | None = None, verify_fails: str | None = None):
        self.acquire_fails = acquire_fails
        self.verify_fails = verify_fails
        self.calls: list[tuple[str, str]] = []

    async def acquire(self, device_id: str, job: Assignment, stop: object) -> str | None:
        self.calls.append(("acquire", job.job_id))
        return self.acquire_fails

    async def verify(self, device_id: str, job: Assignment) -> str | None:
        self.calls.append(("verify", job.job_id))
        return self.verify_fails

    async def release(self, device_id: str, job: Assignment) -> None:
        self.calls.append(("release", job.job_id))


@asynccontextmanager
async def running_with_hooks(
    hooks: FakeHooks, *, timings: WorkerTimings = FAST, client_timings: Timings = FAST_CLIENT
) -> AsyncIterator[tuple[SimController, Worker]]:
    ctrl = sim()
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_controller, ctrl)
        worker = Worker(config(url), timings=timings, client_timings=client_timings, hooks=hooks)
        nursery.start_soon(serve_worker, worker)
        await ctrl.wait_for(lambda: worker.registrations >= 1)
        yield ctrl, worker
        worker.request_shutdown("test over")
        nursery.cancel_scope.cancel()


# ----------------------------------------------------------------------------------------------
# The controller client against the simulated controller over real HTTP.

CLIENT_FAST = Timings(
    request_timeout=5.0,
    report_attempt_timeout=0.5,
    report_backoff=(0.02, 0.04, 0.08),
    patience=30.0,
    log_flush_delay=0.1,
)
REG = Registration(
    host=HOST,
    devices=(DeviceDecl("gpu0", 3600), DeviceDecl("gpu1")),
    boot_id="b-1",
    recovery={"survivors_checked": True},
    labels={"": {"cpus": "2"}, "gpu0": {}, "gpu1": {}},
    declared_labels={"gpu0": {"rack": "r3"}, "gpu1": None},
    sheet="",
    device_sheets={"gpu0": "", "gpu1": ""},
)


@asynccontextmanager
async def controller(
    timings: Timings = CLIENT_FAST, **kw: float
) -> AsyncIterator[tuple[SimController, ControllerClient]]:
    ctrl = SimController(token="wtok", reaper_interval=0.05, startup_grace=0.0, **kw)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_controller, ctrl)
        async with ControllerClient(url + "/", "wtok", timings=timings) as client:
            yield ctrl, client
        nursery.cancel_scope.cancel()


AUTH = {"Authorization": "Bearer wtok"}


@asynccontextmanager
async def with_running_job(
    **kw: float,
) -> AsyncIterator[tuple[SimController, ControllerClient, str, str]]:
    """Registered (no recovery claim) and one job on gpu0 taken by a poll (now ``running``)."""
    async with controller(CLIENT_FAST, **kw) as (ctrl, client):
        worker_id = await client.register(attrs.evolve(REG, recovery=None))
        job = ctrl.submit(dev("gpu0"), ["sleep", "30"])
        answer = await client.poll(worker_id, 0.5)
        assert [a.job_id for a in answer.assignments] == [job]
        yield ctrl, client, worker_id, job


GPUBOX: dict[str, Any] = {
    "host": HOST,
    "devices": [{"name": "gpu0"}, {"name": "gpu1"}],
    "heartbeat_interval": "100ms",
    "poll_wait": "500ms",
}
"""A two-device worker config for the ``fleet_worker_config`` fixture."""


def bare_node_context(**kw: Any) -> NodeContext:
    """A node context with no tasks, an empty store and a real runner; ``kw``: further
    ``NodeContext`` fields (``edge``, ``sampler``...)."""
    return NodeContext(
        node_id="n",
        gpu_arch="nvidia",
        registry=TaskRegistry([]),
        store=JobStore(),
        runner=TaskRunner(kill_grace=1),
        **kw,
    )


async def dispatch_as(
    client: httpx.AsyncClient, content_type: str | None, job_id: str, task_type: str = "image-gen"
) -> httpx.Response:
    """``POST /fleet/dispatch`` of a minimal job sent with this ``Content-Type`` (None: the
    header is left out)."""
    body = f'{{"job_id":"{job_id}","task_type":"{task_type}"}}'.encode()
    headers = {"Content-Type": content_type} if content_type is not None else {}
    return await client.post("/fleet/dispatch", content=body, headers=headers)


async def read_head(stream: trio.abc.ReceiveStream, data: bytes = b"") -> bytes:
    """``data`` and what ``stream`` sends after it, read until it holds a blank line (the end of
    an HTTP head) or the peer closes: a caller checks for the blank line to tell them apart."""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(65536)
        if not chunk:
            break
        data += chunk
    return data


CLI = [PY, "-m", "fleet_trio"]


async def fleet(*args: str, limit: float = 30) -> subprocess.CompletedProcess[bytes]:
    with trio.fail_after(limit):
        return await trio.run_process(
            [*CLI, *args], capture_stdout=True, capture_stderr=True, check=False
        )


# ----------------------------------------------------------------------------------------------
# A live tail's events, read over a real websocket (the node's and the worker's tails).


async def collect(
    url: str, headers: list[tuple[bytes, bytes]] | None = None
) -> tuple[list[TailEvent], int | None]:
    """Every event until the server closes, and the close code."""
    events: list[TailEvent] = []
    with trio.fail_after(20):
        async with open_websocket_url(url, extra_headers=headers or []) as ws:
            try:
                while True:
                    events.append(tail_loads(await ws.get_message()))
            except ConnectionClosed as exc:
                assert exc.reason is not None
                return events, exc.reason.code
    raise AssertionError("unreachable")


def assert_contiguous(events: list[TailEvent], start: int = 0) -> None:
    """Output events follow each other without a gap from ``start``; the end is at the last
    output's end; nothing else came."""
    pos = start
    for ev in events:
        if isinstance(ev, Output):
            assert ev.offset == pos
            pos += len(ev.data)
        elif isinstance(ev, End):
            assert ev.offset == pos
        else:
            raise AssertionError(f"unexpected {ev!r}")


async def run_tail_cli(*args: str) -> trio.CompletedProcess[bytes]:
    """``fleet-trio tail ARGS`` in a child interpreter (no token from the environment), guarded
    by ``fail_after(30)``; its exit code, stdout and stderr."""
    env = {**os.environ, "FLEET_TRIO_TOKEN": ""}
    with trio.fail_after(30):
        return await trio.run_process(
            [PY, "-m", "fleet_trio", "tail", *args],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env=env,
        )


# A node task for the live tail: prints `lines` lines (payload, default 5) on stderr, each its
# first argument formatted with the line number `i` (default "line {i} é"), with `pause`
# seconds between them; then `bad_utf8` raw bytes if asked; then exits with `exit`, or prints
# its JSON result {"ok": true, "n": lines} on stdout.
LINES_SCRIPT = r"""
import json, sys, time
line = sys.argv[1] if len(sys.argv) > 1 else "line {i} \u00e9\n"
p = json.loads(sys.stdin.read())
n = p.get("lines", 5)
for i in range(n):
    sys.stderr.write(line.format(i=i))
    sys.stderr.flush()
    time.sleep(p.get("pause", 0))
if p.get("bad_utf8"):
    sys.stderr.buffer.write(b"\xff\xfe raw\n")
    sys.stderr.flush()
if p.get("exit"):
    sys.exit(p["exit"])
sys.stdout.write(json.dumps({"ok": True, "n": n}))
"""


@asynccontextmanager
async def fleet_trio_process(argv: Sequence[str], **kw: Any) -> AsyncIterator[trio.Process]:
    """``python -m fleet_trio ARGV`` as a child process (``kw`` as for ``open_process``). A
    block that ends normally ends it with SIGTERM and asserts a clean exit 0; one that fails
    leaves it SIGKILLed and reaped."""
    proc = await trio.lowlevel.open_process([PY, "-m", "fleet_trio", *argv], **kw)
    try:
        yield proc
        proc.send_signal(signal.SIGTERM)
        assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            with trio.CancelScope(shield=True):
                await proc.wait()


@asynccontextmanager
async def serving(serve: Callable[..., Awaitable[object]], *args: object) -> AsyncIterator[Any]:
    """``serve(*args)`` started with ``nursery.start`` for the block (what it passed to
    ``task_status.started()`` is yielded), cancelled when the block ends."""
    async with trio.open_nursery() as nursery:
        yield await nursery.start(serve, *args)
        nursery.cancel_scope.cancel()


class StubGpuSource:
    """The parts of a ``GpuSource`` a sampler test leaves alone: no per-process accounting and
    the product name ``product``. A test's source subclasses it and writes ``snapshot``."""

    name = "stub"
    product = ""

    async def process_used_bytes(self) -> dict[int, int] | None:
        await trio.lowlevel.checkpoint()
        return None

    async def device_name(self) -> str:
        await trio.lowlevel.checkpoint()
        return self.product


def sheet_config(sheet_dir: Path) -> WorkerConfig:
    """A worker config (host ``gpubox``, devices gpu0-gpu2) reading usage sheets from
    ``sheet_dir``."""
    return config_from_mapping(
        {
            "controller_url": "http://127.0.0.1:1",
            "token": "t",
            "sheet_dir": str(sheet_dir),
            "devices": ["gpu0", "gpu1", "gpu2"],
        },
        path="worker.yaml",
        environ={},
        hostname=lambda: "gpubox",
    )
