"""The demo's names and records: constants, the story's :class:`Step`, the running
:class:`Fleet`, an rc job's :class:`RcOutcome` and the command's :class:`DemoOptions`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import trio

if TYPE_CHECKING:
    from fleet_trio.node.server import RunningNode
    from fleet_trio.sim.controller import SimController
    from fleet_trio.sim.demo.files import DemoFiles
    from fleet_trio.sim.demo.tails import Tail
    from fleet_trio.sim.dispatcher import SimDispatcher
    from fleet_trio.worker.worker import Worker

PROG = "fleet-trio demo"
HOST = "demo-box"
"""The worker's host name: its devices are ``demo-box:gpu0`` and ``demo-box:gpu1``."""
NODE_ID = "demo-node"
RUN_MARKER = "FLEET_TRIO_DEMO_RUN"
"""Set in every job's environment (node and worker): the end-of-story leftover check looks
for live processes carrying it."""
LEAK_GIB = 6.0
VERIFY_LIMIT_GIB = 1.0
EXIT_OK = 0
EXIT_MISMATCH = 1
EXIT_INTERRUPTED = 130
SHUTDOWN_BOUND = 30.0
"""Seconds the whole fleet gets to shut down at the end (node drain + worker drain)."""
NODE_GPUS = 2
"""The demo node is a multi-GPU node: two fake devices, one pinned GPU job on each."""


@attrs.define
class Step:
    """One scripted step: what is expected, what was observed."""

    name: str
    where: str
    what: str
    expected: str
    observed: str = "not run"
    ok: bool = False
    status: str = "not run"
    """``ok`` | ``MISMATCH`` | ``skipped`` | ``not run``."""
    notes: list[str] = attrs.Factory(list)


@attrs.define
class Fleet:
    """The running fleet, as the story drives it."""

    files: DemoFiles
    ctrl: SimController
    worker: Worker
    node: RunningNode
    node_done: trio.Event
    disp: SimDispatcher
    nursery: trio.Nursery

    @property
    def worker_tail(self) -> str:
        assert self.worker.tail_url is not None
        return self.worker.tail_url

    def device(self, name: str) -> str:
        return f"{HOST}:{name}"


@attrs.define
class RcOutcome:
    job_id: str
    state: str
    exit_code: int | None
    reason: str
    tail: Tail


@attrs.frozen
class DemoOptions:
    keep_running: bool = False
    no_story: bool = False
    verbose: bool = False
