"""``fleet-trio demo``'s parser (light: the fleet is imported when the command runs)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from fleet_trio.sim.demo.model import HOST, DemoOptions

DESCRIPTION = (
    "Start a whole fleet in this one process, with no GPU and no configuration: the "
    "simulated rc controller, a fleet-trio worker with two fake devices "
    f"({HOST}:gpu0, {HOST}:gpu1) and its live tail listener, a fleet-trio node with two "
    "example task types (render, train) on a fake GPU, and the simulated fleet dispatcher. "
    "Then run a short scripted story with real child processes: node jobs that succeed and "
    "fail, the node's measured VRAM footprint, rc jobs that succeed, fail, get killed, time "
    "out, and escape their process group (swept), a verify failure that quarantines a "
    "device and an `rc clear` that returns it, and a node drain with a job in flight that "
    "ends 'interrupted'. Every job's live output is shown, prefixed with its name. Each step "
    "checks its outcome; the final table marks any step that did not go as expected. Takes "
    "about 20 seconds. Exit status: 0 when every step went as expected, 1 otherwise, 130 "
    "when interrupted. Configs and scripts are generated into a temporary directory, removed "
    "at exit."
)


def add_parser(sub: Any) -> None:
    """Register ``fleet-trio demo`` on the CLI's subparsers."""
    p = sub.add_parser(
        "demo",
        help="a whole fleet on one box: controller, worker, node, dispatcher, real jobs",
        description=DESCRIPTION,
        epilog="See docs/demo.md.",
    )
    p.add_argument(
        "--keep-running",
        action="store_true",
        help="after the story, leave the fleet up (the node drain step is skipped so the "
        "node stays up), print the URLs of the node's and the worker's browser tail pages "
        "(/fleet/ui) and wait for Ctrl-C, which shuts everything down cleanly (exit 0)",
    )
    p.add_argument(
        "--no-story",
        action="store_true",
        help="start the fleet but run no story (with --keep-running: a fleet to try "
        "commands against)",
    )
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="also show the components' own log lines on stderr (hidden by default, "
        "because the demo narrates what happens; an explicit --log-level shows them too)",
    )
    p.set_defaults(handler=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    options = DemoOptions(
        keep_running=bool(args.keep_running),
        no_story=bool(args.no_story),
        verbose=bool(args.verbose)
        or getattr(args, "log_level", None) is not None
        or bool(os.environ.get("FLEET_TRIO_LOG_LEVEL")),
    )
    from fleet_trio.sim.demo.run import main

    return main(options)
