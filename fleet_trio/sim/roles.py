"""The sim's role launcher: ``fleet-trio node`` / ``fleet-trio worker`` with test-only changes.

::

    python -m fleet_trio.sim.roles [--defect NAME]... [--worker-drain S] [--worker-kill-grace S]
        [--worker-hurry S] -- node|worker ARGS...

Everything after ``--`` is an ordinary ``fleet-trio`` command line, parsed by the production
parser and run by the production code (``fleet_trio.cli``); the launcher only injects what it
was asked for:

* ``--defect skip-interrupted`` (node): a job table whose ``mark_interrupted`` does nothing, so
  drain survivors are never marked ``error:"interrupted"``;
* ``--defect skip-sweep`` (worker): jobs run without the ``RC_JOB_ID`` sweep;
* ``--worker-drain`` / ``--worker-kill-grace`` / ``--worker-hurry``: the worker's shutdown
  drain, kill grace and report budget (the chaos scenarios shrink them so that a shutdown
  against a controller that never answers fits a short run).

The defects exist to prove that the chaos checker catches a broken build (docs/chaos.md). They
live here, in the sim, and nowhere else: the production code reads no variable or flag that
turns them on.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs

from fleet_trio import cli
from fleet_trio.logs import LogSetupError, setup_logging

if TYPE_CHECKING:
    from fleet_trio.node.jobs import JobStore
    from fleet_trio.worker.worker import Worker, WorkerTimings

NODE_DEFECTS = frozenset({"skip-interrupted"})
WORKER_DEFECTS = frozenset({"skip-sweep"})
DEFECTS = NODE_DEFECTS | WORKER_DEFECTS


# The node and the worker are imported only by the role that needs them (a process start
# costs what it imports).


def node_store(defects: frozenset[str]) -> type[JobStore]:
    """The job table class for a node with ``defects``."""
    from fleet_trio.node.jobs import JobStore

    if "skip-interrupted" not in defects:
        return JobStore

    class NoInterruptStore(JobStore):
        """Defect ``skip-interrupted``: drain survivors are not marked interrupted."""

        async def mark_interrupted(self) -> list[str]:
            return []

    return NoInterruptStore


def worker_class(defects: frozenset[str]) -> type[Worker]:
    """The worker class for a worker with ``defects``."""
    from fleet_trio import proc
    from fleet_trio.worker.client import Assignment
    from fleet_trio.worker.worker import Worker

    if "skip-sweep" not in defects:
        return Worker

    class NoSweepWorker(Worker):
        """Defect ``skip-sweep``: no ``RC_JOB_ID`` sweep after a job's group is gone."""

        def job_spec(self, a: Assignment) -> proc.JobSpec:
            return attrs.evolve(super().job_spec(a), sweep_job_id="")

    return NoSweepWorker


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m fleet_trio.sim.roles",
        description="Run a fleet-trio node or worker with test-only defects or timings "
        "(the chaos scenarios' launcher). Everything after -- is a fleet-trio command line.",
    )
    p.add_argument("--defect", action="append", default=[], choices=sorted(DEFECTS))
    p.add_argument("--worker-drain", type=float, default=None, metavar="S")
    p.add_argument("--worker-kill-grace", type=float, default=None, metavar="S")
    p.add_argument("--worker-hurry", type=float, default=None, metavar="S")
    return p


def worker_timings(
    drain: float | None, kill_grace: float | None, hurry: float | None
) -> WorkerTimings:
    """The production timings with the given ones replaced."""
    from fleet_trio.worker.worker import WorkerTimings

    given = {"shutdown_drain": drain, "kill_grace": kill_grace, "hurry_budget": hurry}
    changes: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    return attrs.evolve(WorkerTimings(), **changes)


def main(argv: Sequence[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    if "--" not in raw:
        _parser().error("missing -- before the fleet-trio command line")
    cut = raw.index("--")
    ours = _parser().parse_args(raw[:cut])
    parser = cli.build_parser()
    args = parser.parse_args(raw[cut + 1 :])
    # this process is the role's alone (as the console script's is): once the task tree has
    # closed, a late second SIGTERM is ignored rather than ending the exit with -15
    args.own_process = True
    try:
        setup_logging(args.log_level, args.log_format)
    except LogSetupError as exc:
        print(f"fleet-trio: {exc}", file=sys.stderr)
        return 2
    defects = frozenset(ours.defect)
    handler = getattr(args, "handler", None)
    if handler is cli._cmd_node:
        unknown = defects - NODE_DEFECTS
        if unknown:
            parser.error(f"not a node defect: {', '.join(sorted(unknown))}")
        status: int = cli._cmd_node(args, store_factory=node_store(defects))
        return status
    if handler is cli._cmd_worker:
        unknown = defects - WORKER_DEFECTS
        if unknown:
            parser.error(f"not a worker defect: {', '.join(sorted(unknown))}")
        cls = worker_class(defects)
        timings = worker_timings(ours.worker_drain, ours.worker_kill_grace, ours.worker_hurry)
        code: int = cli._cmd_worker(args, make_worker=functools.partial(cls, timings=timings))
        return code
    parser.error("the sim's role launcher runs node or worker")


if __name__ == "__main__":
    sys.exit(main())
