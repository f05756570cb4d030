"""Issue acceptance: SIGTERM (and SIGHUP) with jobs in flight, against a real ``fleet-trio node``.

Every poller sees a terminal state before the process exits, and the exit is bounded by the
drain and the kill grace: the stubborn job would otherwise keep the node alive for 60 s. The
slack above drain + grace covers the interpreter's start-up work being done on a loaded CI
machine (the exit takes about drain + grace + 0.3 s on a quiet one).
"""

from __future__ import annotations

import fcntl
import os
import signal
import sys
import termios
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import trio

from fleet_trio.gpu.fake import init_device
from fleet_trio.proc.procfs import pid_alive
from fleet_trio.sim.fleet import free_port
from tests.helpers import healthy, scenario_pause, state_in, wait_until

DRAIN = 1.0
GRACE = 1.0
# Interpreter teardown, the poll linger's last answers and a busy 2-core CI machine: seen at
# 1.8 s there. Far below the 60 s the stubborn job would hold the node without the bound.
SLACK = 6.0

# A job that ignores SIGTERM: only the SIGKILL after the grace ends it.
STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"


def _config(tmp_path: Path) -> Path:
    cfg = tmp_path / "node.yaml"
    cfg.write_text(
        "node:\n"
        "  timings:\n"
        f"    drain_timeout: {int(DRAIN * 1000)}ms\n"
        f"    kill_grace: {int(GRACE * 1000)}ms\n"
        "tasks:\n"
        "  stubborn:\n"
        f"    command: [{sys.executable!r}, '-c', {STUBBORN!r}]\n"
        "  quick:\n"
        f"    command: [{sys.executable!r}, '-c', 'print(1)']\n"
    )
    return cfg


@pytest.mark.slow
async def test_sigterm_with_jobs_in_flight_every_poller_sees_a_terminal_state(
    tmp_path: Path,
) -> None:
    gpu_dir = tmp_path / "gpu"
    init_device(str(gpu_dir))
    port = free_port()
    argv = [
        sys.executable, "-m", "fleet_trio", "node", "-c", str(_config(tmp_path)),
        "--gpu", "fake", "--fake-gpu-dir", str(gpu_dir), "--listen", f"127.0.0.1:{port}",
        "--footprints", str(tmp_path / "fp.json"),
    ]  # fmt: skip
    jobs = [f"stubborn-{i}" for i in range(4)]
    last_seen: dict[str, str] = {}
    with trio.fail_after(40):
        proc = await trio.lowlevel.open_process(argv, env=dict(os.environ))
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                await wait_until(lambda: healthy(client), what="the node's health answering 200")
                for job in jobs:
                    body = {"job_id": job, "task_type": "stubborn", "payload": {}}
                    assert (await client.post("/fleet/dispatch", json=body)).status_code == 202
                for job in jobs:
                    await wait_until(lambda j=job: state_in(client, j, "running"))  # type: ignore[misc]

                async def poll(job: str) -> None:
                    # Poll until the listener goes away; remember the last state seen.
                    while True:
                        try:
                            r = await client.get(f"/fleet/jobs/{job}")
                        except httpx.TransportError:
                            return
                        last_seen[job] = r.json()["state"] + ":" + str(r.json().get("error"))
                        await scenario_pause(0.02, why="a client polling every 20 ms")

                async with trio.open_nursery() as nursery:
                    for job in jobs:
                        nursery.start_soon(poll, job)
                    await scenario_pause(0.2, why="the pollers are under way before the signal")
                    signalled = time.monotonic()
                    proc.send_signal(signal.SIGTERM)
                    code = await proc.wait()
                    exited = time.monotonic() - signalled
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert code == 0
    assert exited <= DRAIN + GRACE + SLACK, exited
    assert last_seen == {job: "error:interrupted" for job in jobs}


# -- SIGHUP: a closed SSH session after `fleet-trio node … &` ------------------------------------

# A job that ignores SIGTERM and says where it is: only the node's SIGKILL ends it.
PID_STUBBORN = (
    "import os, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(60)"
)


def _hup_config(tmp_path: Path) -> Path:
    cfg = tmp_path / "node.yaml"
    pid_file = tmp_path / "job.pid"
    cfg.write_text(
        "node:\n"
        "  timings:\n"
        f"    drain_timeout: {int(DRAIN * 1000)}ms\n"
        f"    kill_grace: {int(GRACE * 1000)}ms\n"
        "tasks:\n"
        "  stubborn:\n"
        f"    command: [{sys.executable!r}, '-c', {PID_STUBBORN!r}, {str(pid_file)!r}]\n"
    )
    return cfg


def _hup_argv(tmp_path: Path, port: int) -> list[str]:
    gpu_dir = tmp_path / "gpu"
    init_device(str(gpu_dir))
    return [
        sys.executable, "-m", "fleet_trio", "node", "-c", str(_hup_config(tmp_path)),
        "--gpu", "fake", "--fake-gpu-dir", str(gpu_dir), "--listen", f"127.0.0.1:{port}",
        "--footprints", str(tmp_path / "fp.json"), "--journal", str(tmp_path / "j.sqlite"),
    ]  # fmt: skip


async def _run_job_then(
    tmp_path: Path, port: int, proc: trio.Process, hang_up: Callable[[], object]
) -> tuple[int, str, int]:
    """Dispatch a stubborn job, wait until it runs, ``hang_up()``, poll until the listener
    goes; the node's exit code, the job's last state seen and its pid."""
    last = ""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        await wait_until(lambda: healthy(client), what="the node's health answering 200")
        body = {"job_id": "hup-1", "task_type": "stubborn", "payload": {}}
        assert (await client.post("/fleet/dispatch", json=body)).status_code == 202
        pid_file = tmp_path / "job.pid"
        await wait_until(lambda: pid_file.exists() and pid_file.read_text() != "")
        job_pid = int(pid_file.read_text())
        hang_up()
        while True:
            try:
                r = await client.get("/fleet/jobs/hup-1")
            except httpx.TransportError:
                break
            last = r.json()["state"] + ":" + str(r.json().get("error"))
            await scenario_pause(0.02, why="a client polling every 20 ms")
    return await proc.wait(), last, job_pid


@pytest.mark.slow
async def test_sighup_drains_the_node_as_sigterm_does(tmp_path: Path) -> None:
    """It died at once (exit -1) and left the job running on the GPU; now the running job is
    marked interrupted, its process is stopped, the exit is 0 and the log names SIGHUP."""
    port = free_port()
    log_file = tmp_path / "node.log"
    with trio.fail_after(40), log_file.open("wb") as log:
        proc = await trio.lowlevel.open_process(_hup_argv(tmp_path, port), stderr=log)
        try:
            code, last, job_pid = await _run_job_then(
                tmp_path, port, proc, lambda: proc.send_signal(signal.SIGHUP)
            )
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert code == 0, log_file.read_text()
    assert last == "error:interrupted"
    assert not pid_alive(job_pid)
    text = log_file.read_text()
    assert "SIGHUP" in text and "Traceback" not in text, text


@pytest.mark.slow
async def test_a_closed_terminal_drains_the_node(tmp_path: Path) -> None:
    """The real thing: the node is the controlling process of a terminal (its stdio), and the
    terminal goes away (the SSH session closes): the kernel sends SIGHUP, and every write to
    stderr fails from then on (EIO). The drain still runs to its end."""
    port = free_port()
    master, slave = os.openpty()

    def controlling_tty() -> None:  # in the child, a session leader: take the tty
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    with trio.fail_after(40):
        proc = await trio.lowlevel.open_process(
            _hup_argv(tmp_path, port),
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
            preexec_fn=controlling_tty,
        )
        os.close(slave)
        terminal = trio.lowlevel.FdStream(master)  # owns the master from here

        async def drain_terminal() -> None:  # the terminal reads what the node prints
            try:
                while await terminal.receive_some(65536):
                    pass
            except (trio.ClosedResourceError, OSError):  # hung up, or EIO once the node is gone
                return

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(drain_terminal)
                code, last, job_pid = await _run_job_then(tmp_path, port, proc, terminal.close)
                nursery.cancel_scope.cancel()
        finally:
            terminal.close()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert code == 0
    assert last == "error:interrupted"
    assert not pid_alive(job_pid)


@pytest.mark.slow
async def test_a_sighup_ignored_at_start_stays_ignored(tmp_path: Path) -> None:
    """``nohup fleet-trio node … &``: the operator asked for the hangup to be ignored."""
    port = free_port()
    argv = ["sh", "-c", 'trap "" HUP; exec "$@"', "sh", *_hup_argv(tmp_path, port)]
    with trio.fail_after(40):
        proc = await trio.lowlevel.open_process(argv)
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                await wait_until(lambda: healthy(client), what="the node's health answering 200")
                status = Path(f"/proc/{proc.pid}/status").read_text()
                [ignored] = [x.split()[1] for x in status.splitlines() if x.startswith("SigIgn:")]
                assert int(ignored, 16) & 1 << (signal.SIGHUP - 1)  # the tree left it ignored
                proc.send_signal(signal.SIGHUP)  # discarded by the kernel: nothing to drain
                body = {"job_id": "after-hup", "task_type": "stubborn", "payload": {}}
                assert (await client.post("/fleet/dispatch", json=body)).status_code == 202
                proc.send_signal(signal.SIGTERM)
                assert await proc.wait() == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
