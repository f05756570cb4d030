"""The sim's zygote (``fleet_trio.sim.zygote``): its children stay trackable when it dies."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
import trio

from fleet_trio.gpu.fake import init_device
from fleet_trio.sim.fleet import free_port
from fleet_trio.sim.zygote import LOST_EXIT_CODE, open_zygote
from tests.helpers import wait_until


def node_args(tmp_path: Path) -> list[str]:
    """The role launcher's arguments for a node that runs until it is stopped."""
    gpu = tmp_path / "gpu"
    init_device(str(gpu))
    cfg = tmp_path / "node.yaml"
    cfg.write_text("tasks: {}\n")
    return [
        "--", "node", "-c", str(cfg), "--gpu", "fake", "--fake-gpu-dir", str(gpu),
        "--listen", f"127.0.0.1:{free_port()}", "--no-journal",
    ]  # fmt: skip


async def test_the_zygote_has_its_own_session() -> None:
    """A terminal's Ctrl-C goes to the scenario's process group; the zygote (and so every
    process it would fork afterwards) must not die of it."""
    with trio.fail_after(30):
        async with open_zygote() as zygote:
            pid = zygote._proc.pid
            assert os.getsid(pid) == pid != os.getsid(0)


@pytest.mark.slow
async def test_a_dead_zygote_leaves_no_waiter_hanging(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with open_zygote() as zygote:
            child = await zygote.spawn(node_args(tmp_path), str(tmp_path / "node.log"))
            zygote._proc.kill()
            await zygote._proc.wait()
            await wait_until(lambda: zygote.gone, what="the zygote's answers to end")
            with pytest.raises(OSError, match="has exited"):
                await zygote.spawn(node_args(tmp_path), str(tmp_path / "again.log"))
            assert child.returncode is None  # still running: no one has reaped it
            os.kill(child.pid, signal.SIGKILL)
            assert await child.wait() == LOST_EXIT_CODE  # seen through its pidfd


async def test_a_forked_process_is_signalled_through_its_pidfd(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Once the child is gone (reaped, its pid free for anyone), a signal sent before its exit
    message arrives reaches nobody: it goes through the pidfd taken when the pid was learnt,
    never ``os.kill`` by number."""
    from fleet_trio.sim.zygote import ForkedProcess

    with trio.fail_after(30):
        proc = await trio.lowlevel.open_process(["sleep", "30"])
        child = ForkedProcess(proc.pid)
        killed: list[tuple[int, int]] = []
        monkeypatch.setattr(os, "kill", lambda pid, sig: killed.append((pid, sig)))
        child.send_signal(signal.SIGTERM)  # alive: delivered through the pidfd
        assert await proc.wait() == -signal.SIGTERM
        child.send_signal(signal.SIGKILL)  # gone and reaped, exit not yet reported: nobody
        assert killed == []
        child._exit(0)


@pytest.mark.slow
async def test_children_are_stopped_when_the_scenario_is_gone(tmp_path: Path) -> None:
    """Issue 25: a scenario killed mid-run (a ``timeout`` around the suite, SIGTERM to
    pytest) closes the zygote's stdin without stopping what it had asked for. The zygote
    exited and left its nodes running for good, each with its jobs: a later run of the same
    seeds met their job processes. Now the zygote SIGTERMs every child still running when its
    stdin closes (a node drains and sweeps its jobs), and reaps it."""
    with trio.fail_after(60):
        async with open_zygote() as zygote:
            child = await zygote.spawn(node_args(tmp_path), str(tmp_path / "node.log"))
            log = tmp_path / "node.log"
            await wait_until(
                lambda: log.exists() and "serving on" in log.read_text(), what="the node to serve"
            )
            assert zygote._proc.stdin is not None
            await zygote._proc.stdin.aclose()  # what the scenario's death does
            assert await child.wait() == 0  # drained and reaped by the zygote, not killed
            assert await zygote._proc.wait() == 0
    assert "draining" in log.read_text()


def test_a_child_that_ignores_sigterm_is_killed_after_the_wait() -> None:
    from fleet_trio.sim.zygote import stop_children

    polite = subprocess.Popen(["sleep", "30"])
    stubborn = subprocess.Popen(
        ["sh", "-c", "trap '' TERM; echo ready; exec sleep 30"], stdout=subprocess.PIPE
    )
    assert stubborn.stdout is not None
    assert stubborn.stdout.readline() == b"ready\n"  # the trap is set
    children = {polite.pid, stubborn.pid}
    codes = stop_children(children, wait=0.5)
    assert codes == {polite.pid: -signal.SIGTERM, stubborn.pid: -signal.SIGKILL}
    assert children == set()
    polite.returncode, stubborn.returncode = codes[polite.pid], codes[stubborn.pid]  # reaped
    stubborn.stdout.close()
