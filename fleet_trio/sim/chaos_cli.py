"""``fleet-trio sim chaos``: seeded chaos schedules against a fleet on this box (docs/chaos.md).

Only argparse is imported at module level; the fleet and the checker are imported when the
command runs.
"""

from __future__ import annotations

import argparse
import sys

EXIT_BROKEN = 1
"""A promise broke (or the fleet could not start)."""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``sim`` with its ``chaos`` subcommand."""
    sim = sub.add_parser(
        "sim",
        help="the simulation harness: a local rc controller to try the worker with "
        "(controller, worker, submit, jobs, devices) and chaos schedules against a fleet",
    )
    simsub = sim.add_subparsers(dest="sim_command", metavar="COMMAND", title="commands")
    p = simsub.add_parser(
        "chaos",
        help="run seeded fault schedules against 2 nodes and 2 workers, then check the promises",
        description=(
            "Start a fleet on loopback (the simulated rc controller, 2 workers with 2 fake "
            "devices each, 2 nodes with a fake GPU, the simulated dispatcher, a faulty link in "
            "front of every node and worker connection), play the schedule of each seed "
            "(dispatches, rc jobs, kills, a crash or stop and restart, a controller restart, "
            "link faults), let the fleet settle and check fleet-trio's promises. The schedule is "
            "a pure function of the seed and the duration. Exit 0 when every promise held, 1 "
            "otherwise (the failing seed and its schedule are printed)."
        ),
        epilog="See docs/chaos.md.",
    )
    p.add_argument("--seed", type=int, default=1, help="the first seed (default 1)")
    p.add_argument(
        "--duration",
        type=float,
        default=3.0,
        help="seconds of scheduled activity per seed (default 3)",
    )
    p.add_argument(
        "--seeds",
        type=int,
        default=1,
        metavar="N",
        help="run N seeds, SEED .. SEED+N-1, against one fleet (default 1)",
    )
    p.add_argument(
        "--quiet",
        action="store_true",
        help="print only the schedules, the verdicts and the summary (no step-by-step progress)",
    )
    p.add_argument(
        "--defect",
        action="append",
        default=[],
        choices=["skip-interrupted", "skip-sweep"],
        help=(
            "TEST-ONLY: start the nodes (skip-interrupted) or workers (skip-sweep) with this "
            "deliberate defect, to see the checker fail (repeatable)"
        ),
    )
    p.set_defaults(handler=_cmd_chaos)
    sim.set_defaults(handler=lambda args: _no_command(sim))


def _no_command(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _cmd_chaos(args: argparse.Namespace) -> int:
    if args.seeds < 1 or args.duration <= 0:
        print("fleet-trio sim chaos: --seeds must be >= 1 and --duration > 0", file=sys.stderr)
        return 2
    import trio

    return trio.run(_chaos, args)


async def _chaos(args: argparse.Namespace) -> int:
    import tempfile
    import time

    from fleet_trio.sim.chaos import (
        VERIFY_SCRIPT,
        Records,
        check_shutdowns,
        format_schedule,
        make_schedule,
        node_yaml,
        run_schedule,
        verdict,
    )
    from fleet_trio.sim.fleet import open_fleet

    def say(line: str) -> None:
        print(line, flush=True)

    progress = (lambda line: None) if args.quiet else (lambda line: say("  " + line))
    seeds = range(args.seed, args.seed + args.seeds)
    failed: list[int] = []
    checked_stops = 0
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fleet-trio-chaos-") as root:
        say("starting the fleet: controller, 2 workers x 2 devices, 2 nodes, dispatcher")
        try:
            async with open_fleet(
                root,
                node_yaml=node_yaml(),
                verify_scripts={"10-fake-vram": VERIFY_SCRIPT},
                defects=args.defect,  # TEST-ONLY: a deliberately broken build
            ) as fleet:
                for seed in seeds:
                    schedule = make_schedule(seed, args.duration)
                    say(format_schedule(seed, schedule))
                    result = await run_schedule(fleet, seed, schedule, say=progress)
                    say(verdict(result, args.duration))
                    if not result.ok:
                        failed.append(seed)
                checked_stops = len(fleet.shutdowns)
        except RuntimeError as exc:
            say(f"fleet-trio sim chaos: the fleet failed: {exc}")
            return EXIT_BROKEN
    final = Records(
        seed=0, began=0.0, settled=0.0, shutdowns=tuple(fleet.shutdowns[checked_stops:])
    )
    late = check_shutdowns(final)
    for v in late:
        say(f"final shutdown: {v}")
    took = time.monotonic() - began
    if late:
        say(f"the fleet's final shutdown broke a promise ({took:.1f}s)")
        return EXIT_BROKEN
    if failed:
        say(
            f"{len(failed)} of {len(seeds)} seed(s) broke a promise: {failed}; reproduce one with "
            f"fleet-trio sim chaos --seed {failed[0]} --duration {args.duration:g} ({took:.1f}s)"
        )
        return EXIT_BROKEN
    say(f"all {len(seeds)} seed(s) held every promise ({took:.1f}s)")
    return 0


__all__ = ["add_parser"]
