"""The simulation harness: a fleet on loopback, as async context managers (docs/sim.md).

(Over 500 lines: one ``open_*`` context manager per fake peer, all sharing the loopback and fake-
GPU plumbing; users import them from one place.)

Everything here runs as trio tasks of the caller's ``trio.run`` on ``127.0.0.1`` port 0; jobs
are real child processes. Each ``open_*`` manager (fake GPU, controller, node, worker,
dispatcher) yields a running instance and stops it on exit (a graceful shutdown: jobs drained,
process groups killed and reaped). The fixtures of :mod:`fleet_trio.sim.pytest_plugin` wrap
these; other test runners can use them directly.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from fleet_trio.errors import ConfigError, FleetTrioError
from fleet_trio.gpu import fake
from fleet_trio.gpu.source import GIB
from fleet_trio.node.config import NodeConfig, config_from_mapping, load_config
from fleet_trio.node.server import NodeOptions, RunningNode, serve_node
from fleet_trio.sim.controller import Job, SimController, serve_controller
from fleet_trio.sim.controller.records import TERMINAL
from fleet_trio.sim.dispatcher import NODE_TERMINAL, SimDispatcher, serve_dispatcher
from fleet_trio.worker.client import Timings
from fleet_trio.worker.config import WorkerConfig, load_worker_config
from fleet_trio.worker.config import config_from_mapping as worker_config_from_mapping
from fleet_trio.worker.worker import Worker, WorkerHooks, WorkerTimings, serve_worker

ConfigSource = str | os.PathLike[str] | Mapping[str, Any] | None
"""A config as a test gives it: a YAML file, the parsed YAML as a mapping, or ``None`` for
the built-in default."""

CONTROLLER_DEFAULTS: Mapping[str, Any] = {"reaper_interval": 0.05, "startup_grace": 0.0}
"""What :func:`open_controller` changes from the reference timers: the reaper sweeps every
50 ms and there is no startup grace, so silence and lease expiry are seen quickly."""

TEST_WORKER_TIMINGS = WorkerTimings(
    idle_poll_floor=0.05,
    poll_error_delay=0.1,
    shutdown_drain=5.0,
    kill_grace=2.0,
    hurry_budget=2.0,
    register_backoff=(0.05, 0.1, 0.2, 0.5, 1.0),
    reregister_jitter=0.0,
    reregister_pacing=0.5,
)
"""The worker's lifecycle constants, shrunk so a test's start and stop take milliseconds.
The values from ``worker.yaml`` (heartbeat, poll wait, hook and verify timeouts) are kept."""

TEST_CLIENT_TIMINGS = Timings(
    request_timeout=5.0,
    report_attempt_timeout=3.0,  # the running report has one attempt: room for a loaded loop
    report_backoff=(0.05, 0.1, 0.2),
    log_flush_delay=0.1,
)

DEFAULT_NODE_CONFIG: Mapping[str, Any] = {
    "node": {"timings": {"drain_timeout": "5s", "kill_grace": "1s"}},
    "tasks": {
        "echo": {
            "command": [
                "{python}",
                "-c",
                "import json, sys; json.dump({'echo': json.load(sys.stdin)}, sys.stdout)",
            ],
        },
    },
}
"""The node config used when a test gives none: one task, ``echo``, whose result is
``{"echo": <payload>}``. ``{python}`` is the running interpreter."""

DEFAULT_WORKER_CONFIG: Mapping[str, Any] = {
    "host": "sim-host",
    "devices": [{"name": "gpu0"}, {"name": "gpu1"}],
}
"""The worker config used when a test gives none: host ``sim-host``, devices gpu0 and gpu1."""

_SCRATCH_DIR_KEYS = ("probe_dir", "verify_dir", "sheet_dir")


class HarnessError(FleetTrioError):
    """A harness call could not do what it was asked (a refused dispatch, a bad argument)."""


# -- Fake GPU ----------------------------------------------------------------------------------


@attrs.define
class FakeGpuDir:
    """A fake GPU (one directory per device) that tests script from the outside.

    Job processes hold fake VRAM with ``python -m fleet_trio.gpu.fake hold 2G`` (the
    directory comes from ``$FLEET_TRIO_FAKE_GPU_DIR``, see :attr:`env`); the test holds and
    frees it with :meth:`hold` / :meth:`free`.
    """

    root: Path
    dirs: tuple[Path, ...]
    total_gib: float
    _limiter: trio.CapacityLimiter = attrs.field(factory=lambda: trio.CapacityLimiter(1))

    @property
    def dir(self) -> Path:
        """The first device's directory."""
        return self.dirs[0]

    @property
    def env(self) -> dict[str, str]:
        """``{"FLEET_TRIO_FAKE_GPU_DIR": <the device>}`` for a job's environment; with several
        devices, the root (the helper then holds on the device of the job's
        ``CUDA_VISIBLE_DEVICES``)."""
        return {fake.ENV_DIR: str(self.node_dir)}

    @property
    def node_dir(self) -> Path:
        """What a node is given as ``--fake-gpu-dir``: the device, or the root of several."""
        return self.dir if len(self.dirs) == 1 else self.root

    def uuid(self, device: int = 0) -> str:
        """The UUID the node sees for ``device`` (and puts in a job's
        ``CUDA_VISIBLE_DEVICES``)."""
        path = str(self.device_dir(device))
        return fake.read_device(path).uuid or fake.fake_uuid(path)

    def device_dir(self, device: int = 0) -> Path:
        try:
            return self.dirs[device]
        except IndexError:
            raise HarnessError(
                f"fake gpu has {len(self.dirs)} device(s), no device {device}"
            ) from None

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await trio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    async def hold(self, size: str | int, *, pid: int | None = None, device: int = 0) -> int:
        """Make ``pid`` (default: this process) hold ``size`` (``"2.5G"``, ``"512M"`` or
        bytes) on ``device``; returns the pid. Only live pids count."""
        nbytes = fake.parse_size(size) if isinstance(size, str) else int(size)
        who = pid if pid is not None else os.getpid()
        await self._run(fake.write_holding, str(self.device_dir(device)), who, nbytes)
        return who

    async def free(self, *, pid: int | None = None, device: int = 0) -> None:
        """Drop ``pid``'s holding (default: this process)."""
        who = pid if pid is not None else os.getpid()
        await self._run(fake.remove_holding, str(self.device_dir(device)), who)

    async def holdings(self, device: int = 0) -> dict[int, int]:
        """pid → bytes for every live holder on ``device``."""
        held: dict[int, int] = await self._run(fake.read_holdings, str(self.device_dir(device)))
        return held

    async def used_gib(self, device: int = 0) -> float:
        """What the fake reports as used on ``device`` (base use + live holdings)."""
        directory = str(self.device_dir(device))
        dev = await self._run(fake.read_device, directory)
        held = await self.holdings(device)
        return float(dev.base_used_gib + sum(held.values()) / GIB)

    async def fail(self, message: str = "fake gpu: scripted failure", *, device: int = 0) -> None:
        """Make every snapshot of ``device`` fail with ``message`` until :meth:`recover`."""
        path = self.device_dir(device) / fake.FAIL_FILE
        await trio.Path(path).write_text(message, encoding="utf-8")

    async def recover(self, *, device: int = 0) -> None:
        await trio.Path(self.device_dir(device) / fake.FAIL_FILE).unlink(missing_ok=True)


@asynccontextmanager
async def open_fake_gpu(
    path: str | os.PathLike[str],
    *,
    total_gib: float | Sequence[float] = 80.0,
    devices: int = 1,
    name: str = "Fake GPU",
) -> AsyncIterator[FakeGpuDir]:
    """Create ``path/gpu0`` … ``path/gpu{devices-1}``, each a fake GPU of ``total_gib`` (one
    number for all, or one per device). A node on it sees ``devices`` devices, each with its
    own UUID (:meth:`FakeGpuDir.uuid`), total and holdings.

    On exit this process's own holdings are dropped; holdings of job processes end with them.
    """
    if devices < 1:
        raise HarnessError(f"devices must be >= 1, got {devices}")
    totals = [float(total_gib)] * devices if isinstance(total_gib, int | float) else list(total_gib)
    if len(totals) != devices:
        raise HarnessError(f"total_gib: {len(totals)} value(s) for {devices} device(s)")
    for total in totals:
        if not total > 0:
            raise HarnessError(f"total_gib must be > 0, got {total}")
    root = Path(path)
    dirs = tuple(root / f"gpu{i}" for i in range(devices))
    for d, total in zip(dirs, totals, strict=True):
        await trio.to_thread.run_sync(fake.init_device, str(d), name, total)
    gpu = FakeGpuDir(root=root, dirs=dirs, total_gib=max(totals))
    try:
        yield gpu
    finally:
        with trio.move_on_after(5, shield=True):
            for i in range(devices):
                await gpu.free(device=i)


# -- Scratch directories -----------------------------------------------------------------------


@asynccontextmanager
async def _workdir(path: str | os.PathLike[str] | None, prefix: str) -> AsyncIterator[Path]:
    """``path`` (created), or a temporary directory removed on exit."""
    if path is not None:
        await trio.Path(path).mkdir(parents=True, exist_ok=True)
        yield Path(path)
        return
    made = Path(await trio.to_thread.run_sync(functools.partial(tempfile.mkdtemp, prefix=prefix)))
    try:
        yield made
    finally:
        with trio.move_on_after(10, shield=True):
            await trio.to_thread.run_sync(
                functools.partial(shutil.rmtree, made, ignore_errors=True)
            )


# -- Controller --------------------------------------------------------------------------------


@asynccontextmanager
async def open_controller(
    *, host: str = "127.0.0.1", port: int = 0, **options: Any
) -> AsyncIterator[SimController]:
    """A serving :class:`SimController` (``.base_url`` is set).

    ``options`` are the constructor's keywords (docs/sim-controller.md); unset ones take
    :data:`CONTROLLER_DEFAULTS`, then the reference timers.
    """
    ctrl = SimController(**{**CONTROLLER_DEFAULTS, **options})
    async with trio.open_nursery() as nursery:
        await nursery.start(functools.partial(serve_controller, ctrl, host=host, port=port))
        yield ctrl
        nursery.cancel_scope.cancel()


def worker_token(ctrl: SimController) -> str:
    """A token the controller accepts from a worker."""
    for token, role in ctrl.tokens.items():
        if role == "worker":
            return token
    raise HarnessError("the controller has no worker-role token")


# -- Node --------------------------------------------------------------------------------------


def _stop(request_shutdown: Callable[[str], object], drain: bool, busy: bool) -> None:
    """Begin the shutdown; without ``drain`` and with job processes still running (``busy``),
    ask twice, as a second SIGINT does: the drain is skipped, so those jobs are marked
    interrupted and their process groups get SIGTERM, the kill grace, then SIGKILL. Jobs
    whose process has ended finish their cleanup (verify, release) within the drain."""
    request_shutdown("harness exit")
    if busy and not drain:
        request_shutdown("harness exit (no drain)")


def _default_node_mapping() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(json.dumps(DEFAULT_NODE_CONFIG))
    for task in data["tasks"].values():
        task["command"] = [sys.executable if p == "{python}" else p for p in task["command"]]
    return data


async def load_node_config(
    config: ConfigSource | NodeConfig, *, base_dir: str | os.PathLike[str] | None = None
) -> NodeConfig:
    """A :class:`NodeConfig` from a YAML path, a mapping, a config, or ``None`` (the default).

    A mapping's relative commands resolve against ``base_dir`` (default: the working
    directory). Raises :class:`~fleet_trio.errors.ConfigError` naming the key and the file.
    """
    if isinstance(config, NodeConfig):
        return config
    if config is None:
        config = _default_node_mapping()
    if isinstance(config, Mapping):
        where = os.fspath(base_dir) if base_dir is not None else os.getcwd()
        return config_from_mapping(dict(config), base_dir=where)
    return await trio.to_thread.run_sync(load_config, os.fspath(config))


def _with_fake_gpu_env(config: NodeConfig, gpu: FakeGpuDir) -> NodeConfig:
    tasks = tuple(attrs.evolve(t, env={**gpu.env, **t.env}) for t in config.tasks)
    return attrs.evolve(config, tasks=tasks)


@attrs.define
class NodeHandle:
    """A running node: its HTTP client and helpers that speak CONTRACT v2 to it."""

    node: RunningNode
    client: httpx.AsyncClient
    """An ``httpx.AsyncClient`` with ``base_url`` set to the node (and its token, if any)."""
    config: NodeConfig
    fake_gpu: FakeGpuDir
    work_root: Path
    """Where the node makes each job's work directory."""
    footprints_path: Path
    """The node's footprint store (a scratch file, never the user's own)."""
    _ids: itertools.count[int] = attrs.field(factory=lambda: itertools.count(1))

    @property
    def url(self) -> str:
        return self.node.url

    @property
    def node_id(self) -> str:
        return self.node.context.node_id

    async def health(self) -> dict[str, Any]:
        """``GET /fleet/health`` as JSON (any status)."""
        r = await self.client.get("/fleet/health")
        body: dict[str, Any] = r.json()
        return body

    def new_job_id(self) -> str:
        return f"sim-{self.node_id}-{next(self._ids)}"

    async def dispatch(
        self, task_type: str, payload: Any = None, *, job_id: str | None = None, **extra: Any
    ) -> httpx.Response:
        """``POST /fleet/dispatch``; the raw answer (202 ack or a refusal).

        ``payload=None`` sends no ``payload`` member; ``job_id=None`` makes one up (read it
        back from the ack's ``job_id``); ``extra`` members (``model_family``, …) go as given.
        """
        body: dict[str, Any] = {
            "job_id": job_id if job_id is not None else self.new_job_id(),
            "task_type": task_type,
            **extra,
        }
        if payload is not None:
            body["payload"] = payload
        return await self.client.post(
            "/fleet/dispatch",
            content=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )

    async def submit(
        self, task_type: str, payload: Any = None, *, job_id: str | None = None, **extra: Any
    ) -> str:
        """Dispatch and return the job id; :class:`HarnessError` unless the node answers 202."""
        r = await self.dispatch(task_type, payload, job_id=job_id, **extra)
        if r.status_code != 202:
            raise HarnessError(f"dispatch of {task_type!r} refused: {r.status_code} {r.text}")
        acked: str = r.json()["job_id"]
        return acked

    async def poll(self, job_id: str) -> httpx.Response:
        """``GET /fleet/jobs/{id}``; the raw answer."""
        return await self.client.get(f"/fleet/jobs/{job_id}")

    async def wait(
        self,
        job_id: str,
        timeout: float = 30.0,  # noqa: ASYNC109 -- the documented test API
        *,
        interval: float = 0.02,
    ) -> dict[str, Any]:
        """Poll until the job is ``done`` or ``error``; the last poll's JSON.

        Raises ``trio.TooSlowError`` after ``timeout`` seconds.
        """
        with trio.fail_after(timeout):
            while True:
                r = await self.poll(job_id)
                body: dict[str, Any] = r.json()
                if r.status_code == 200 and body.get("state") in NODE_TERMINAL:
                    return body
                await trio.sleep(interval)

    async def run(
        self,
        task_type: str,
        payload: Any = None,
        *,
        timeout: float = 30.0,  # noqa: ASYNC109 -- the documented test API
        **extra: Any,
    ) -> dict[str, Any]:
        """:meth:`submit`, then :meth:`wait`: the job's terminal poll answer."""
        job_id = await self.submit(task_type, payload, **extra)
        return await self.wait(job_id, timeout)

    def work_dirs(self) -> list[str]:
        """The job work directories that still exist (each is removed when its job ends)."""
        try:
            return sorted(os.listdir(self.work_root))
        except FileNotFoundError:
            return []

    def request_shutdown(self, reason: str = "shutdown requested") -> None:
        """Start the node's drain now (dispatch answers 503); the manager's exit waits for it."""
        self.node.request_shutdown(reason)


@asynccontextmanager
async def open_node(
    config: ConfigSource | NodeConfig = None,
    *,
    fake_gpu: FakeGpuDir | None = None,
    workdir: str | os.PathLike[str] | None = None,
    base_dir: str | os.PathLike[str] | None = None,
    node_id: str = "sim-node",
    token: str | None = None,
    total_gib: float = 80.0,
    fake_gpus: int = 1,
    drain_on_exit: bool = False,
    start_timeout: float = 30.0,
) -> AsyncIterator[NodeHandle]:
    """``fleet-trio node`` as a trio task, from ``config`` (see :func:`load_node_config`).

    The node listens on ``127.0.0.1`` port 0 and measures the fake GPU (``fake_gpu``, or a
    new one of ``fake_gpus`` devices of ``total_gib`` under ``workdir``); every task gets
    ``FLEET_TRIO_FAKE_GPU_DIR`` in its environment. Job work directories and the footprint
    store live in ``workdir`` (default: a temporary directory). Signals are left alone.

    On exit the node shuts down and the manager waits for it: with ``drain_on_exit`` as on
    SIGTERM (jobs get the configured ``drain_timeout``), by default as on a second SIGINT
    (no drain: jobs still running end ``interrupted`` and are killed within ``kill_grace``).
    """
    cfg = await load_node_config(config, base_dir=base_dir)
    async with contextlib.AsyncExitStack() as stack:
        root = await stack.enter_async_context(_workdir(workdir, "fleet-node-"))
        if fake_gpu is None:
            gpu = open_fake_gpu(root / "fake-gpu", total_gib=total_gib, devices=fake_gpus)
            fake_gpu = await stack.enter_async_context(gpu)
        yield await stack.enter_async_context(
            _serve_node(cfg, fake_gpu, root, node_id, token, drain_on_exit, start_timeout)
        )


@asynccontextmanager
async def _serve_node(
    cfg: NodeConfig,
    gpu: FakeGpuDir,
    root: Path,
    node_id: str,
    token: str | None,
    drain_on_exit: bool,
    start_timeout: float,
) -> AsyncIterator[NodeHandle]:
    cfg = _with_fake_gpu_env(cfg, gpu)
    work_root = root / "work"
    await trio.Path(work_root).mkdir(exist_ok=True)
    footprints = root / "footprints.json"
    options = NodeOptions(
        listen="127.0.0.1:0",
        node_id=node_id,
        gpu="fake",
        fake_gpu_dir=str(gpu.node_dir),
        fake_gpus=len(gpu.dirs),
        footprints=str(footprints),
        token=token,
    )
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with trio.open_nursery() as nursery:
        start = functools.partial(
            serve_node,
            cfg,
            options,
            signals=(),
            work_root=str(work_root),
            announce=lambda line: None,
        )
        with trio.fail_after(start_timeout):
            running: RunningNode = await nursery.start(start)
        try:
            async with httpx.AsyncClient(base_url=running.url, timeout=10, headers=headers) as c:
                yield NodeHandle(running, c, cfg, gpu, work_root, footprints)
        finally:
            busy = bool(running.store.table.in_flight_ids())
            running.context.linger.skip()  # nobody polls once the harness exits
            _stop(running.request_shutdown, drain_on_exit, busy)


# -- Worker ------------------------------------------------------------------------------------


def _read_worker_config(
    config: ConfigSource, controller_url: str, base_dir: str | os.PathLike[str] | None
) -> WorkerConfig:
    """A file's relative paths from its folder, a mapping's from ``base_dir`` (default: the
    working directory)."""
    if config is None or isinstance(config, Mapping):
        data = dict(config if config is not None else DEFAULT_WORKER_CONFIG)
        data.setdefault("controller_url", controller_url)
        where = os.path.abspath(os.fspath(base_dir) if base_dir is not None else os.getcwd())
        return worker_config_from_mapping(data, environ={}, base_dir=where)
    path = os.fspath(config)
    return load_worker_config(path, environ={}, base_dir=os.path.dirname(os.path.abspath(path)))


async def load_worker_settings(
    config: ConfigSource | WorkerConfig,
    ctrl: SimController,
    *,
    scratch: str | os.PathLike[str],
    base_dir: str | os.PathLike[str] | None = None,
) -> WorkerConfig:
    """A :class:`WorkerConfig` pointed at ``ctrl`` (``controller_url`` and ``token`` are
    replaced), from a ``worker.yaml`` path, a mapping, a config, or ``None`` (the default).

    Relative ``probe_dir`` / ``verify_dir`` / ``sheet_dir`` and hook paths (with a ``/``)
    resolve against the YAML file's folder, a mapping's against ``base_dir`` (default: the
    working directory), as node ``command:`` paths do; ``fleet-trio worker`` itself takes
    them from its working directory, as rc worker does (docs/worker-config.md "Paths").
    The environment overrides (``RC_TOKEN``, ``RC_REQUIRE_MANUAL_CLEAR``) are not read, so a
    test does not depend on the shell it runs in. ``probe_dir``, ``verify_dir`` and
    ``sheet_dir`` that the config leaves unset point into ``scratch`` (absent directories:
    the features are off) instead of the host's ``/etc/rc``.
    """
    token = worker_token(ctrl)
    given: set[str]
    if isinstance(config, WorkerConfig):
        cfg = config
        given = set(_SCRATCH_DIR_KEYS)
    else:
        load = functools.partial(_read_worker_config, config, ctrl.base_url, base_dir)
        cfg = await trio.to_thread.run_sync(load)
        given = set(cfg.set_keys)
    scratch = os.fspath(scratch)
    return attrs.evolve(
        cfg,
        controller_url=ctrl.base_url,
        token=token,
        probe_dir=cfg.probe_dir if "probe_dir" in given else os.path.join(scratch, "probe.d"),
        verify_dir=cfg.verify_dir if "verify_dir" in given else os.path.join(scratch, "verify.d"),
        sheet_dir=cfg.sheet_dir if "sheet_dir" in given else os.path.join(scratch, "sheets"),
    )


@attrs.define
class WorkerHandle:
    """A running worker and the controller it talks to."""

    worker: Worker
    controller: SimController
    config: WorkerConfig
    fake_gpu: FakeGpuDir | None = None

    @property
    def worker_id(self) -> str:
        return self.worker.worker_id

    def device_id(self, device: str) -> str:
        """``gpu0`` → ``host:gpu0``; a full id is returned as is."""
        return device if ":" in device else self.config.device_id(device)

    def submit(
        self,
        device: str,
        command: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        **options: Any,
    ) -> str:
        """``rc run -d`` on one of this worker's devices (``gpu0`` or ``host:gpu0``); the job
        id. The fake GPU's ``FLEET_TRIO_FAKE_GPU_DIR`` is added to ``env``; ``options`` are
        :meth:`SimController.submit`'s (``kind``, ``max_runtime_seconds``, ``stdio``, …)."""
        if options.get("kind") != "hold":  # a hold takes no env
            gpu_env = self.fake_gpu.env if self.fake_gpu is not None else {}
            options["env"] = {**gpu_env, **(env or {})}
        return self.controller.submit(self.device_id(device), command, **options)

    async def wait(self, job_id: str, timeout: float = 30.0) -> Job:  # noqa: ASYNC109
        """Wait until the controller has the job terminal; a copy of its record
        (``state``, ``exit_code``, ``kill_reason``, …). ``trio.TooSlowError`` on timeout."""
        ctrl = self.controller
        await ctrl.wait_for(lambda: ctrl.job(job_id).state in TERMINAL, timeout)
        return ctrl.job(job_id)

    async def run(
        self,
        device: str,
        command: Sequence[str],
        *,
        timeout: float = 30.0,  # noqa: ASYNC109 -- the documented test API
        **options: Any,
    ) -> Job:
        """:meth:`submit`, then :meth:`wait`."""
        return await self.wait(self.submit(device, command, **options), timeout)

    def statuses(self, job_id: str) -> list[str]:
        return self.controller.statuses(job_id)

    def logs(self, job_id: str) -> bytes:
        return self.controller.logs(job_id)

    def request_shutdown(self, reason: str = "shutdown requested") -> None:
        self.worker.request_shutdown(reason)


@asynccontextmanager
async def open_worker(
    config: ConfigSource | WorkerConfig,
    controller: SimController,
    *,
    fake_gpu: FakeGpuDir | None = None,
    workdir: str | os.PathLike[str] | None = None,
    base_dir: str | os.PathLike[str] | None = None,
    timings: WorkerTimings = TEST_WORKER_TIMINGS,
    client_timings: Timings = TEST_CLIENT_TIMINGS,
    hooks: WorkerHooks | None = None,
    drain_on_exit: bool = False,
    start_timeout: float = 30.0,
) -> AsyncIterator[WorkerHandle]:
    """``fleet-trio worker`` as a trio task against ``controller`` (which must be serving).

    Yields once the worker has registered and polls (``trio.TooSlowError`` if that takes
    more than ``start_timeout``: the worker retries registration without end). On exit it
    shuts down and the manager waits for it: with ``drain_on_exit`` as on SIGTERM (jobs get
    ``timings.shutdown_drain``), by default without the drain (jobs not yet terminal are
    killed within ``timings.kill_grace`` and reported ``killed``). The worker's hooks and
    verify pass run as usual. ``base_dir``: where a mapping's relative directories and hook
    paths resolve (:func:`load_worker_settings`).
    """
    if not controller.base_url:
        raise HarnessError("the controller is not serving (use open_controller)")
    async with _workdir(workdir, "fleet-worker-") as root:
        cfg = await load_worker_settings(config, controller, scratch=root / "rc", base_dir=base_dir)
        worker = Worker(cfg, timings=timings, client_timings=client_timings, hooks=hooks)
        async with trio.open_nursery() as nursery:
            with trio.fail_after(start_timeout):
                await nursery.start(serve_worker, worker)
            try:
                yield WorkerHandle(worker, controller, cfg, fake_gpu)
            finally:
                busy = any(not job.process_done.is_set() for job in worker.jobs.values())
                _stop(worker.request_shutdown, drain_on_exit, busy)


# -- Dispatcher --------------------------------------------------------------------------------


@asynccontextmanager
async def open_dispatcher(
    nodes: Sequence[str] = (), **options: Any
) -> AsyncIterator[SimDispatcher]:
    """A serving simulated Fleet Dispatcher over ``nodes`` (base URLs); ``options`` are
    ``SimDispatcher``'s keywords. Yields once its first health round is done."""
    disp = SimDispatcher(list(nodes), **options)
    async with trio.open_nursery() as nursery:
        await nursery.start(functools.partial(serve_dispatcher, disp))
        yield disp
        nursery.cancel_scope.cancel()


__all__ = [
    "CONTROLLER_DEFAULTS",
    "DEFAULT_NODE_CONFIG",
    "DEFAULT_WORKER_CONFIG",
    "TEST_CLIENT_TIMINGS",
    "TEST_WORKER_TIMINGS",
    "ConfigError",
    "ConfigSource",
    "FakeGpuDir",
    "HarnessError",
    "NodeHandle",
    "WorkerHandle",
    "load_node_config",
    "load_worker_settings",
    "open_controller",
    "open_dispatcher",
    "open_fake_gpu",
    "open_node",
    "open_worker",
    "worker_token",
]
