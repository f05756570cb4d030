"""``fleet-trio sim controller | submit | jobs | devices``: try the worker from a shell.

``sim controller`` serves the simulated rc controller (:mod:`fleet_trio.sim.controller`) on
loopback, writes a ready-to-use ``worker.yaml`` for it, prints its URL, its tokens and that
file, and records the URL and the client token in ``sim-controller.json`` under the state
directory (mode 0600, removed when it stops), so ``sim submit``/``sim jobs``/``sim devices``
find it without flags. They speak the client routes of :mod:`fleet_trio.sim.client_api`, the
same ``POST /v1/jobs`` that ``rc run`` sends to a real controller.

(Over 500 lines: the parser, the controller command and its session file, and the client
commands that read it belong together; the session file's safe write and read are here.)
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import secrets
import signal
import stat
import sys
import uuid
from collections.abc import Awaitable
from typing import Any, TypeVar

import trio

from fleet_trio.statedir import state_dir

PROG = "fleet-trio sim"
T = TypeVar("T")
DEFAULT_LISTEN = "127.0.0.1:18810"
SESSION_FILE = "sim-controller.json"
EXIT_FAILED = 1
EXIT_USAGE = 2
WAIT_FOR_WORKER = 30.0
"""How long ``sim submit`` waits for a worker to register before giving up."""
WAIT_FOR_CONTROLLER = 10.0
"""How long ``sim worker|submit`` wait for a ``sim controller`` that is starting
(``sim controller &`` returns before it serves: a pasted block's next line must not race it)."""


class SimCliError(Exception):
    """One line for the user (exit 1, or 2 for usage)."""

    def __init__(self, message: str, status: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.status = status


def session_path() -> str:
    return os.path.join(state_dir(), SESSION_FILE)


# -- the parser ------------------------------------------------------------------------------


def add_to_sim(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``controller``, ``submit``, ``jobs`` and ``devices`` under ``fleet-trio sim``."""
    sim = sub.choices["sim"]
    sim.description = (
        "Simulation harness commands: seeded chaos schedules (docs/chaos.md) and a simulated "
        "rc controller to try the worker with (docs/sim-controller.md)."
    )
    simsub = next(a for a in sim._actions if isinstance(a, argparse._SubParsersAction))
    p = simsub.add_parser(
        "controller",
        help="serve the simulated rc controller on loopback (try the worker without rc)",
        description=(
            "Serve the simulated rc controller on loopback until SIGINT/SIGTERM: the worker "
            "routes (register, heartbeat, assignments, status, logs, fault, relay) and the "
            "client routes rc run uses (POST /v1/jobs, GET /v1/jobs/ID, .../logs, .../kill, "
            "GET /v1/devices). Prints its URL, its worker and client tokens and the path of a "
            "worker.yaml that points at it; `fleet-trio sim submit|jobs|devices` find it "
            "through sim-controller.json in the state directory."
        ),
        epilog="See docs/worker.md (try it) and docs/sim-controller.md.",
    )
    p.add_argument(
        "--listen",
        metavar="HOST:PORT",
        default=DEFAULT_LISTEN,
        help=f"loopback address to serve on (default {DEFAULT_LISTEN}; port 0: any free port)",
    )
    p.add_argument("--worker-token", metavar="TOKEN", help="the worker token (default: random)")
    p.add_argument("--client-token", metavar="TOKEN", help="the client token (default: random)")
    p.add_argument(
        "--worker-config",
        metavar="FILE",
        help="write the worker.yaml here (default: sim/worker.yaml under the state directory)",
    )
    p.add_argument(
        "--host", default="sim-box", help="host name in the worker.yaml (default sim-box)"
    )
    p.add_argument(
        "--devices",
        type=int,
        default=1,
        metavar="N",
        help="devices gpu0..gpuN-1 in the worker.yaml (default 1)",
    )
    p.set_defaults(handler=cmd_controller)

    def client_args(q: argparse.ArgumentParser) -> None:
        q.add_argument("--url", help="the controller's URL (default: the running sim's)")
        q.add_argument("--token", metavar="TOKEN", help="client token (default: the sim's)")

    w = simsub.add_parser(
        "worker",
        help="run fleet-trio worker against the running sim controller",
        description=(
            "Run `fleet-trio worker -c FILE` with the worker.yaml the running `fleet-trio sim "
            "controller` wrote (its path is in sim-controller.json in the state directory)."
        ),
    )
    w.set_defaults(handler=cmd_worker)
    q = simsub.add_parser(
        "submit",
        help="submit a job to the sim controller (rc run's request) and follow it",
        description=(
            "Submit CMD as a job (POST /v1/jobs, as rc run does), print its output as the "
            "worker uploads it, and exit with the job's exit code (1 when it failed without "
            "one or the controller cannot be reached, 2 for a usage error, 130 after Ctrl-C, "
            "which kills the job). --detach prints the job id and returns."
        ),
        usage=(
            "%(prog)s [-h] [--device ID] [--max-runtime SECONDS]\n"
            "       [--detach] [--url URL] [--token TOKEN]\n"
            "       [--log-level LEVEL] [--log-format FORMAT] -- CMD [ARG...]"
        ),
    )
    q.add_argument("--device", metavar="ID", default="", help="host:gpuN (default: any ready)")
    q.add_argument(
        "--max-runtime",
        metavar="SECONDS",
        type=int,
        default=0,
        help="the job's max_runtime_seconds: the worker stops it after this long "
        "(default 0: no limit)",
    )
    q.add_argument("--detach", action="store_true", help="print the job id and return")
    client_args(q)
    q.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="-- CMD ARG...",
        help="the job's command and its arguments, after --",
    )
    q.set_defaults(handler=cmd_submit)
    for name, text in (
        ("jobs", "list the sim controller's jobs"),
        ("devices", "list the sim controller's devices"),
    ):
        r = simsub.add_parser(name, help=text, description=f"{text[0].upper()}{text[1:]}.")
        r.add_argument("--json", action="store_true", help="print the controller's JSON")
        client_args(r)
        r.set_defaults(
            handler=functools.partial(_run_client, _jobs if name == "jobs" else _devices)
        )


# -- sim controller -------------------------------------------------------------------------


def worker_yaml(url: str, token: str, host: str, devices: int, root: str) -> str:
    lines = [
        "# written by `fleet-trio sim controller`: a worker for the simulated controller",
        f"controller_url: {json.dumps(url)}",
        f"token: {json.dumps(token)}",
        f"host: {json.dumps(host)}",
        "devices:",
        *[f"  - gpu{i}" for i in range(devices)],
        "heartbeat_interval: 2s",
        f"probe_dir: {json.dumps(os.path.join(root, 'probe.d'))}",
        f"verify_dir: {json.dumps(os.path.join(root, 'verify.d'))}",
        f"sheet_dir: {json.dumps(root)}",
    ]
    return "\n".join(lines) + "\n"


def _write_private(path: str, text: str) -> None:
    """Write ``text`` to ``path`` (mode 0600) whole: into a new file beside it, then renamed
    over it. A client reading the session file as a controller starts sees the old file or
    the new one, never an empty or half-written one; whatever was at ``path`` (a FIFO that an
    ``open`` for writing would block on) is replaced, not opened. A symlink is written
    through (its target is replaced)."""
    target = os.path.realpath(path)
    folder = os.path.dirname(target) or "."
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{os.path.basename(target)}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _read_regular(path: str) -> str:
    """The text of the regular file ``path``; ``OSError`` for anything else (a FIFO is not
    opened for a blocking read, a directory is not read)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"not a regular file ({_file_kind(os.fstat(fd).st_mode)})")
        return f.read().decode("utf-8")


def _file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a file"


def _remove_session(path: str) -> None:
    """Remove the session file if it is still ours (a second sim controller replaced it)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        if json.loads(_read_regular(path)).get("pid") != os.getpid():
            return
        os.unlink(path)


def _parse_listen(listen: str) -> tuple[str, int]:
    from fleet_trio.edge import is_loopback_host, split_host_port

    try:
        host, port_text = split_host_port(listen)
        port = int(port_text)
    except ValueError as exc:
        raise SimCliError(f"--listen {listen!r}: {exc}", EXIT_USAGE) from None
    if not 0 <= port <= 65535:
        raise SimCliError(f"--listen {listen!r}: port must be 0-65535", EXIT_USAGE)
    if not is_loopback_host(host):
        raise SimCliError(f"--listen {listen!r}: the sim controller serves loopback only", 2)
    return host.removeprefix("[").removesuffix("]"), port


def cmd_controller(args: argparse.Namespace) -> int:
    try:
        host, port = _parse_listen(args.listen)
        if not 1 <= args.devices <= 16:
            raise SimCliError("--devices must be 1..16", EXIT_USAGE)
        root = os.path.join(state_dir(), "sim")
        config = os.path.abspath(args.worker_config or os.path.join(root, "worker.yaml"))
        try:
            return trio.run(_serve, args, host, port, root, config)
        except BaseExceptionGroup as group:  # raised inside the nursery: a group of one
            if isinstance(leaf := _alone(group), SimCliError):
                raise leaf from None
            raise
    except SimCliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.status


def _alone(exc: BaseException) -> BaseException:
    """``exc``, or the exception alone in (nested) groups of one."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


async def _serve(args: argparse.Namespace, host: str, port: int, root: str, config: str) -> int:
    from fleet_trio.sim.controller import SimController, serve_controller

    wtok = args.worker_token or "w-" + secrets.token_hex(8)
    ctok = args.client_token or "c-" + secrets.token_hex(8)
    ctrl = SimController(token=wtok, tokens={ctok: "client"}, startup_grace=0.0)
    session = session_path()

    def say(line: str) -> None:
        print(f"{PROG} controller: {line}", flush=True)

    async with trio.open_nursery() as nursery:
        try:
            url = await nursery.start(
                lambda task_status: serve_controller(
                    ctrl, host=host, port=port, task_status=task_status
                )
            )
        except (OSError, BaseExceptionGroup) as exc:
            bind_error = _alone(exc)
            if not isinstance(bind_error, OSError):
                raise
            why = bind_error.strerror or str(bind_error)
            raise SimCliError(f"cannot listen on {args.listen}: {why}") from None
        try:
            text = worker_yaml(url, wtok, args.host, args.devices, root)
            await trio.to_thread.run_sync(_write_private, config, text)
            for folder in ("probe.d", "verify.d"):  # the worker.yaml names them: they exist
                await trio.to_thread.run_sync(
                    functools.partial(os.makedirs, os.path.join(root, folder), exist_ok=True)
                )
            info = {
                "url": url,
                "client_token": ctok,
                "worker_token": wtok,
                "worker_config": config,
                "pid": os.getpid(),
            }
            await trio.to_thread.run_sync(_write_private, session, json.dumps(info) + "\n")
        except OSError as exc:
            raise SimCliError(f"cannot write {exc.filename}: {exc.strerror}") from None
        say(f"serving on {url} (loopback only; Ctrl-C stops it)")
        say(f"worker token {wtok}, client token {ctok}")
        say(f"worker config: {config}  (fleet-trio worker -c {config})")
        try:
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    break
        finally:
            _remove_session(session)
            nursery.cancel_scope.cancel()
    say("stopped")
    return 0


# -- the client commands ----------------------------------------------------------------------


def _read_session() -> dict[str, Any] | None:
    """The running sim controller's session record, or ``None`` when none is running (no
    file, or the file of a controller that was killed and could not remove it)."""
    path = session_path()
    try:
        info = json.loads(_read_regular(path))
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise SimCliError(f"{path}: not a regular file (a directory)") from None
    except (OSError, ValueError) as exc:
        raise SimCliError(f"{path}: {exc}") from None
    if not isinstance(info, dict):
        raise SimCliError(f"{path}: not a sim controller record")
    pid = info.get("pid")
    if isinstance(pid, int) and pid > 0:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None  # left behind by a controller that was killed
        except PermissionError:
            pass  # alive, another user's
    return info


async def _wait_for_session(seconds: float) -> dict[str, Any] | None:
    """:func:`_read_session`, waiting up to ``seconds`` for a controller that is starting;
    says so once on stderr."""
    told = False
    with trio.move_on_after(seconds):
        while (info := _read_session()) is None:
            if seconds <= 0:
                return None
            if not told:
                print(
                    f"{PROG}: waiting up to {seconds:g}s for a sim controller to start…",
                    file=sys.stderr,
                    flush=True,
                )
                told = True
            await trio.sleep(0.1)
        return info
    return None


def _no_controller(waited: float) -> str:
    waiting = f"waited {waited:g}s; " if waited else ""
    return f"no sim controller is running ({waiting}start `fleet-trio sim controller` first"


def _endpoint(args: argparse.Namespace, wait: float = 0.0) -> tuple[str, str]:
    """The controller's URL and client token: the flags, else the running sim's session
    (waiting up to ``wait`` seconds for one that is starting)."""
    url, token = args.url, args.token
    if not url or not token:
        info = trio.run(_wait_for_session, wait if not url else 0.0)
        if info is None:
            if not url:
                raise SimCliError(f"{_no_controller(wait)}, or pass --url and --token)")
            info = {}
        url = url or info.get("url", "")
        token = token or info.get("client_token", "")
    return str(url).rstrip("/"), str(token)


async def _request(method: str, url: str, token: str, body: Any = None) -> Any:
    import httpx

    try:
        async with httpx.AsyncClient(timeout=10.0) as client:
            r = await client.request(
                method, url, json=body, headers={"Authorization": f"Bearer {token}"}
            )
    except httpx.HTTPError as exc:
        raise SimCliError(f"cannot reach the sim controller at {url}: {exc}") from None
    if r.status_code >= 400:
        try:
            message = r.json().get("message") or r.json().get("error")
        except (ValueError, AttributeError):
            message = r.text.strip()[:200]
        raise SimCliError(f"{method} {url}: HTTP {r.status_code}: {message}")
    return r.json()


def _run_client(main: Any, args: argparse.Namespace, wait: float = 0.0) -> int:
    try:
        args.url, args.token = _endpoint(args, wait)
        result: int = trio.run(main, args)
    except SimCliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.status
    except KeyboardInterrupt:
        return 130
    return result


def cmd_worker(args: argparse.Namespace) -> int:
    """Replace this process by ``fleet-trio worker -c <the sim's worker.yaml>``."""
    try:
        info = trio.run(_wait_for_session, WAIT_FOR_CONTROLLER)
    except SimCliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130
    if info is None:
        print(f"error: {_no_controller(WAIT_FOR_CONTROLLER)})", file=sys.stderr)
        return EXIT_FAILED
    config = info.get("worker_config")
    if not isinstance(config, str) or not config:
        print(f"error: {session_path()}: no worker_config in it", file=sys.stderr)
        return EXIT_FAILED
    argv = [sys.executable, "-m", "fleet_trio", "worker", "-c", str(config)]
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execv(sys.executable, argv)
    except OSError as exc:
        print(f"error: cannot start the worker: {exc.strerror or exc}", file=sys.stderr)
    return EXIT_FAILED


def cmd_submit(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        print("error: sim submit: missing command (use -- CMD [ARG...])", file=sys.stderr)
        return EXIT_USAGE
    args.command = command
    return _run_client(_submit, args, WAIT_FOR_CONTROLLER)


async def _submit(args: argparse.Namespace) -> int:
    url, token = args.url, args.token
    body: dict[str, Any] = {
        "command": args.command,
        "submitter": f"{os.environ.get('USER', 'someone')}@fleet-trio-sim",
        "idempotency_key": str(uuid.uuid4()),
    }
    if args.device:
        body["device_id"] = args.device
    if args.max_runtime:
        body["max_runtime_seconds"] = args.max_runtime
    job, interrupted = await _unless_ctrl_c(_submit_waiting(url, token, body))
    if job is None:  # Ctrl-C before the controller answered: the POST may have reached it
        job = await _job_with_key(url, token, body["idempotency_key"])
        if job is None:
            print(f"{PROG}: interrupted: nothing was submitted (Ctrl-C)", file=sys.stderr)
            return 130
    job_id = job["id"]
    print(f"{PROG}: job {job_id} on {job['device_id']} ({job['state']})", file=sys.stderr)
    if args.detach and not interrupted:
        print(job_id)
        return 0
    if not interrupted:
        _, interrupted = await _unless_ctrl_c(_follow(url, token, job_id))
    if interrupted:
        # Ctrl-C: the job is not left running behind the user's back
        killed = (await _request("POST", f"{url}/v1/jobs/{job_id}/kill", token))["killed"]
        what = "killed" if killed else "had already ended"
        print(f"{PROG}: interrupted: job {job_id} {what} (Ctrl-C)", file=sys.stderr)
        return 130
    final = (await _request("GET", f"{url}/v1/jobs/{job_id}", token))["job"]
    state, code = final["state"], final.get("exit_code")
    if state != "succeeded":
        why = f": {final['reason']}" if final.get("reason") else ""
        print(f"{PROG}: job {job_id} {state}{why}", file=sys.stderr)
    if isinstance(code, int) and 0 <= code <= 255 and (code or state == "succeeded"):
        return code
    return 0 if state == "succeeded" else 1


async def _unless_ctrl_c(work: Awaitable[T]) -> tuple[T | None, bool]:
    """``work``'s result, or ``(None, True)`` when SIGINT came first (``work`` is cancelled).
    Its :class:`SimCliError` is raised as itself, never inside a group."""
    result: T | None = None
    interrupted = False
    failed: SimCliError | None = None
    with trio.open_signal_receiver(signal.SIGINT) as sigint:
        async with trio.open_nursery() as nursery:

            async def on_sigint() -> None:
                nonlocal interrupted
                async for _ in sigint:
                    interrupted = True
                    nursery.cancel_scope.cancel()
                    return

            nursery.start_soon(on_sigint)
            try:
                result = await work
            except SimCliError as exc:
                failed = exc
            nursery.cancel_scope.cancel()
    if failed is not None and not interrupted:
        raise failed
    return result, interrupted


async def _follow(url: str, token: str, job_id: str) -> None:
    """Print the job's output as the worker uploads it, until the job ends."""
    import httpx

    follow = f"{url}/v1/jobs/{job_id}/logs?follow=1"
    out_limiter = trio.CapacityLimiter(1)  # one write at a time: chunks keep their order
    try:
        async with (
            httpx.AsyncClient(timeout=httpx.Timeout(10.0, read=None)) as client,
            client.stream("GET", follow, headers={"Authorization": f"Bearer {token}"}) as r,
        ):
            async for chunk in r.aiter_bytes():  # a slow terminal: not on the loop
                await trio.to_thread.run_sync(_write_stdout, chunk, limiter=out_limiter)
    except httpx.HTTPError as exc:
        raise SimCliError(f"lost the job's log stream: {exc}") from None


async def _job_with_key(url: str, token: str, key: str) -> Any:
    """The controller's job submitted with idempotency ``key``, or ``None``."""
    jobs = (await _request("GET", f"{url}/v1/state", token)).get("jobs", [])
    return next((j for j in jobs if j.get("idempotency_key") == key), None)


def _write_stdout(data: bytes) -> None:
    sys.stdout.buffer.write(data)
    sys.stdout.flush()


async def _submit_waiting(url: str, token: str, body: dict[str, Any]) -> Any:
    """``POST /v1/jobs``; while no worker has registered yet (409 ``no_device``), wait for one
    (up to :data:`WAIT_FOR_WORKER` seconds), as a job queued for a device would."""
    told = False
    with trio.move_on_after(WAIT_FOR_WORKER):
        while True:
            try:
                return await _request("POST", f"{url}/v1/jobs", token, body)
            except SimCliError as exc:
                if "HTTP 409" not in str(exc):
                    raise
            if not told:
                print(f"{PROG}: waiting for a worker to register…", file=sys.stderr, flush=True)
                told = True
            await trio.sleep(0.25)
    raise SimCliError(
        f"no worker registered within {WAIT_FOR_WORKER:g}s (start one: fleet-trio sim worker)"
    )


async def _listing(args: argparse.Namespace, path: str, key: str) -> list[Any] | None:
    """The ``key`` list of ``GET path``; under ``--json`` it is printed and ``None`` returned."""
    items: list[Any] = (await _request("GET", f"{args.url}{path}", args.token))[key]
    if args.json:
        print(json.dumps(items, indent=2))
        return None
    return items


async def _jobs(args: argparse.Namespace) -> int:
    jobs = await _listing(args, "/v1/state", "jobs")
    if jobs is None:
        return 0
    print(f"{'JOB':36}  {'DEVICE':16}  {'STATE':9}  EXIT  COMMAND")
    for j in jobs:
        code = "" if j.get("exit_code") is None else str(j["exit_code"])
        cmd = " ".join(j["command"])
        print(f"{j['id']:36}  {j['device_id']:16}  {j['state']:9}  {code:4}  {cmd[:60]}")
    return 0


async def _devices(args: argparse.Namespace) -> int:
    devices = await _listing(args, "/v1/devices", "devices")
    if devices is None:
        return 0
    if not devices:
        print(f"{PROG}: no devices yet: start a worker (fleet-trio worker -c …)", file=sys.stderr)
    for d in devices:
        why = f" ({d['reason']})" if d.get("reason") else ""
        print(f"{d['id']:24}  {d['state']}{why}")
    return 0


__all__ = ["DEFAULT_LISTEN", "WAIT_FOR_WORKER", "add_to_sim", "session_path", "worker_yaml"]
