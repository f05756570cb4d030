"""The interactive relay (``stdio: tty`` / ``stdio: pipe``): worker-protocol.md §15.10 items
119–127 and worker-process.md §11 items 110–111, plus the §7.2 "relay dial failure" row.

Both halves are ours: :func:`fleet_trio.worker.relay.run_attached` (the worker side) against
the simulated controller's E8/E9 (``fleet_trio.sim.relay``), with real processes. A small
harness plays the worker's job path around ``run_attached`` (poll, ``running`` report, run,
terminal report) without depending on ``worker.py``; the operator is played through
``fleet_trio.sim.relay.operator``. Item 128 (``rc cp``) needs the real rc CLI: not here.
"""

from __future__ import annotations

import io
import os
import pathlib
import re
import tarfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import trio

from fleet_trio.proc.sinks import BufferSink, Sink
from fleet_trio.proc.spec import JobSpec, Result
from fleet_trio.proc.stop import StopToken
from fleet_trio.sim import SimController
from fleet_trio.sim.relay import CONFLICT_MESSAGE, RelaySession, operator
from fleet_trio.worker.client import Assignment, ControllerClient
from fleet_trio.worker.relay import (
    DataFrame,
    FrameError,
    FrameReader,
    RelayError,
    ResizeFrame,
    encode_data,
    encode_resize,
    open_in_stream,
    open_out_stream,
    run_attached,
)
from fleet_trio.worker.worker import terminal_report
from tests.helpers import CLIENT_FAST, REG, controller, dev, gone_within, running, until_terminal

TOKEN = "wtok"
GRACE = 0.3
BOUND = 45.0
"""A scenario's bound: bounded, not hung. One shell echo on a loaded 2-core machine has taken
over 5 s (``type_line`` allows 15), and a scenario types several lines."""
ECHO_BYTES = b"line-one\nline\rtwo\xffend\n"


@attrs.define
class RelayJob:
    """One tty/pipe job handed to our harness by a poll; ``op`` plays its operator."""

    ctrl: SimController
    client: ControllerClient
    worker_id: str
    assignment: Assignment
    op: RelaySession

    @property
    def job_id(self) -> str:
        return self.assignment.job_id

    def spec(self, **kw: object) -> JobSpec:
        a = self.assignment
        fields: dict[str, object] = {
            "command": a.command,
            "cwd": a.cwd,
            "env": a.env,
            "grace_ceiling": GRACE,
            "idle_timeout": float(a.idle_timeout_seconds),
        }
        fields.update(kw)
        return JobSpec(**fields)  # type: ignore[arg-type]

    async def attach(
        self,
        spec: JobSpec | None = None,
        stop: StopToken | None = None,
        *,
        stderr_sink: Sink | None = None,
    ) -> Result:
        """The worker's job path for a relay job: running, run_attached, terminal report."""
        await self.client.report_running(self.job_id, self.worker_id)
        result = await run_attached(
            self.client.base_url,
            TOKEN,
            self.assignment,
            spec or self.spec(),
            stop,
            stderr_sink=stderr_sink,
        )
        await self.client.report_terminal(self.job_id, terminal_report(self.worker_id, result))
        return result

    def attach_soon(self, nursery: trio.Nursery, stop: StopToken | None = None) -> list[Result]:
        """Start :meth:`attach` in ``nursery``; its result lands in the returned list."""
        results: list[Result] = []

        async def worker_side() -> None:
            results.append(await self.attach(stop=stop))

        nursery.start_soon(worker_side)
        return results


@asynccontextmanager
async def relay_job(
    command: list[str], stdio: str = "tty", **submit: object
) -> AsyncIterator[RelayJob]:
    async with controller(CLIENT_FAST) as (ctrl, client):
        worker_id = await client.register(attrs.evolve(REG, recovery=None))
        job_id = ctrl.submit(dev("gpu0"), command, stdio=stdio, **submit)  # type: ignore[arg-type]
        answer = await client.poll(worker_id, 0.5)
        [assignment] = answer.assignments
        assert assignment.job_id == job_id and assignment.stdio == stdio
        yield RelayJob(ctrl, client, worker_id, assignment, operator(ctrl, job_id))


async def type_line(op: RelaySession, line: str, expect: bytes | re.Pattern[bytes]) -> bytes:
    await op.send(line.encode() + b"\n")
    # bounded, not hung: a shell's echo on a loaded 2-core machine took over 5 s once
    return await op.wait_output(expect, timeout=15)


# ------------------------------------------------------------------------------------------
# 119–125: the worker half with real processes
# ------------------------------------------------------------------------------------------


async def test_protocol_119_tty_job_input_output_resize_and_exit() -> None:
    with trio.fail_after(BOUND):
        async with relay_job(["/bin/sh"]) as job, trio.open_nursery() as nursery:
            results = job.attach_soon(nursery)
            op = job.op
            await op.wait_connected()
            # data frames reach the shell, PTY output reaches the out-stream
            await type_line(op, "echo hello-$((40+2))", b"hello-42")
            await op.resize(48, 180)
            await type_line(op, "stty size", b"48 180")
            await op.send(b"exit\n")
            output = await op.wait_ended()
        assert results[0] == Result(exit_code=0)
        assert job.ctrl.statuses(job.job_id) == ["running", "succeeded"]
        assert op.ended and op.ended_cleanly
        assert b"hello-42" in output and b"48 180" in output
        # E8: chunked octet-stream with the token; E9: the token only (§3.8)
        [out_req] = job.ctrl.requests("tty_out")
        [in_req] = job.ctrl.requests("tty_in")
        assert (out_req.method, out_req.path) == ("POST", f"/v1/jobs/{job.job_id}/tty/out")
        assert (in_req.method, in_req.path) == ("GET", f"/v1/jobs/{job.job_id}/tty/in")
        out_headers = {k.lower(): v for k, v in out_req.headers.items()}
        in_headers = {k.lower(): v for k, v in in_req.headers.items()}
        assert out_headers["authorization"] == in_headers["authorization"] == f"Bearer {TOKEN}"
        assert out_headers["content-type"] == "application/octet-stream"
        assert out_headers["transfer-encoding"] == "chunked"
        assert "content-type" not in in_headers
        assert out_req.seq < in_req.seq  # the reference's order: E8, then E9


async def test_protocol_120_zero_resize_is_ignored_later_resize_applies() -> None:
    with trio.fail_after(BOUND):
        async with relay_job(["/bin/sh"]) as job, trio.open_nursery() as nursery:
            nursery.start_soon(job.attach)
            op = job.op
            await op.wait_connected()
            await op.resize(0, 0)
            await op.send_raw(b'{"t":"r","rows":0,"cols":120}\n')  # one dimension 0: ignored too
            await type_line(op, "stty size", b"24 80")
            await op.resize(48, 180)
            await type_line(op, "stty size", b"48 180")
            await op.send(b"exit\n")
            await op.wait_ended()
        assert job.ctrl.statuses(job.job_id) == ["running", "succeeded"]


async def test_process_110_zero_size_resize_frame_through_the_relay_is_ignored() -> None:
    with trio.fail_after(BOUND):
        async with relay_job(["/bin/sh", "-c", "read go; stty size"]) as job:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(job.attach)
                await job.op.wait_connected()
                await job.op.resize(0, 0)
                await job.op.send(b"go\n")
                output = await job.op.wait_ended()
            assert re.search(rb"(?m)^24 80\r?$", output), output
            assert job.ctrl.statuses(job.job_id) == ["running", "succeeded"]


async def test_protocol_121_tty_output_never_reaches_the_log_endpoint() -> None:
    with trio.fail_after(BOUND):
        script = "echo out-marker; echo err-marker >&2; read x; echo got-$x"
        async with relay_job(["/bin/sh", "-c", script]) as job:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(job.attach)
                await job.op.wait_output(b"err-marker")
                await job.op.send(b"abc\n")
                output = await job.op.wait_ended()
            await until_terminal(job.ctrl, job.job_id)
            assert b"out-marker" in output and b"err-marker" in output and b"got-abc" in output
            assert job.ctrl.logs(job.job_id) == b""
            assert [r for r in job.ctrl.requests("logs") if job.job_id in r.path] == []


async def test_protocol_122_pipe_mode_is_byte_exact_and_input_eof_ends_cat() -> None:
    with trio.fail_after(BOUND):
        async with relay_job(["/bin/cat"], stdio="pipe") as job:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(job.attach)
                await job.op.wait_connected()
                await job.op.send(ECHO_BYTES)
                await job.op.wait_output(ECHO_BYTES)
                await job.op.close_input()
                output = await job.op.wait_ended()
            assert output == ECHO_BYTES
            assert job.ctrl.statuses(job.job_id) == ["running", "succeeded"]
            assert job.ctrl.job(job.job_id).state == "succeeded"


async def test_process_111_pipe_mode_echoes_byte_exact_via_cat_and_succeeds() -> None:
    with trio.fail_after(BOUND):
        async with relay_job(["/bin/cat"], stdio="pipe") as job:
            await job.op.send(ECHO_BYTES)  # typed before the worker attached: kept for it
            await job.op.close_input()
            result = await job.attach()
            assert result == Result(exit_code=0)
            assert job.op.output() == ECHO_BYTES and job.op.ended_cleanly
            assert job.ctrl.statuses(job.job_id) == ["running", "succeeded"]


async def test_pipe_mode_stderr_goes_to_the_given_sink_not_the_out_stream() -> None:
    with trio.fail_after(BOUND):
        script = "echo to-out; echo to-err >&2; exec cat"
        async with relay_job(["/bin/sh", "-c", script], stdio="pipe") as job:
            await job.op.send(b"in\n")
            await job.op.close_input()
            errors = BufferSink()
            result = await job.attach(stderr_sink=errors)
            assert result == Result(exit_code=0)
            assert job.op.output() == b"to-out\nin\n"
            assert errors.getvalue() == b"to-err\n"


async def test_pipe_mode_child_that_never_reads_stdin_still_ends() -> None:
    with trio.fail_after(BOUND):
        async with relay_job(["/bin/sh", "-c", "printf done"], stdio="pipe") as job:
            result = await job.attach()  # input never closed by the operator
            assert result == Result(exit_code=0)
            assert job.op.output() == b"done"


async def test_protocol_123_job_without_stdio_never_opens_a_relay_stream() -> None:
    with trio.fail_after(BOUND):
        async with running() as (ctrl, _worker):
            job = ctrl.submit(dev("gpu0"), ["/bin/sh", "-c", "echo logged-output"])
            assert await until_terminal(ctrl, job) == ["running", "succeeded"]
            await ctrl.wait_for(lambda: b"logged-output" in ctrl.logs(job))
            assert ctrl.requests("tty_out") == [] and ctrl.requests("tty_in") == []


async def test_protocol_124_pty_is_a_terminal_with_cwd_env_input_and_resize(
    tmp_path: Path,
) -> None:
    script = (
        'test -t 1 && echo "is-a-tty"; stty size; echo "cwd=$(pwd)"; echo "env=$RELAY_VAR"; '
        'read line; echo "read=$line"; read go; stty size'
    )
    with trio.fail_after(BOUND):
        async with relay_job(
            ["/bin/sh", "-c", script], cwd=str(tmp_path), env={"RELAY_VAR": "v-124"}
        ) as job:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(job.attach)
                op = job.op
                await op.wait_output(b"env=v-124")
                await op.send(b"typed\n")
                await op.wait_output(b"read=typed")
                await op.resize(30, 100)
                await op.send(b"go\n")
                output = await op.wait_ended()
            text = output.decode(errors="replace")
            assert "is-a-tty" in text
            assert re.search(r"(?m)^24 80\r?$", text), text
            assert f"cwd={tmp_path}" in text
            assert re.search(r"(?m)^30 100\r?$", text), text
            assert job.ctrl.statuses(job.job_id) == ["running", "succeeded"]


async def test_protocol_124_idle_watchdog_ends_an_abandoned_session() -> None:
    with trio.fail_after(BOUND):
        async with relay_job(["/bin/sh", "-c", "echo start; sleep 30"]) as job:
            result = await job.attach(job.spec(idle_timeout=0.5))
            assert result.killed and result.reason == "idle: no output for 500ms"
            assert job.ctrl.statuses(job.job_id) == ["running", "killed"]
            assert job.op.ended and b"start" in job.op.output()


async def test_protocol_125_cancel_kills_every_group_in_the_session() -> None:
    with trio.fail_after(BOUND):
        async with relay_job(["/bin/sh"]) as job, trio.open_nursery() as nursery:
            stop = StopToken()
            results = job.attach_soon(nursery, stop)
            out = await type_line(job.op, "sleep 300 & echo bg:$!", re.compile(rb"bg:(\d+)"))
            match = re.search(rb"bg:(\d+)", out)
            assert match is not None
            bg = int(match.group(1))
            stop.set()  # rc kill
            await job.op.wait_ended()
        assert results[0].killed and results[0].reason == "cancelled"
        assert await gone_within(bg, 2.0)
        assert job.ctrl.statuses(job.job_id) == ["running", "killed"]


async def test_protocol_125_clean_exit_reaps_background_stragglers() -> None:
    with trio.fail_after(BOUND):
        async with relay_job(["/bin/sh"]) as job, trio.open_nursery() as nursery:
            results = job.attach_soon(nursery)
            out = await type_line(job.op, "sleep 300 & echo bg:$!", re.compile(rb"bg:(\d+)"))
            match = re.search(rb"bg:(\d+)", out)
            assert match is not None
            await job.op.send(b"exit\n")
            await job.op.wait_ended()
        assert results[0].killed and results[0].reason == "stragglers reaped after exit"
        assert await gone_within(int(match.group(1)), 2.0)


# ------------------------------------------------------------------------------------------
# §7.2 relay dial failure, stops and shutdown
# ------------------------------------------------------------------------------------------


async def test_relay_dial_failure_output_half_fails_the_job_unstarted(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    with trio.fail_after(BOUND):
        async with relay_job(["/bin/sh", "-c", f"touch {marker}"]) as job:
            unknown = attrs.evolve(job.assignment, job_id="00000000-0000-4000-8000-000000000000")
            result = await run_attached(
                job.client.base_url, TOKEN, unknown, job.spec(), StopToken()
            )
            assert result.exit_code == -1 and not result.killed
            assert (
                result.err == "attach tty stdio: open output stream: 404 Not Found: job not found"
            )
            assert not marker.exists()


async def test_relay_dial_failure_input_half_fails_the_job_unstarted(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    with trio.fail_after(BOUND):
        async with relay_job(["/bin/sh", "-c", f"touch {marker}"], stdio="pipe") as job:
            squatter = await open_in_stream(job.client.base_url, TOKEN, job.job_id)
            try:
                result = await job.attach()
            finally:
                await squatter.aclose()
            assert result.exit_code == -1 and result.err == (
                f"attach pipe stdio: open input stream: 409 Conflict: {CONFLICT_MESSAGE}"
            )
            assert not marker.exists()
            assert job.ctrl.statuses(job.job_id) == ["running", "failed"]
            report = job.ctrl.status_reports(job.job_id)[-1]
            assert report.exit_code == -1 and report.reason == result.err
            # the output half was opened, then closed: the session ended
            assert job.op.out_connections == 1 and job.op.ended


async def test_relay_bad_token_and_unreachable_controller() -> None:
    with trio.fail_after(BOUND):
        async with relay_job(["/bin/cat"], stdio="pipe") as job:
            result = await run_attached(job.client.base_url, "nope", job.assignment, job.spec())
            assert result.err is not None
            assert result.err.startswith("attach pipe stdio: open output stream: 401 Unauthorized")
        with trio.socket.socket() as sock:
            await sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]  # bound, not listening: connection refused
            result = await run_attached(
                f"http://127.0.0.1:{port}", TOKEN, job.assignment, job.spec()
            )
        assert result.exit_code == -1 and result.err is not None
        assert result.err.startswith("attach pipe stdio: open output stream: dial tcp")


async def test_relay_stop_before_open_starts_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    with trio.fail_after(BOUND):
        async with relay_job(["/bin/sh", "-c", f"touch {marker}"]) as job:
            stop = StopToken()
            stop.set()
            result = await run_attached(
                job.client.base_url, TOKEN, job.assignment, job.spec(), stop
            )
            assert result == Result(exit_code=-1, killed=True, reason="cancelled")
            assert not marker.exists()


async def test_relay_shutdown_cancellation_tears_down_and_propagates() -> None:
    with trio.fail_after(BOUND):
        async with relay_job(["/bin/sh"]) as job:
            pids: list[int] = []
            with trio.CancelScope() as scope:
                async with trio.open_nursery() as nursery:

                    async def shutdown_soon() -> None:
                        out = await type_line(job.op, "echo pid:$$", re.compile(rb"pid:(\d+)"))
                        match = re.search(rb"pid:(\d+)", out)
                        assert match is not None
                        pids.append(int(match.group(1)))
                        scope.cancel()

                    nursery.start_soon(shutdown_soon)
                    await run_attached(job.client.base_url, TOKEN, job.assignment, job.spec())
                    raise AssertionError("run_attached returned under cancellation")
            assert scope.cancelled_caught
            assert pids and await gone_within(pids[0], 2.0)
            await job.op.wait_ended(timeout=3)


# ------------------------------------------------------------------------------------------
# 126–127: the controller's relay and the frame encoding
# ------------------------------------------------------------------------------------------


async def test_protocol_126_controller_relay_sessions_halves_and_reconnect() -> None:
    with trio.fail_after(BOUND):
        async with controller(CLIENT_FAST) as (ctrl, client):
            await client.register(attrs.evolve(REG, recovery=None))
            url = client.base_url
            job_a = ctrl.submit(dev("gpu0"), ["/bin/sh"], stdio="tty")
            job_b = ctrl.submit(dev("gpu1"), ["/bin/sh"], stdio="tty")
            op_a, op_b = operator(ctrl, job_a), operator(ctrl, job_b)

            # an unknown job is refused, on both halves
            unknown = "00000000-0000-4000-8000-000000000000"
            for opener in (open_out_stream, open_in_stream):
                try:
                    await opener(url, TOKEN, unknown)
                    raise AssertionError("unknown job accepted")
                except RelayError as exc:
                    assert str(exc) == "404 Not Found: job not found"

            # either half first: the input half of A before its output half
            in_a = await open_in_stream(url, TOKEN, job_a)
            out_a = await open_out_stream(url, TOKEN, job_a)
            assert op_a.worker_in and op_a.worker_out
            # a second connection on the same half is refused with 409
            for opener in (open_out_stream, open_in_stream):
                try:
                    await opener(url, TOKEN, job_a)
                    raise AssertionError("second connection accepted")
                except RelayError as exc:
                    assert str(exc) == f"409 Conflict: {CONFLICT_MESSAGE}"

            # sessions are per job: B's halves are free and its streams are its own
            out_b = await open_out_stream(url, TOKEN, job_b)
            await out_a.send(b"from-a")
            await out_b.send(b"from-b")
            await op_a.wait_output(b"from-a")
            await op_b.wait_output(b"from-b")
            assert op_a.output() == b"from-a" and op_b.output() == b"from-b"

            # operator input reaches the worker's in-stream as frames
            await op_a.send(b"ls")
            await op_a.resize(48, 180)
            reader = FrameReader()
            frames: list[object] = []
            while len(frames) < 2:
                frames += reader.feed(await in_a.receive_some())
            assert frames == [DataFrame(b"ls"), ResizeFrame(48, 180)]

            # input restored after an input-half reconnect
            await in_a.aclose()
            await ctrl.wait_for(lambda: not op_a.worker_in)
            await op_a.send(b"after")
            in_a = await open_in_stream(url, TOKEN, job_a)
            assert op_a.in_connections == 2
            assert FrameReader().feed(await in_a.receive_some()) == [DataFrame(b"after")]

            # the worker's out-stream ending ends the operator's stream (and the input half)
            assert not op_a.ended
            await out_a.aclose()
            await op_a.wait_ended()
            assert op_a.ended_cleanly and not op_b.ended
            assert await in_a.receive_some() == b""
            await in_a.aclose()
            await out_b.aclose()
            await op_b.wait_ended()
            assert len(ctrl.requests("tty_out")) == 4 and len(ctrl.requests("tty_in")) == 4


async def test_protocol_127_frame_encoding_and_reader() -> None:
    assert encode_data(b"ls") == b'{"t":"d","b":"bHM="}\n'
    assert encode_resize(48, 180) == b'{"t":"r","rows":48,"cols":180}\n'
    reader = FrameReader()
    stream = encode_data(b"ls") + b'{"t":"future","x":1}\n' + encode_resize(48, 180)
    frames = reader.feed(stream[:7]) + reader.feed(stream[7:30]) + reader.feed(stream[30:])
    assert frames == [DataFrame(b"ls"), ResizeFrame(48, 180)]  # split reassembled, unknown skipped
    try:
        reader.feed(b"{malformed\n")
        raise AssertionError("malformed JSON accepted")
    except FrameError:
        pass


async def test_malformed_input_ends_input_handling_not_the_job() -> None:
    with trio.fail_after(BOUND):
        async with relay_job(["/bin/sh"]) as job, trio.open_nursery() as nursery:
            stop = StopToken()
            results = job.attach_soon(nursery, stop)
            # the shell's answer, not the terminal's echo of the typed line: when the input
            # reaches the terminal before the shell's first prompt, the answer follows "$ "
            await type_line(job.op, "echo before", re.compile(rb"(?<!echo )before"))
            await job.op.send_raw(b"{not json\n" + encode_data(b"echo after\n"))
            with trio.move_on_after(0.5):
                await job.op.wait_output(re.compile(rb"(?<!echo )after"))
                raise AssertionError("input after a malformed frame was applied")
            assert not job.op.ended  # the job goes on
            stop.set()
            await job.op.wait_ended()
        assert results[0].killed and results[0].reason == "cancelled"


async def test_pipe_mode_carries_a_large_binary_stream_intact() -> None:
    payload = os.urandom(768 * 1024)
    with trio.fail_after(BOUND):
        async with relay_job(["/bin/cat"], stdio="pipe") as job:
            for i in range(0, len(payload), 100_000):
                await job.op.send(payload[i : i + 100_000])
            await job.op.close_input()
            result = await job.attach()
            assert result == Result(exit_code=0)
            assert job.op.output() == payload


async def test_protocol_128_rc_cp_round_trips_a_file_through_the_worker(
    tmp_path: pathlib.Path,
) -> None:
    """``rc cp`` is a pipe job running tar (§8.3, the exact argv): upload a file, download it
    again, byte for byte. The CLI's refusal of a device held by someone else is the real
    controller's no-wait submit; in the simulation a second submission to a held device waits
    (``queued``) instead of running."""
    payload = bytes(range(256)) * 300 + b"\nend\n"
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w") as tar:
        info = tarfile.TarInfo("weights.bin")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    remote = tmp_path / "remote"
    upload = ["/bin/sh", "-c", 'mkdir -p "$0" && exec tar -xf - -C "$0"', str(remote)]
    download = ["/bin/sh", "-c", 'exec tar -cf - -C "$0" -- "$1"', str(remote), "weights.bin"]
    with trio.fail_after(30):
        async with running() as (ctrl, _):
            up = ctrl.submit(dev("gpu0"), upload, stdio="pipe")
            term = operator(ctrl, up)
            await term.wait_connected(timeout=10)
            blocked = ctrl.submit(dev("gpu0"), ["true"])
            assert ctrl.job(blocked).state == "queued"  # the device is held by the copy
            await term.send(packed.getvalue())
            await term.close_input()
            assert await until_terminal(ctrl, up) == ["running", "succeeded"]
            assert (remote / "weights.bin").read_bytes() == payload
            await until_terminal(ctrl, blocked)
            down = ctrl.submit(dev("gpu0"), download, stdio="pipe")
            term = operator(ctrl, down)
            await term.wait_connected(timeout=10)
            await term.close_input()
            assert await until_terminal(ctrl, down) == ["running", "succeeded"]
            with tarfile.open(fileobj=io.BytesIO(term.output()), mode="r") as tar:
                member = tar.extractfile("weights.bin")
                assert member is not None and member.read() == payload
