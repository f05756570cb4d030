"""The shutdown-signal service, in a real process of its own (a signal's default action must
not end the test runner).

A signal that arrives while the tree is closing is part of a shutdown already under way: it
must not kill the process with its default action. (Trio's own signal receiver re-delivers a
signal it has not read when it closes, which ended a node with exit code -15 when a second
SIGTERM landed as its tree closed.)
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

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


LATE = """
import os, signal, sys, trio
from fleet_trio.nursery.signals import serve_shutdown_signals

class Tree:
    def request_shutdown(self, reason='x'): pass

async def main(absorb):
    async with trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: serve_shutdown_signals(
                Tree(), absorb_after_close=absorb, task_status=task_status
            )
        )
        nursery.cancel_scope.cancel()
    os.kill(os.getpid(), signal.SIGTERM)  # after the tree: the process is on its way out
    os.kill(os.getpid(), signal.SIGINT)
    await trio.lowlevel.checkpoint()
    print("alive", flush=True)

trio.run(main, sys.argv[1] == "absorb")
"""


def test_a_signal_after_the_tree_closed_is_absorbed_in_a_process_whose_life_is_the_tree() -> None:
    absorbed = subprocess.run(
        [sys.executable, "-c", LATE, "absorb"], capture_output=True, text=True, timeout=30
    )
    assert (absorbed.returncode, absorbed.stdout.strip()) == (0, "alive"), absorbed.stderr
    # without it (an in-process harness), the handlers that were there before come back
    restored = subprocess.run(
        [sys.executable, "-c", LATE, "restore"], capture_output=True, text=True, timeout=30
    )
    assert restored.returncode == -signal.SIGTERM


def test_a_signal_ignored_at_start_is_served_and_jobs_get_the_default() -> None:
    """``cmd &`` in a script starts ``cmd`` with SIGINT ignored, and a parent may ignore SIGTERM
    too. As Go's ``signal.Notify`` does for the rc worker, fleet-trio serves both anyway, and its
    jobs start with the default dispositions, so a stop's SIGTERM ends them (143, at once) instead
    of waiting out the grace for a SIGKILL (137)."""
    argv = [sys.executable, "-m", "fleet_trio", "exec", "--max-runtime", "1s", "--grace", "20s"]
    argv += ["--json", "--", "sh", "-c", "grep SigIgn /proc/self/status; exec sleep 30"]
    started = time.monotonic()
    done = subprocess.run(
        ["sh", "-c", "trap '' INT TERM; exec \"$@\"", "sh", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    elapsed = time.monotonic() - started
    [mask] = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("SigIgn:")]
    ignored = int(mask, 16)  # bit N-1 is signal N; others (SIGHUP under nohup) are not ours
    assert ignored & (1 << (signal.SIGINT - 1) | 1 << (signal.SIGTERM - 1)) == 0, mask
    assert done.returncode == 143, (done.returncode, done.stderr)
    assert elapsed < 15, elapsed  # the SIGTERM worked: no 20 s grace
