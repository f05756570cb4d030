"""``fleet-trio sim controller|submit|jobs|devices`` and the sim's client routes
(``POST /v1/jobs`` as ``rc run`` sends it)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from fleet_trio.sim import SimController, serve_controller
from tests.helpers import wait_until

FLEET_TRIO = [sys.executable, "-m", "fleet_trio"]


async def test_client_routes_submit_like_rc_run() -> None:
    ctrl = SimController(token="wtok", tokens={"ctok": "client"}, startup_grace=0.0)
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_controller, ctrl)
        hdr = {"Authorization": "Bearer ctok"}
        async with httpx.AsyncClient(base_url=url, timeout=10) as c:
            r = await c.post("/v1/jobs", json={"command": ["true"]}, headers=hdr)
            assert r.status_code == 409 and r.json()["error"] == "no_device"
            reg = {"host": "box", "devices": [{"name": "gpu0"}]}
            r = await c.post(
                "/v1/workers/register", json=reg, headers={"Authorization": "Bearer wtok"}
            )
            assert r.status_code == 200, r.text
            body = {
                "device_id": "box:gpu0",
                "command": ["sh", "-c", "echo hi"],
                "submitter": "probe@fakehost",
                "idempotency_key": "k1",
            }
            r = await c.post("/v1/jobs", json=body, headers=hdr)
            assert r.status_code == 201, r.text
            job = r.json()
            assert list(job)[:6] == ["id", "selector", "kind", "command", "cwd", "submitter"]
            assert job["state"] == "assigned" and job["device_id"] == "box:gpu0"
            again = await c.post("/v1/jobs", json=body, headers=hdr)
            assert again.json()["id"] == job["id"]  # the same idempotency key: the same job
            got = await c.get(f"/v1/jobs/{job['id']}", headers=hdr)
            assert got.json()["job"]["command"] == ["sh", "-c", "echo hi"]
            sel = await c.post(
                "/v1/jobs", json={"selector": "vram>=16G", "command": ["x"]}, headers=hdr
            )
            assert sel.status_code == 400 and "selectors are not simulated" in sel.text
            worker = await c.post("/v1/jobs", json=body, headers={"Authorization": "Bearer wtok"})
            assert worker.status_code == 403
            anon = await c.get("/v1/devices")
            assert anon.status_code == 401
            devs = await c.get("/v1/devices", headers=hdr)
            assert [d["id"] for d in devs.json()["devices"]] == ["box:gpu0"]
            killed = await c.post(f"/v1/jobs/{job['id']}/kill", headers=hdr)
            assert killed.json() == {"killed": True}
        nursery.cancel_scope.cancel()


async def _read_until(stream: Any, needle: bytes, buf: bytearray) -> None:
    while needle not in buf:
        chunk = await stream.receive_some()
        assert chunk, buf.decode()
        buf += chunk


@pytest.mark.slow
async def test_try_it_from_the_shell(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "STATE_DIRECTORY"}
    env.update(HOME=str(tmp_path), XDG_STATE_HOME=str(tmp_path / "state"))

    async def cli(*args: str) -> subprocess.CompletedProcess[bytes]:
        return await trio.run_process(
            [*FLEET_TRIO, *args], env=env, capture_stdout=True, capture_stderr=True, check=False
        )

    with trio.fail_after(60):
        ctrl = await trio.lowlevel.open_process(
            [*FLEET_TRIO, "sim", "controller", "--listen", "127.0.0.1:0"],
            env=env,
            stdout=subprocess.PIPE,
        )
        worker = None
        try:
            out = bytearray()
            await _read_until(ctrl.stdout, b"worker config: ", out)
            await _read_until(ctrl.stdout, b"\n", out)
            lines = out.decode().splitlines()
            assert lines[0].startswith("fleet-trio sim controller: serving on http://127.0.0.1:")
            assert "worker token w-" in lines[1] and "client token c-" in lines[1]
            config = tmp_path / "state" / "fleet-trio" / "sim" / "worker.yaml"
            assert lines[2].startswith(f"fleet-trio sim controller: worker config: {config}")
            for folder in ("probe.d", "verify.d"):  # named in it: a worker warns of none
                assert (config.parent / folder).is_dir()
            session = tmp_path / "state" / "fleet-trio" / "sim-controller.json"
            assert session.stat().st_mode & 0o077 == 0
            assert json.loads(session.read_text())["worker_config"] == str(config)
            worker = await trio.lowlevel.open_process(
                [*FLEET_TRIO, "sim", "worker"], env=env, stderr=subprocess.DEVNULL
            )
            # submit waits for the worker to register (409 no_device until then)
            done = await cli("sim", "submit", "--", "sh", "-c", "echo hello $RC_JOB_ID; exit 3")
            assert done.returncode == 3, done.stderr
            devices = await cli("sim", "devices")
            assert b"sim-box:gpu0" in devices.stdout and b"ready" in devices.stdout
            assert done.stdout.startswith(b"hello ")
            jobs = await cli("sim", "jobs", "--json")
            listed = json.loads(jobs.stdout)
            assert listed[0]["state"] == "failed" and listed[0]["exit_code"] == 3
            missing = await cli("sim", "submit")
            assert missing.returncode == 2
            assert missing.stderr.decode().count("error:") == 1
        finally:
            for proc in (worker, ctrl):
                if proc is not None:
                    proc.send_signal(signal.SIGTERM)
                    await proc.wait()
    assert not session.exists()  # removed when the controller stops
    nobody = await cli("sim", "jobs")
    assert nobody.returncode == 1
    assert nobody.stderr.decode().startswith("error: no sim controller is running")


def _shell_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "STATE_DIRECTORY"}
    env.update(HOME=str(tmp_path), XDG_STATE_HOME=str(tmp_path / "state"))
    return env


class _ShellFleet:
    """A ``sim controller`` (serving) and what a test starts beside it, all stopped at the end
    (SIGTERM, reaped) by :func:`_shell_fleet`."""

    def __init__(self, env: dict[str, str], ctrl: trio.Process) -> None:
        self.env = env
        self.ctrl = ctrl
        self.procs: list[trio.Process] = [ctrl]

    async def start(self, *args: str, **kw: Any) -> trio.Process:
        proc = await trio.lowlevel.open_process([*FLEET_TRIO, *args], env=self.env, **kw)
        self.procs.append(proc)
        return proc

    async def submit_following(self, script: str) -> trio.Process:
        """A worker, then ``sim submit -- sh -c SCRIPT`` once the job's ``started`` line is
        out (the script prints it first)."""
        await self.start("sim", "worker", stderr=subprocess.DEVNULL)
        submit = await self.start(
            "sim", "submit", "--", "sh", "-c", f"echo started; {script}",
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        await _read_until(submit.stdout, b"started\n", bytearray())
        return submit


@contextlib.asynccontextmanager
async def _shell_fleet(tmp_path: Path) -> AsyncIterator[_ShellFleet]:
    env = _shell_env(tmp_path)
    with trio.fail_after(90):
        ctrl = await trio.lowlevel.open_process(
            [*FLEET_TRIO, "sim", "controller", "--listen", "127.0.0.1:0"],
            env=env,
            stdout=subprocess.PIPE,
        )
        fleet = _ShellFleet(env, ctrl)
        try:
            await _read_until(ctrl.stdout, b"worker config: ", bytearray())
            yield fleet
        finally:
            for proc in reversed(fleet.procs):
                if proc.returncode is None:
                    proc.send_signal(signal.SIGTERM)
                    await proc.wait()


async def _read_all(stream: Any) -> str:
    data = bytearray()
    while chunk := await stream.receive_some():
        data += chunk
    return data.decode()


async def test_a_left_behind_session_file_is_not_a_running_controller(tmp_path: Path) -> None:
    """A controller killed with SIGKILL cannot remove its session file: its dead pid says no
    controller is running (not a connection error to a dead URL)."""
    env = _shell_env(tmp_path)
    gone = await trio.lowlevel.open_process(["true"])
    await gone.wait()
    session = tmp_path / "state" / "fleet-trio" / "sim-controller.json"
    session.parent.mkdir(parents=True)
    info = {
        "url": "http://127.0.0.1:9",
        "client_token": "c",
        "worker_config": "/nonexistent",
        "pid": gone.pid,
    }
    session.write_text(json.dumps(info))
    with trio.fail_after(60):
        done = await trio.run_process(
            [*FLEET_TRIO, "sim", "jobs"], env=env, capture_stderr=True, check=False
        )
    assert done.returncode == 1
    assert done.stderr.decode().startswith("error: no sim controller is running"), done.stderr


@pytest.mark.slow
async def test_sim_worker_and_submit_wait_for_a_controller_that_is_starting(
    tmp_path: Path,
) -> None:
    """``sim controller &`` returns before the controller serves: ``sim worker`` and ``sim
    submit`` started right after it wait for it (saying so once), instead of failing."""
    env = _shell_env(tmp_path)
    with trio.fail_after(90):
        worker = await trio.lowlevel.open_process(
            [*FLEET_TRIO, "sim", "worker"], env=env, stderr=subprocess.PIPE
        )
        ctrl = None
        try:
            said = bytearray()
            await _read_until(worker.stderr, b"waiting up to 10s for a sim controller", said)
            assert worker.returncode is None
            ctrl = await trio.lowlevel.open_process(
                [*FLEET_TRIO, "sim", "controller", "--listen", "127.0.0.1:0"],
                env=env,
                stdout=subprocess.DEVNULL,
            )
            done = await trio.run_process(
                [*FLEET_TRIO, "sim", "submit", "--", "sh", "-c", "echo ran"],
                env=env,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
            assert done.returncode == 0, done.stderr
            assert done.stdout == b"ran\n"
        finally:
            for proc in (worker, ctrl):
                if proc is not None:
                    proc.send_signal(signal.SIGTERM)
                    await proc.wait()


@pytest.mark.slow
async def test_ctrl_c_on_sim_submit_kills_the_job_and_says_so(tmp_path: Path) -> None:
    async with _shell_fleet(tmp_path) as fleet:
        submit = await fleet.submit_following("exec sleep 600")
        submit.send_signal(signal.SIGINT)
        assert await submit.wait() == 130
        err = await _read_all(submit.stderr)
        assert "interrupted: job " in err and "killed (Ctrl-C)" in err, err

        async def final_state() -> str | None:
            jobs = await trio.run_process(
                [*FLEET_TRIO, "sim", "jobs", "--json"], env=fleet.env, capture_stdout=True
            )
            state = json.loads(jobs.stdout)[0]["state"]
            return state if state in ("killed", "failed", "succeeded") else None

        assert await wait_until(final_state, timeout=30, what="the job's end") == "killed"


def _session_file(tmp_path: Path) -> Path:
    session = tmp_path / "state" / "fleet-trio" / "sim-controller.json"
    session.parent.mkdir(parents=True, exist_ok=True)
    return session


async def test_a_session_file_that_is_a_fifo_is_an_error_not_a_hang(tmp_path: Path) -> None:
    """Before: ``open`` of a FIFO blocks until a writer comes: ``sim jobs`` and ``sim submit``
    hung for ever (the 10 s wait for a starting controller could not cut it)."""
    env = _shell_env(tmp_path)
    os.mkfifo(_session_file(tmp_path))
    with trio.fail_after(60):
        done = await trio.run_process(
            [*FLEET_TRIO, "sim", "jobs"], env=env, capture_stderr=True, check=False
        )
    assert done.returncode == 1
    err = done.stderr.decode()
    assert err.startswith("error: ") and "sim-controller.json: not a regular file" in err, err


def test_the_session_file_is_replaced_whole_never_seen_half_written(tmp_path: Path) -> None:
    """A client that reads the session file while a controller writes it (``sim controller &``
    then ``sim submit`` at once) sees the old file or the new one, never an empty or half one
    (before: written in place after ``O_TRUNC``: ``Expecting value: line 1 column 1``)."""
    from fleet_trio.sim.controller_cli import _write_private

    path = tmp_path / "s.json"
    path.write_text('{"old": 1}\n')
    with path.open() as before:  # the file a reader had opened just before the write
        _write_private(str(path), '{"new": 2}\n')
        assert before.read() == '{"old": 1}\n'  # not truncated under the reader
    assert path.read_text() == '{"new": 2}\n'
    assert oct(path.stat().st_mode & 0o777) == oct(0o600)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.json"]  # no temporary left


@pytest.mark.slow
async def test_a_fifo_at_the_session_path_does_not_hang_the_controller(tmp_path: Path) -> None:
    """Before: the controller's write of its session file opened the FIFO and blocked for ever,
    silently (in a thread: not even Ctrl-C got it out)."""
    env = _shell_env(tmp_path)
    os.mkfifo(_session_file(tmp_path))
    with trio.fail_after(60):
        ctrl = await trio.lowlevel.open_process(
            [*FLEET_TRIO, "sim", "controller", "--listen", "127.0.0.1:0"],
            env=env,
            stdout=subprocess.PIPE,
        )
        try:
            out = bytearray()
            await _read_until(ctrl.stdout, b"worker config: ", out)
            devices = await trio.run_process(
                [*FLEET_TRIO, "sim", "devices"], env=env, capture_stderr=True, check=False
            )
            assert devices.returncode == 0, devices.stderr
        finally:
            ctrl.send_signal(signal.SIGTERM)
            await ctrl.wait()
        assert not _session_file(tmp_path).exists()  # removed at the end


@pytest.mark.slow
async def test_sim_submit_says_the_log_stream_was_lost_when_the_controller_dies(
    tmp_path: Path,
) -> None:
    """The controller killed while ``sim submit`` follows the job's output: one ``error:``
    line and exit 1 (before: the error escaped the Ctrl-C nursery as an exception group, an
    "internal error" with a crash report)."""
    async with _shell_fleet(tmp_path) as fleet:
        submit = await fleet.submit_following("exec sleep 600")
        fleet.ctrl.kill()
        await fleet.ctrl.wait()
        text = await _read_all(submit.stderr)
        assert await submit.wait() == 1
        assert "error: lost the job's log stream: " in text, text
        assert "internal error" not in text and "Traceback" not in text, text


@pytest.mark.slow
async def test_ctrl_c_before_anything_was_submitted_says_so(tmp_path: Path) -> None:
    """Ctrl-C while ``sim submit`` waits for a worker: nothing was submitted, and it says so
    (exit 130); the controller has no job."""
    async with _shell_fleet(tmp_path) as fleet:
        submit = await fleet.start("sim", "submit", "--", "true", stderr=subprocess.PIPE)
        said = bytearray()
        await _read_until(submit.stderr, b"waiting for a worker to register", said)
        submit.send_signal(signal.SIGINT)
        assert await submit.wait() == 130
        said += (await _read_all(submit.stderr)).encode()
        assert "interrupted: nothing was submitted (Ctrl-C)" in said.decode(), said
        jobs = await trio.run_process(
            [*FLEET_TRIO, "sim", "jobs", "--json"], env=fleet.env, capture_stdout=True
        )
        assert json.loads(jobs.stdout) == []
