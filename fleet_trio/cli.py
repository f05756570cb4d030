"""``fleet-trio``: the one console entry point.

(Over 500 lines: every subcommand's parser and its small runner side by side, so that ``--help``
and the code it describes are read together; the work itself lives in the packages.)

Subcommands call into the packages; nothing else lives here. Today: ``exec`` (run one command
exactly as the worker runs a job, see ``docs/exec.md``), ``node`` (serve CONTRACT v2, see
``docs/node.md``), ``measure`` (seed the footprint store from the tasks' probes) and ``tail``
(follow a node job's live output, see ``docs/tail.md``).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import json
import logging
import os
import sys
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

import attrs
import trio

from fleet_trio import __version__
from fleet_trio.backoff import Backoff
from fleet_trio.durations import parse_duration_seconds
from fleet_trio.errors import DurationError
from fleet_trio.gpu.fake_cli import add_parser as add_fake_gpu_parser
from fleet_trio.logs import (
    LogSetupError,
    add_log_arguments,
    console,
    redact_secrets,
    setup_logging,
)
from fleet_trio.nursery import DEFAULT_SIGNALS, open_task_tree
from fleet_trio.proc.run import run
from fleet_trio.proc.spec import JobSpec, Result
from fleet_trio.proc.stop import StopToken

if TYPE_CHECKING:
    from fleet_trio.launch import EarlySignals
    from fleet_trio.worker.config import WorkerConfig

log = logging.getLogger("fleet_trio.cli")

PROG = "fleet-trio"
EXIT_USAGE = 2
"""Bad command line (argparse's own convention)."""
EXIT_NOT_STARTED = 127
"""The command could not be started (missing executable, bad cwd …), as a shell reports it."""
EXIT_INTERNAL = 1
"""A bug: the job task ended without a Result (its traceback is logged)."""
EXIT_BROKEN_PIPE = 141
"""Our stdout's reader went away (128 + SIGPIPE, as a shell reports it)."""
EXIT_INTERRUPTED = 130
"""SIGINT before the command installed its own handling (128 + SIGINT)."""


# -- terminal output without blocking the event loop ---------------------------------------------


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


class FdWriter:
    """A :class:`~fleet_trio.proc.sinks.Sink` onto one of our own file descriptors.

    Writes run in a worker thread (one at a time: ``CapacityLimiter(1)``, so chunks keep their
    order), because a terminal or a slow pipe reader blocks ``write(2)``; setting O_NONBLOCK on
    a descriptor shared with the shell is not an option. The child feels back-pressure exactly
    as with the worker's sinks. If the descriptor breaks (the reader went away: EPIPE), the rest
    is discarded and the job keeps running, as it would under the worker.
    """

    def __init__(self, fd: int, name: str) -> None:
        self.fd = fd
        self.name = name
        self.limiter = trio.CapacityLimiter(1)
        self.broken = False
        self.at_line_start = True

    async def write(self, data: bytes) -> None:
        if self.broken or not data:
            return
        try:
            # abandon_on_cancel: a write stuck on a reader that never reads must not wedge the
            # supervisor's teardown (the thread is a daemon; the process may exit under it).
            await trio.to_thread.run_sync(
                _write_all, self.fd, bytes(data), limiter=self.limiter, abandon_on_cancel=True
            )
        except OSError as exc:
            self.broken = True
            log.warning(
                "our %s is gone (%s); discarding the rest of the job's output", self.name, exc
            )
            return
        self.at_line_start = data.endswith(b"\n")


# -- the parser -------------------------------------------------------------------------------


def _add_exec(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "exec",
        usage=(
            "%(prog)s [-h] [--job-id ID] [--grace DUR] [--max-runtime DUR]\n"
            "       [--idle-timeout DUR] [--cwd DIR] [--json]\n"
            "       [--containment MODE] [--cgroup-base DIR]\n"
            "       [--log-level LEVEL] [--log-format FORMAT] -- CMD [ARG...]"
        ),
        help="run one command exactly as the worker runs a job",
        description=(
            "Run CMD as the worker runs a job: its own process group, stdin /dev/null, "
            "SIGTERM -> grace -> SIGKILL on a stop, the max-runtime/idle watchdog, and (with "
            "--job-id) the RC_JOB_ID sweep of escaped processes. The child's stdout and stderr "
            "stream live to ours; the exit status is the job's (128+n for a death by signal n; "
            "127 when it could not start; 2 for a bad command line); without --json, why a "
            "stopped job ended is one line on stderr ('killed: max_runtime exceeded (1s)'). "
            "SIGINT/SIGTERM/SIGHUP stop the job the way `rc kill` does."
        ),
        epilog="Durations are Go-style: 300ms, 10s, 1m30s, 2h. See docs/exec.md.",
    )
    p.add_argument(
        "--job-id",
        metavar="ID",
        default="",
        help="set RC_JOB_ID=ID in the job's environment and sweep processes carrying it "
        "after the job ends (escapees are killed and reported in sweep.found)",
    )
    p.add_argument(
        "--grace",
        metavar="DUR",
        help="SIGTERM -> SIGKILL window when the job is stopped (default 10s; <= 0 means 10s)",
    )
    p.add_argument(
        "--max-runtime",
        metavar="DUR",
        help="stop the job after DUR of wall-clock time (default: none)",
    )
    p.add_argument(
        "--idle-timeout",
        metavar="DUR",
        help="stop the job after DUR without output on stdout or stderr (default: none)",
    )
    p.add_argument(
        "--cwd",
        metavar="DIR",
        default="",
        help="working directory of the job (default: ours)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the Result as one JSON object on the last line of stdout, after all of "
        "the job's stdout: exit_code, killed, reason, error, sweep",
    )
    p.add_argument(
        "--containment",
        choices=("auto", "cgroup", "marker"),
        default="auto",
        help="how the job's processes are contained: cgroup (its own cgroup v2: every "
        "descendant is killed at the end and listed in sweep.found), marker (the RC_JOB_ID "
        "sweep), auto (cgroup where one can be made, else marker) (default: auto). "
        "See docs/containment.md",
    )
    p.add_argument(
        "--cgroup-base",
        metavar="DIR",
        default="",
        help="the cgroup v2 directory to make the job's cgroup in (default: our own cgroup)",
    )
    p.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="-- CMD ARG...",
        help="the command and its arguments; bare names are looked up on our PATH",
    )
    p.set_defaults(handler=_cmd_exec, serves_signals=True)


def _add_gpu_args(p: argparse.ArgumentParser) -> None:
    """The VRAM source and footprint-store flags shared by ``node`` and ``measure``."""
    p.add_argument(
        "--gpu",
        default="auto",
        choices=("auto", "nvml", "smi", "fake"),
        help="VRAM source (default auto: NVML, else nvidia-smi)",
    )
    p.add_argument(
        "--fake-gpu-dir",
        metavar="DIR",
        help="state directory of the fake GPU (--gpu fake; default $FLEET_TRIO_FAKE_GPU_DIR, "
        "else fake-gpu under $XDG_STATE_HOME/fleet-trio; created and initialised if missing)",
    )
    p.add_argument(  # multi-GPU
        "--fake-gpus",
        metavar="N",
        type=_fake_gpu_count,
        default=1,
        help="the fake GPU presents N devices, DIR/gpu0 .. DIR/gpu{N-1}, each with its own "
        "UUID (made when missing; --gpu fake; default 1: DIR is the device)",
    )
    p.add_argument("--footprints", metavar="PATH", help="footprint store file")


def _memory_budget_arg(text: str) -> int:
    from fleet_trio.memory import check_budget, parse_size

    try:
        return check_budget(parse_size(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_memory_budget(p: argparse.ArgumentParser, key: str) -> None:
    p.add_argument(
        "--memory-budget",
        metavar="SIZE",
        type=_memory_budget_arg,
        default=None,
        help=f"most bytes of kept job output in memory, all jobs together (e.g. 512MiB, 2GiB; "
        f"default: {key} in the config, else 1GiB); the oldest ended jobs' output goes first",
    )


def _fake_gpu_count(text: str) -> int:  # multi-GPU: --fake-gpus
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not 1 <= value <= 64:
        raise argparse.ArgumentTypeError(f"must be 1 to 64, got {value}")
    return value


def _add_node(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "node",
        help="serve the fleet-dispatcher CONTRACT v2 (health, dispatch, job status)",
        description=(
            "Serve GET /fleet/health, POST /fleet/dispatch and GET /fleet/jobs/{id} on "
            "127.0.0.1:18811 (by default). Dispatched jobs run the commands declared under "
            "tasks: in the YAML config. SIGTERM/SIGINT/SIGHUP drain: dispatches of new ids get 503 "
            "(known ids re-ack), running jobs get the drain timeout, survivors end error "
            '"interrupted", then polls alone are answered for up to poll_linger. Acked jobs '
            "are journaled: after a crash the restarted node answers their polls, ends the "
            "ones that were running interrupted and stops their processes. Refuses to "
            "start without a working GPU unless --gpu fake."
        ),
        epilog="See docs/node.md.",
    )
    p.add_argument("-c", "--config", metavar="FILE", help="node YAML (node: and tasks:)")
    p.add_argument("--listen", metavar="HOST:PORT", help="bind address (default 127.0.0.1:18811)")
    p.add_argument(
        "--listen-trusted-network",
        action="store_true",
        help="allow a non-loopback --listen (e.g. a tailnet address); the endpoints have no "
        "authentication unless --token is set",
    )
    p.add_argument("--node-id", metavar="ID", help="node id (default: config, then hostname)")
    _add_gpu_args(p)
    p.add_argument(
        "--token",
        metavar="TOKEN",
        default=None,
        help="require 'Authorization: Bearer TOKEN' on the three routes, the tail and /metrics "
        "(default: "
        "$FLEET_TRIO_TOKEN; unset = no auth, as CONTRACT v2)",
    )
    p.add_argument(
        "--allow-origin",
        metavar="ORIGIN",
        action="append",
        default=[],
        help="also serve browser pages from ORIGIN (scheme://host[:port]; repeatable; added "
        "to node.allow_origins). Requests carrying any other Origin get 403; see "
        "docs/security.md",
    )
    _add_memory_budget(p, "node.memory_budget")
    journal = p.add_mutually_exclusive_group()
    journal.add_argument(
        "--journal",
        metavar="PATH",
        help="job journal file (SQLite), so acked jobs survive a restart (default: config "
        "node.journal.path, else journal-NODE_ID.sqlite beside the footprint store)",
    )
    journal.add_argument(
        "--no-journal",
        action="store_true",
        help="keep jobs in memory only: a restart forgets every acked job",
    )
    p.add_argument(
        "--journal-moved",
        action="store_true",
        help="the journal was moved here (its state folder, with the node stopped): keep its "
        "jobs though it was created at another path (without it, such a journal is a copy and "
        "its jobs are dropped; docs/node.md)",
    )
    p.set_defaults(handler=_cmd_node, serves_signals=True)


def _add_measure(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "measure",
        help="seed the footprint store: run each task's probe once with VRAM sampling",
        description=(
            "Run the probe: payload of every configured task (or of each --task), in "
            "declaration order, through the node's executor with footprint sampling on, and "
            "record the peaks in the footprint store. Progress (one line per task) goes to "
            "stderr; the store's entries (health's model_footprints shape) are printed as "
            "JSON on stdout. Tasks without a probe are skipped with a note; a failure does "
            "not stop the others. Exit 0 if every probed task succeeded, 1 otherwise. "
            "Refuses to run without a working GPU unless --gpu fake."
        ),
        epilog="Do not measure while a node serves jobs on the same GPU. See docs/node.md.",
    )
    p.add_argument("-c", "--config", metavar="FILE", help="node YAML (node: and tasks:)")
    _add_gpu_args(p)
    p.add_argument(
        "--task",
        metavar="NAME",
        action="append",
        default=[],
        help="measure only this task (repeatable; default: every configured task)",
    )
    p.set_defaults(handler=_cmd_measure, serves_signals=True)


def _add_worker(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "worker",
        help="run as an rc worker (drop-in replacement for the Go `rc worker`)",
        description=(
            "Register with the rc controller named in the config, heartbeat, long-poll for "
            "assignments and run them. SIGTERM/SIGINT/SIGHUP: stop polling, stop running jobs "
            "(SIGTERM, SIGKILL after their grace), deliver their final logs and reports, run "
            "the release hooks, exit 0 (within 110.5 s with the defaults). --check validates "
            "the config and prints the resolved settings (JSON) without connecting. With "
            "tail_listen: HOST:PORT in the config (a key rc worker ignores), jobs' live output "
            "is served as the node's websocket GET /fleet/jobs/JOB_ID/tail (fleet-trio tail "
            "--url http://HOST:PORT JOB_ID), requiring tail_token: when set."
        ),
        epilog="See docs/worker.md and docs/worker-config.md.",
    )
    p.add_argument(
        "-c",
        "--config",
        metavar="FILE",
        default="/etc/rc/worker.yaml",
        help="worker YAML (default /etc/rc/worker.yaml)",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="validate the config, print the resolved settings and exit (no connection)",
    )
    p.add_argument(
        "--listen-trusted-network",
        action="store_true",
        help="allow a non-loopback tail_listen (e.g. a tailnet address); the live log tail "
        "has no authentication unless tail_token is set",
    )
    p.add_argument(
        "--allow-origin",
        metavar="ORIGIN",
        action="append",
        default=[],
        help="also serve the tail listener to browser pages from ORIGIN (scheme://host[:port]; "
        "repeatable; added to tail_allow_origins). Any other Origin gets 403; see "
        "docs/security.md",
    )
    _add_memory_budget(p, "memory_budget")
    p.set_defaults(handler=_cmd_worker, serves_signals=True)


HARNESS_COMMANDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "sim": (
        "the simulation harness: a local rc controller to try the worker with "
        "(controller, worker, submit, jobs, devices) and chaos schedules against a fleet",
        (
            "fleet_trio.sim.chaos_cli:add_parser",  # fleet-trio sim chaos (docs/chaos.md)
            "fleet_trio.sim.controller_cli:add_to_sim",  # sim controller|submit|jobs|devices
        ),
    ),
    "demo": (  # docs/demo.md
        "a whole fleet on one box: controller, worker, node, dispatcher, real jobs",
        ("fleet_trio.sim.demo.command:add_parser",),
    ),
}
"""Commands whose parsers live in the simulation harness (``fleet_trio.sim``): the one-line
help shown by ``fleet-trio --help``, then the functions that register the full parser. They
are imported only when the command line names the command, so ``--help`` and the production
commands never load the harness (tests/test_help.py checks that the two help lines agree)."""


def _add_harness(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    full: Collection[str] | None,
) -> None:
    help_line, registrars = HARNESS_COMMANDS[name]
    if full is not None and name not in full:
        sub.add_parser(name, help=help_line, add_help=False)  # a stand-in: never run
        return
    for target in registrars:
        module, function = target.split(":")
        getattr(importlib.import_module(module), function)(sub)


def build_parser(full: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The whole command line. ``full``: the harness commands (:data:`HARNESS_COMMANDS`) to
    register in full, the others being stand-ins with the same one-line help (default: all)."""
    parser = argparse.ArgumentParser(
        prog=PROG, description="A GPU fleet agent on Trio: fleet node and drop-in rc worker."
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="subcommand", metavar="COMMAND", title="commands")
    _add_exec(sub)
    _add_node(sub)
    _add_measure(sub)
    _add_worker(sub)
    _add_tail(sub)  # fleet-trio tail (docs/tail.md)
    _add_harness(sub, "sim", full)
    _add_harness(sub, "demo", full)
    add_fake_gpu_parser(sub)  # fleet-trio fake-gpu (docs/gpu.md)
    add_log_arguments(parser)  # after every subcommand: they all get --log-level/--log-format
    return parser


# -- fleet-trio exec ----------------------------------------------------------------------------


class UsageError(Exception):
    """A one-line command-line error; ``main`` prints it and exits 2."""


def _duration(flag: str, text: str | None) -> float:
    if text is None:
        return 0.0
    try:
        return parse_duration_seconds(text)
    except DurationError as exc:
        raise UsageError(f"{flag}: {exc}") from None


def exec_spec(args: argparse.Namespace, stderr_sink: FdWriter | None = None) -> JobSpec:
    """The JobSpec for ``fleet-trio exec`` (raises :class:`UsageError` on bad input)."""
    grace = _duration("--grace", args.grace)
    max_runtime = _duration("--max-runtime", args.max_runtime)
    idle_timeout = _duration("--idle-timeout", args.idle_timeout)
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise UsageError("empty command")
    env = {"RC_JOB_ID": args.job_id} if args.job_id else {}
    return JobSpec(
        containment=getattr(args, "containment_backend", None),
        cgroup_key=args.job_id or "run",
        command=command,
        cwd=args.cwd,
        env=env,
        grace_ceiling=grace,
        max_runtime=max_runtime,
        idle_timeout=idle_timeout,
        stderr_sink=stderr_sink,
        sweep_job_id=args.job_id,
    )


def exit_status(result: Result) -> int:
    """The job's exit status; 127 when it never started (``exit_code == -1``)."""
    return EXIT_NOT_STARTED if result.exit_code < 0 else result.exit_code


EXEC_DRAIN_SLACK = 10.0
"""Seconds beyond the grace the task tree's drain waits for the stopped job (straggler wait,
bounded pipe wait and the RC_JOB_ID sweep all fit in it)."""


@attrs.define
class _JobBox:
    """Where the job task leaves its Result for the body of the tree."""

    result: Result | None = None
    done: trio.Event = attrs.field(factory=trio.Event)


async def _exec_job(spec: JobSpec, sink: FdWriter, stop: StopToken, box: _JobBox) -> None:
    try:
        # Shielded from the tree's cancel of the jobs scope (a second signal, an overrun
        # drain): the stop token is always set first (on_stop_accepting), and run()'s teardown
        # is the same SIGTERM → grace → SIGKILL path either way, already shielded inside run();
        # the shield only keeps the Result, so it is always printed.
        with trio.CancelScope(shield=True):
            box.result = await run(spec, sink, stop)
    finally:
        box.done.set()


async def _reap_stale_exec_cgroups(backend: object) -> None:
    """An ``exec`` killed with ``kill -9`` left its job cgroup (and what ran in it): the next
    exec in the same cgroup kills and removes it, and says so (docs/containment.md)."""
    from fleet_trio.proc.containment import CgroupContainment, reap_stale_exec_cgroups

    if isinstance(backend, CgroupContainment):
        for line in await reap_stale_exec_cgroups(backend):
            logging.getLogger("fleet_trio.proc").warning("exec: %s", line)


async def _exec(args: argparse.Namespace) -> int:
    out = FdWriter(sys.stdout.fileno(), "stdout")
    err = FdWriter(sys.stderr.fileno(), "stderr")
    spec = exec_spec(args, stderr_sink=err)
    stop = StopToken()
    box = _JobBox()
    await _reap_stale_exec_cgroups(args.containment_backend)
    # SIGINT/SIGTERM/SIGHUP → request_shutdown → on_stop_accepting sets the job's stop token, so the
    # job takes run()'s cancellation path and still ends in an honest "cancelled" Result.
    async with open_task_tree(
        drain=spec.grace + EXEC_DRAIN_SLACK,
        kill_grace=spec.grace,
        on_stop_accepting=stop.set,
        signals=DEFAULT_SIGNALS,
        absorb_late_signals=getattr(args, "own_process", False),
    ) as tree:
        tree.start_job(_exec_job, spec, out, stop, box, name="exec")
        with trio.CancelScope() as waiting:
            tree.cancel_on_shutdown(waiting)  # on a signal, the drain waits for the job
            await box.done.wait()
    result = box.result
    if result is None:  # run() raised: already logged with its traceback by the tree
        await err.write(f"{PROG} exec: internal error: the job ended without a result\n".encode())
        return EXIT_INTERNAL
    if result.err is not None:
        await err.write(f"{PROG} exec: {result.err}\n".encode())
    elif result.reason and not args.json:  # 143 alone does not say "timed out"
        await err.write(f"{PROG} exec: killed: {result.reason}\n".encode())
    if args.json:
        report = result.to_json()
        if not args.job_id:  # no sweep was asked for: nothing to call clean or dirty
            report["sweep"] = None
        line = json.dumps(report, separators=(", ", ": "))
        prefix = "" if out.at_line_start else "\n"
        await out.write(f"{prefix}{line}\n".encode())
    return exit_status(result)


def _cmd_exec(args: argparse.Namespace) -> int:
    try:
        # Validate before starting trio: usage errors never spawn anything.
        exec_spec(args)
    except UsageError as exc:
        print(f"{PROG} exec: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    from fleet_trio.proc.containment import ContainmentError, choose_for_exec, describe

    try:
        args.containment_backend = choose_for_exec(
            getattr(args, "containment", "auto"), base=getattr(args, "cgroup_base", "")
        )
    except ContainmentError as exc:
        print(f"{PROG} exec: {exc}", file=sys.stderr)
        return EXIT_NOT_STARTED
    logging.getLogger("fleet_trio.proc").debug("%s", describe(args.containment_backend))
    return trio.run(_exec, args)


# -- fleet-trio node ----------------------------------------------------------------------------


def _export_fake_gpu_dir(args: argparse.Namespace) -> str | None:
    """With ``--gpu fake``, jobs see the same fake GPU through ``FLEET_TRIO_FAKE_GPU_DIR``
    (the variable its helper command and job scripts read). The directory (default: under the
    state directory) is created and initialised when needed; returns the line that says so.
    Raises ``ConfigError``."""
    if args.gpu != "fake":
        return None
    from fleet_trio.gpu.fake_cli import prepare_fake_gpu

    count = getattr(args, "fake_gpus", 1) or 1
    args.fake_gpu_dir, note = prepare_fake_gpu(args.fake_gpu_dir, count)
    os.environ["FLEET_TRIO_FAKE_GPU_DIR"] = args.fake_gpu_dir
    return note


def _cmd_node(args: argparse.Namespace, **serve_kw: Any) -> int:
    """``fleet-trio node``. ``serve_kw`` goes to ``serve_node`` (the sim's role launcher,
    ``fleet_trio.sim.roles``, passes its test-only defects this way)."""
    from fleet_trio.errors import ConfigError, NodeStartError
    from fleet_trio.node.config import NodeConfig, load_config

    def say(line: str) -> None:
        console(f"{PROG} node: {line}", event=line, logger="fleet_trio.node")

    try:
        config = load_config(args.config) if args.config else NodeConfig()
        if note := _export_fake_gpu_dir(args):
            say(note)
        # the web stack is loaded once the config is known good: a config error answers in
        # about a third of the time
        from fleet_trio.node.server import NodeOptions, serve_node

        options = NodeOptions(
            listen=args.listen,
            trusted_network=args.listen_trusted_network,
            node_id=args.node_id,
            gpu=args.gpu,
            fake_gpu_dir=args.fake_gpu_dir,
            fake_gpus=args.fake_gpus,
            footprints=args.footprints,
            memory_budget=args.memory_budget,
            token=args.token if args.token is not None else os.environ.get("FLEET_TRIO_TOKEN"),
            token_from="--token" if args.token is not None else "$FLEET_TRIO_TOKEN",
            allow_origins=tuple(args.allow_origin),
            journal=args.journal,
            no_journal=args.no_journal,
            journal_moved=args.journal_moved,
        )
        redact_secrets(options.token)
        serve = functools.partial(
            serve_node,
            config,
            options,
            announce=say,
            absorb_late_signals=getattr(args, "own_process", False),
            **serve_kw,
        )
        trio.run(serve)
    except (ConfigError, NodeStartError) as exc:
        console(f"error: {exc}", event=str(exc), logger="fleet_trio.node", level=logging.ERROR)
        return 1
    return 0


# -- fleet-trio measure -------------------------------------------------------------------------


def _cmd_measure(args: argparse.Namespace) -> int:
    from fleet_trio.errors import ConfigError, NodeStartError
    from fleet_trio.node.config import NodeConfig, load_config

    def say(line: str) -> None:
        print(f"[{PROG} measure] {line}", file=sys.stderr, flush=True)

    try:
        config = load_config(args.config) if args.config else NodeConfig()
        if note := _export_fake_gpu_dir(args):
            say(note)
        from fleet_trio.node.measure import MeasureOptions, MeasureUsageError, measure

        options = MeasureOptions(
            gpu=args.gpu,
            fake_gpu_dir=args.fake_gpu_dir,
            fake_gpus=args.fake_gpus,
            footprints=args.footprints,
            tasks=tuple(args.task),
        )
        try:
            report = trio.run(
                functools.partial(measure, config, options, say=say, handle_signals=True)
            )
        except MeasureUsageError as exc:
            print(f"{PROG} measure: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
    except (ConfigError, NodeStartError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(report.entries_json(), flush=True)
    return 0 if report.ok else 1


# -- fleet-trio worker --------------------------------------------------------------------------


def _with_allowed_origins(config: WorkerConfig, extra: list[str]) -> WorkerConfig:
    """``--allow-origin`` added to ``tail_allow_origins`` (a bad value: ConfigError)."""
    if not extra:
        return config
    from fleet_trio.edge import OriginError, check_allowed_origin
    from fleet_trio.errors import ConfigError

    for origin in extra:
        try:
            check_allowed_origin(origin)
        except OriginError as exc:
            raise ConfigError(f"--allow-origin: {exc}") from None
    return attrs.evolve(config, tail_allow_origins=(*config.tail_allow_origins, *extra))


def _cmd_worker(args: argparse.Namespace, make_worker: Callable[..., Any] | None = None) -> int:
    """``fleet-trio worker``. ``make_worker`` builds the :class:`Worker` (the sim's role
    launcher, ``fleet_trio.sim.roles``, passes a deliberately broken one)."""
    from fleet_trio.errors import ConfigError
    from fleet_trio.worker.config import check_tail_listen, load_worker_config

    try:
        config = load_worker_config(args.config)
        if args.memory_budget is not None:
            config = attrs.evolve(config, memory_budget=args.memory_budget)
        redact_secrets(config.token, config.tail_token)
        config = _with_allowed_origins(config, args.allow_origin)
        check_tail_listen(config, args.listen_trusted_network)
    except ConfigError as exc:
        console(f"error: {exc}", event=str(exc), logger="fleet_trio.worker", level=logging.ERROR)
        return 1
    if args.check:
        from fleet_trio.proc.containment import ContainmentError, choose_for_agent, describe
        from fleet_trio.worker.check import check_paths

        problems = check_paths(config)
        for problem in problems:
            level = "error" if problem.error else "warning"
            print(f"{level}: {args.config}: {problem.key}: {problem.message}", file=sys.stderr)
        try:
            chosen = choose_for_agent(config.containment, base=config.cgroup_base, dry_run=True)
            print(f"info: {describe(chosen)}", file=sys.stderr)
        except ContainmentError as exc:
            print(f"error: {args.config}: containment: {exc}", file=sys.stderr)
            problems.append(None)  # type: ignore[arg-type]
        print(json.dumps(config.to_summary(), indent=2), flush=True)
        return 1 if any(p is None or p.error for p in problems) else 0
    if config.tail_listen and args.listen_trusted_network:
        who = (
            "tail_token is required"
            if config.tail_token
            else "any host that can reach it can read every job's output"
        )
        warning = f"--listen-trusted-network: live log tail on {config.tail_listen}; {who}"
        console(
            f"{PROG} worker: WARNING: {warning}",
            event=warning,
            logger="fleet_trio.worker",
            level=logging.WARNING,
        )
    from fleet_trio.proc.containment import ContainmentError, choose_for_agent
    from fleet_trio.worker.worker import Worker, serve_worker

    worker = (make_worker or Worker)(config, tail_trusted_network=args.listen_trusted_network)
    try:  # before the task tree: a cgroup that cannot be had fails the start, in one line
        worker.containment = choose_for_agent(config.containment, base=config.cgroup_base)
    except ContainmentError as exc:
        console(f"error: {exc}", event=str(exc), logger="fleet_trio.worker", level=logging.ERROR)
        return 1
    # the signals are served by the worker's task tree, from the moment it opens to its close
    trio.run(
        functools.partial(
            serve_worker,
            worker,
            signals=DEFAULT_SIGNALS,
            absorb_late_signals=getattr(args, "own_process", False),
        )
    )
    return 0


# -- fleet-trio tail (docs/tail.md) -------------------------------------------------------------

TAIL_DEFAULT_URL = "ws://127.0.0.1:18811"
TAIL_RETRIES = 5
"""Reconnection attempts in a row (without a message in between) before giving up."""
TAIL_BACKOFF_MAX = 8.0
EXIT_TAIL_FAILED = 2
"""The tail itself failed: bad usage, refused, an ``error`` message, connection lost."""
TAIL_MAX_MESSAGE = 4 << 20
TAIL_CONNECT_TIMEOUT = 4.0
"""Connecting (TCP and the websocket handshake) gives up after this: a node that is not there
fails the tail in well under 5 s."""
TAIL_DISCONNECT_TIMEOUT = 2.0


def _add_tail(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "tail",
        help="follow a job's live stdout/stderr on a node or a worker's tail listener",
        description=(
            "Follow the live output of JOB_ID on a fleet-trio node or a worker's tail_listen "
            "listener (websocket GET /fleet/jobs/JOB_ID/tail): its stdout goes to our stdout "
            "and its stderr to our stderr, as raw bytes, as they arrive. If the connection "
            "drops, reconnect from the last offset received (up to --retries attempts in a "
            f"row without progress, backing off 0.5 s to {TAIL_BACKOFF_MAX:g} s). Exit status: "
            "the job's exit code once it ends (a failed "
            "job without one: 1; its reason is printed on stderr); 2 when the tail itself "
            "fails (refused, unknown job, bad arguments, connection lost for good)."
        ),
        epilog="See docs/tail.md.",
    )
    p.add_argument(
        "--url",
        default=TAIL_DEFAULT_URL,
        help=f"the node's (or worker listener's) base URL (default {TAIL_DEFAULT_URL}; "
        "http:// and https:// are taken as ws:// and wss://)",
    )
    p.add_argument(
        "--token",
        metavar="TOKEN",
        default=None,
        help="bearer token of the node or the worker's tail_token "
        "(default: $FLEET_TRIO_TOKEN; unset = none)",
    )
    p.add_argument(
        "--from",
        dest="start",
        metavar="start|now|N",
        default="start",
        help="where to begin: start (the beginning of the log), now (only new output) or "
        "byte offset N (default start)",
    )
    p.add_argument(
        "--streams",
        metavar="LIST",
        default="stdout,stderr",
        help="comma-separated streams to follow: stdout, stderr (default stdout,stderr)",
    )
    p.add_argument(
        "--retries",
        metavar="N",
        type=int,
        default=TAIL_RETRIES,
        help=f"reconnection attempts in a row without progress before giving up (default "
        f"{TAIL_RETRIES})",
    )
    p.add_argument("job_id", metavar="JOB_ID", help="the job to follow")
    p.set_defaults(handler=_cmd_tail)


def tail_exit_status(state: str, exit_code: int | None) -> int:
    """Our exit status for a job's end: its exit code; a failed job without one (or with 0): 1.
    Success is ``done`` (a node job) or ``succeeded`` (a worker job)."""
    valid = exit_code is not None and 0 <= exit_code <= 255
    if state in ("done", "succeeded"):
        return exit_code if valid and exit_code is not None else 0
    return exit_code if valid and exit_code else 1


def _rejection(exc: Exception) -> str:
    from fleet_trio.inputs import printable

    status = getattr(exc, "status_code", "?")
    body = getattr(exc, "body", None) or b""
    try:
        message = json.loads(body).get("error", "")
    except (ValueError, AttributeError):
        message = body.decode("utf-8", errors="replace").strip()
    if not isinstance(message, str):  # whatever the server sent
        message = json.dumps(message)
    message = printable(" ".join(message.split()), limit=200)  # one line, bounded, escaped
    return f"refused: HTTP {status}" + (f" ({message})" if message else "")


async def _tail(args: argparse.Namespace) -> int:
    from trio_websocket import ConnectionRejected

    from fleet_trio.inputs import printable
    from fleet_trio.logbus.bus import End, Output, Skipped
    from fleet_trio.logbus.tail import (
        TailProtocolError,
        TailQuery,
        loads,
        parse_start,
        parse_streams,
    )
    from fleet_trio.logbus.tail_client import LOST, connection_problem, follow, tail_url

    out = FdWriter(sys.stdout.fileno(), "stdout")
    err = FdWriter(sys.stderr.fileno(), "stderr")

    async def say(line: str) -> None:
        prefix = "" if err.at_line_start else "\n"
        await err.write(f"{prefix}{PROG} tail: {line}\n".encode())

    streams = parse_streams(args.streams)
    position = parse_start(args.start)
    token = args.token if args.token is not None else os.environ.get("FLEET_TRIO_TOKEN")
    redact_secrets(token)
    headers = [(b"Authorization", f"Bearer {token}".encode())] if token else []
    failures = 0
    established = trio.Event()
    """A stream was open once: only then is a lost connection worth reconnecting."""

    furthest = -1
    """The furthest offset reached: only passing it counts as progress."""

    async def on_message(text: str | bytes) -> int | None:
        nonlocal failures, position, furthest
        event = loads(text)
        if isinstance(event, Output):
            await (out if event.stream == "stdout" else err).write(event.data)
            position = event.offset + len(event.data)
        elif isinstance(event, Skipped):
            position = event.offset + event.nbytes
            await say(f"{event.nbytes} byte(s) skipped at offset {event.offset}")
        elif isinstance(event, End):
            if event.reason or event.state != "done":
                # the server's text (a worker's reason may hold hook output): one line, escaped
                why = f": {printable(event.reason)}" if event.reason else ""
                await say(f"job {args.job_id} ended {printable(event.state)}{why}")
            return tail_exit_status(event.state, event.exit_code)
        else:
            await say(f"error: {printable(event.message)}")
            return EXIT_TAIL_FAILED
        if isinstance(position, int) and position > furthest:
            furthest = position  # progress past anything seen: a server that sends nothing
            failures = 0  # new (or goes back and forth) cannot keep us forever
        return None

    while True:
        url = tail_url(args.url, args.job_id, TailQuery(position, streams).to_params())
        try:
            return await follow(
                url,
                on_message,
                headers=headers,
                max_message_size=TAIL_MAX_MESSAGE,
                connect_timeout=TAIL_CONNECT_TIMEOUT,
                disconnect_timeout=TAIL_DISCONNECT_TIMEOUT,
                on_open=established.set,
            )
        except ConnectionRejected as exc:
            await say(f"error: {_rejection(exc)}")
            return EXIT_TAIL_FAILED
        except TailProtocolError as exc:
            await say(f"error: bad message from the node: {exc}")
            return EXIT_TAIL_FAILED
        except LOST as exc:
            problem = connection_problem(exc)
        if not established.is_set():
            base = tail_url(args.url, "", {}).split("/fleet/")[0]
            await say(f"error: cannot connect to {base}: {problem}")
            return EXIT_TAIL_FAILED
        failures += 1
        if failures > args.retries:
            await say(f"error: giving up after {failures - 1} reconnection attempt(s): {problem}")
            return EXIT_TAIL_FAILED
        delay = Backoff.exponential(0.5, TAIL_BACKOFF_MAX).delay(failures - 1)
        await say(
            f"connection lost ({problem}); reconnecting from {position} in {delay:g}s "
            f"(attempt {failures}/{args.retries})"
        )
        await trio.sleep(delay)


def check_tail_url(base: str) -> None:
    """Raise ``ValueError`` for a ``--url`` that cannot name a node (scheme, host, port)."""
    from urllib.parse import urlsplit

    text = base.strip()
    parts = urlsplit(text if "://" in text else "ws://" + text)
    if parts.scheme.lower() not in ("ws", "wss", "http", "https"):
        raise ValueError(f"--url {base!r}: want ws://, wss://, http:// or https://HOST:PORT")
    if not parts.hostname:
        raise ValueError(f"--url {base!r}: no host")
    try:
        parts.port  # noqa: B018  (raises for a port out of 0-65535 or not a number)
    except ValueError as exc:
        raise ValueError(f"--url {base!r}: {exc}") from None


def _cmd_tail(args: argparse.Namespace) -> int:
    from fleet_trio.logbus.tail import TailProtocolError, parse_start, parse_streams

    try:
        parse_start(args.start)
        parse_streams(args.streams)
        if args.retries < 0:
            raise TailProtocolError("--retries must be >= 0")
        check_tail_url(args.url)
    except ValueError as exc:  # TailProtocolError is one
        print(f"{PROG} tail: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return trio.run(_tail, args)  # ^C: run_handler's EXIT_INTERRUPTED (130)


# -- end of fleet-trio tail ---------------------------------------------------------------------


# -- main -------------------------------------------------------------------------------------


def parse_command_line(argv: list[str]) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """Parse ``argv``, importing a harness command's parser only when it is the command."""
    parser = build_parser(full=())
    known, _ = parser.parse_known_args(argv)  # --help, --version and errors end here as ever
    command = getattr(known, "subcommand", None)
    if command in HARNESS_COMMANDS:
        parser = build_parser(full=(command,))
    return parser, parser.parse_args(argv)


def main(
    argv: list[str] | None = None, *, own_process: bool = False, early: EarlySignals | None = None
) -> int:
    """Run one command. ``own_process``: this process is the command's alone (the console
    script, ``python -m fleet_trio``): a long-running command then ignores its shutdown
    signals once its task tree has closed, rather than dying of a late second signal on its
    way out. An in-process caller (a test) keeps its own signal handlers. ``early``: the
    entry point's signal handler (``fleet_trio.launch``); a command whose task tree does not
    serve the signals gets the previous handlers back before it runs."""
    parser, args = parse_command_line(list(argv) if argv is not None else sys.argv[1:])
    args.own_process = own_process
    if early is not None and not getattr(args, "serves_signals", False):
        early.release()
    try:
        setup_logging(args.log_level, args.log_format)  # docs/logging.md
    except LogSetupError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        print(f"{PROG}: error: no command given (see the commands above)", file=sys.stderr)
        return EXIT_USAGE
    return run_handler(handler, args)


def entry() -> int:
    """The console script of earlier installs; today's is ``fleet_trio.launch:entry``."""
    from fleet_trio.launch import entry as launch

    return launch()


def _save_traceback(exc: BaseException) -> str:
    """Write ``exc``'s traceback under the state directory; say where (or how to see it)."""
    import time
    import traceback

    from fleet_trio.statedir import state_dir

    path = os.path.join(state_dir(), "crash", f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.txt")
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(f"{PROG} {__version__}\n")  # not argv: it may carry a --token
            f.write("".join(traceback.format_exception(exc)))
    except OSError:
        return "the traceback that --log-level DEBUG prints"
    return f"the traceback in {path}"


def run_handler(handler: Any, args: argparse.Namespace) -> int:
    """Run a subcommand; whatever it did not turn into its own one-line error becomes one
    ``error:`` line too (docs/troubleshooting.md), the traceback going to the DEBUG log."""
    try:
        status: int = handler(args)
    except BrokenPipeError:  # our reader went away (`… | head`): nothing left to say
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BaseException as exc:  # a bug, or an error no command anticipated
        interrupted, rest = (
            exc.split(KeyboardInterrupt) if isinstance(exc, BaseExceptionGroup) else (None, exc)
        )
        if interrupted is not None and rest is None:  # ^C inside a nursery arrives wrapped
            return EXIT_INTERRUPTED
        if not isinstance(exc, Exception):  # SystemExit, and the like: not ours
            raise
        log.debug("unhandled error", exc_info=True)
        text = " ".join(str(exc).split())[:300]
        where = _save_traceback(exc)
        print(
            f"error: internal error: {type(exc).__name__}: {text} (a bug: please report it "
            f"with {where})",
            file=sys.stderr,
        )
        return EXIT_INTERNAL
    return status


__all__ = [
    "HARNESS_COMMANDS",
    "FdWriter",
    "UsageError",
    "build_parser",
    "exec_spec",
    "exit_status",
    "main",
    "parse_command_line",
    "tail_exit_status",
]
