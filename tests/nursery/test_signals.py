"""The shutdown-signal service, in a real process of its own (a signal's default action must
not end the test runner).

A signal that arrives while the tree is closing is part of a shutdown already under way: it
must not kill the process with its default action. (Trio's own signal receiver re-delivers a
signal it has not read when it closes, which ended a node with exit code -15 when a second
SIGTERM landed as its tree closed.)
"""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import os, signal, trio
from fleet_trio.nursery.signals import serve_shutdown_signals

class Tree:
    def __init__(self): self.reasons = []
    def request_shutdown(self, reason='x'): self.reasons.append(reason)

async def main():
    tree = Tree()
    for _ in range(3):
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_shutdown_signals, tree)
            os.kill(os.getpid(), signal.SIGTERM)  # arrives; the service has not read it yet
            nursery.cancel_scope.cancel()
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_shutdown_signals, tree)
        os.kill(os.getpid(), signal.SIGTERM)
        with trio.fail_after(5):
            while not tree.reasons:
                await trio.lowlevel.checkpoint()
        nursery.cancel_scope.cancel()
    print("alive", tree.reasons[-1], flush=True)

trio.run(main)
"""


def test_a_signal_still_unread_when_the_service_closes_does_not_kill_the_process() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, (done.returncode, done.stderr)
    assert done.stdout.strip() == "alive SIGTERM"
