"""``fleet-trio demo``: a whole fleet on one box, no GPU, no configuration (docs/demo.md).

One process, one ``trio.run``: the simulated rc controller, a ``fleet-trio worker`` with two
fake devices, a ``fleet-trio node`` with two example task types, the simulated fleet
dispatcher, and fake GPUs (directories, see ``fleet_trio.gpu.fake``). Jobs are real child
processes. Everything the demo needs (node and worker YAML, the job scripts of ``jobs/``, a
verify hook) is written into a fresh temporary directory, so it runs from an installed wheel.

A scripted story then runs step by step; each step states the outcome it expects, observes
what actually happened (through the controller's records, the dispatcher's polls, the node's
job table or ``/proc``) and the demo exits 1 when any observation differs. Live output of
every job is followed over the real websocket tails and printed with the job's name in front.

The package: :mod:`~.model` (names and records), :mod:`~.files` (what is generated),
:mod:`~.console` (the terminal), :mod:`~.tails` (live tails), :mod:`~.story` (the steps),
:mod:`~.report` (the summary), :mod:`~.run` (the fleet and :func:`main`), :mod:`~.command`
(the parser, light).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "add_parser": "command",
    "cmd_demo": "command",
    "Console": "console",
    "open_console": "console",
    "want_colour": "console",
    "DemoFiles": "files",
    "node_yaml": "files",
    "prepare_files": "files",
    "worker_yaml": "files",
    "write_fake_gpu": "files",
    "write_worker_yaml": "files",
    "EXIT_INTERRUPTED": "model",
    "EXIT_MISMATCH": "model",
    "EXIT_OK": "model",
    "DemoOptions": "model",
    "Step": "model",
    "marked_processes": "report",
    "story_status": "report",
    "summary": "report",
    "main": "run",
    "run_demo": "run",
    "Story": "story",
}
"""Names imported on first use (PEP 562): the CLI imports the parser alone."""


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fleet_trio.sim.demo' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"fleet_trio.sim.demo.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "EXIT_INTERRUPTED",
    "EXIT_MISMATCH",
    "EXIT_OK",
    "Console",
    "DemoFiles",
    "DemoOptions",
    "Step",
    "Story",
    "add_parser",
    "cmd_demo",
    "main",
    "marked_processes",
    "node_yaml",
    "open_console",
    "prepare_files",
    "run_demo",
    "story_status",
    "summary",
    "want_colour",
    "worker_yaml",
    "write_fake_gpu",
    "write_worker_yaml",
]
