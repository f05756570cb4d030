"""The worker's live log tail (``tail_listen:``): a real worker against the sim controller,
real job processes, real websockets (docs/tail.md)."""

from __future__ import annotations

import functools
import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import attrs
import httpx
import pytest
import trio
from trio_websocket import ConnectionRejected, open_websocket_url

from fleet_trio.errors import ConfigError
from fleet_trio.logbus import End, JobLog, LogBus, Output
from fleet_trio.logbus.fanout import TailLimits
from fleet_trio.logbus.tail import (
    CLOSE_BAD_REQUEST,
    CLOSE_NORMAL,
    CLOSE_UNKNOWN_JOB,
    TailError,
    TailEvent,
)
from fleet_trio.logbus.tail import loads as tail_loads
from fleet_trio.logbus.tail_client import tail_url
from fleet_trio.sim import serve_controller
from fleet_trio.worker.config import WorkerConfig, check_tail_listen, load_worker_config
from fleet_trio.worker.listener import TailListenError, serve_tail_listener
from fleet_trio.worker.worker import Worker, serve_worker
from tests.helpers import (
    FAST,
    FAST_CLIENT,
    FakeHooks,
    assert_contiguous,
    collect,
    config,
    dev,
    operated_job,
    running,
    running_with_hooks,
    sim,
    until_terminal,
    wait_until,
)

LINES = 40
SCRIPT = (
    f"for i in $(seq 1 {LINES}); do echo out $i; echo err $i >&2; sleep 0.005; done; printf done"
)
EXPECTED = b"".join(f"out {i}\nerr {i}\n".encode() for i in range(1, LINES + 1)) + b"done"


def tail_on(listen: str = "127.0.0.1:0", token: str = "") -> Callable[[WorkerConfig], WorkerConfig]:
    return lambda c: attrs.evolve(c, tail_listen=listen, tail_token=token)


def ws(worker: Worker, job_id: str, **params: str) -> str:
    assert worker.tail_url is not None
    return tail_url(worker.tail_url, job_id, params)


def output(events: list[TailEvent], stream: str | None = None) -> bytes:
    return b"".join(e.data for e in events if isinstance(e, Output) and stream in (None, e.stream))


async def job_log(worker: Worker, job_id: str) -> None:
    """Wait until the worker has opened the job's live log."""
    await wait_until(lambda: worker.bus.get(job_id) is not None, timeout=10)


# --------------------------------------------------------------------------------------------
# The tail of a running worker
# --------------------------------------------------------------------------------------------


async def test_tail_from_start_every_byte_in_order_then_end() -> None:
    with trio.fail_after(30):
        async with running(configure=tail_on()) as (ctrl, worker):
            assert worker.tail_url is not None and worker.tail_url.startswith("http://127.0.0.1:")
            job = ctrl.submit(dev("gpu0"), ["sh", "-c", SCRIPT])
            await job_log(worker, job)
            events, code = await collect(ws(worker, job))  # live, from the start
            assert code == CLOSE_NORMAL
            assert_contiguous(events)
            # logs mode: one merged stream, as the rc log upload gets it
            assert {e.stream for e in events if isinstance(e, Output)} == {"stdout"}
            assert output(events) == EXPECTED
            end = events[-1]
            assert isinstance(end, End)
            assert (end.state, end.exit_code, end.reason) == ("succeeded", 0, "")
            assert await until_terminal(ctrl, job) == ["running", "succeeded"]
            # the rc log upload still gets every byte
            await ctrl.wait_for(lambda: ctrl.logs(job) == EXPECTED, timeout=10)
            # a replay of the ended log has the same bytes and end (framing may differ)
            again, code = await collect(ws(worker, job))
            assert code == CLOSE_NORMAL and again[-1] == end
            assert_contiguous(again)
            assert output(again) == EXPECTED


async def test_failed_job_ends_failed_with_its_exit_code() -> None:
    with trio.fail_after(30):
        async with running(configure=tail_on()) as (ctrl, worker):
            job = ctrl.submit(dev("gpu0"), ["sh", "-c", "echo bye; exit 3"])
            assert await until_terminal(ctrl, job) == ["running", "failed"]
            events, code = await collect(ws(worker, job))
            assert code == CLOSE_NORMAL and output(events) == b"bye\n"
            end = events[-1]
            report = ctrl.status_reports(job)[-1]
            assert isinstance(end, End)
            assert (end.state, end.exit_code, end.reason) == ("failed", 3, report.reason)


async def test_killed_job_tail_ends_killed() -> None:
    with trio.fail_after(30):
        async with running(configure=tail_on()) as (ctrl, worker):
            job = ctrl.submit(dev("gpu0"), ["sh", "-c", "echo started; exec sleep 30"])
            await job_log(worker, job)
            result: list[tuple[list[TailEvent], int | None]] = []

            async def tail() -> None:
                result.append(await collect(ws(worker, job)))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(tail)
                log = worker.bus.get(job)
                assert log is not None
                await wait_until(lambda: not (log.nbytes < len(b"started\n")))
                ctrl.kill(job)
            events, code = result[0]
            assert code == CLOSE_NORMAL
            assert output(events) == b"started\n"
            end = events[-1]
            assert isinstance(end, End) and end.state == "killed"
            assert end.reason == ctrl.status_reports(job)[-1].reason == "cancelled"
            assert await until_terminal(ctrl, job) == ["running", "killed"]


async def test_unknown_job_and_bad_query() -> None:
    with trio.fail_after(30):
        async with running(configure=tail_on()) as (ctrl, worker):
            events, code = await collect(ws(worker, "no-such-job"))
            assert events == [TailError("unknown job")] and code == CLOSE_UNKNOWN_JOB
            job = ctrl.submit(dev("gpu0"), ["true"])
            await job_log(worker, job)
            events, code = await collect(ws(worker, job, **{"from": "-1"}))
            assert code == CLOSE_BAD_REQUEST
            assert len(events) == 1 and isinstance(events[0], TailError)


async def test_token_required_when_set() -> None:
    with trio.fail_after(30):
        async with running(configure=tail_on(token="s3cret")) as (ctrl, worker):
            job = ctrl.submit(dev("gpu0"), ["sh", "-c", "echo hi"])
            assert await until_terminal(ctrl, job) == ["running", "succeeded"]
            for headers, params in (
                ([], {}),
                ([(b"Authorization", b"Bearer wrong")], {}),
                ([], {"token": "wrong"}),
            ):
                with pytest.raises(ConnectionRejected) as info:
                    await collect(ws(worker, job, **params), headers)
                assert info.value.status_code == 401
                assert json.loads(info.value.body or b"{}") == {
                    "status": "error",
                    "error": "unauthorized",
                }
            ok, code = await collect(ws(worker, job), [(b"Authorization", b"Bearer s3cret")])
            assert code == CLOSE_NORMAL and output(ok) == b"hi\n" and isinstance(ok[-1], End)
            ok, code = await collect(ws(worker, job, token="s3cret"))
            assert code == CLOSE_NORMAL and output(ok) == b"hi\n"


async def test_pipe_job_stdout_and_stderr_are_teed_into_the_tail() -> None:
    with trio.fail_after(30):
        async with running(configure=tail_on()) as (ctrl, worker):
            command = ["sh", "-c", "cat; echo to-stderr >&2"]
            job, _ = await operated_job(ctrl, command, "pipe", b"typed\n", b"typed\n")
            events, code = await collect(ws(worker, job))
            assert code == CLOSE_NORMAL
            # stdout goes to the operator and the tail; stderr to the log endpoint and the tail
            assert output(events, "stderr") == b"to-stderr\n"
            assert output(events, "stdout") == b"typed\n"
            end = events[-1]
            assert isinstance(end, End) and (end.state, end.exit_code) == ("succeeded", 0)
            await ctrl.wait_for(lambda: ctrl.logs(job) == b"to-stderr\n")


async def test_tty_job_output_is_teed_into_the_tail() -> None:
    with trio.fail_after(30):
        async with running(configure=tail_on()) as (ctrl, worker):
            job, term = await operated_job(
                ctrl, ["/bin/sh"], "tty", b"echo tty-$((6 * 7))\n", b"tty-42"
            )
            events, code = await collect(ws(worker, job))
            assert code == CLOSE_NORMAL
            assert b"tty-42" in output(events, "stdout")
            assert output(events, "stdout") == term.output()
            assert ctrl.logs(job) == b""  # a tty's output never reaches the log endpoint


# --------------------------------------------------------------------------------------------
# The bus without the listener: ends, and never in a job's way
# --------------------------------------------------------------------------------------------


async def test_acquire_failure_ends_the_log_failed() -> None:
    hooks = FakeHooks(acquire_fails="exit status 3")
    with trio.fail_after(20):
        async with running_with_hooks(hooks) as (ctrl, worker):
            assert worker.tail_url is None  # no tail_listen: no listener, the bus still fills
            job = ctrl.submit(dev("gpu0"), ["sh", "-c", "echo RAN"])
            await ctrl.wait_for(lambda: ctrl.statuses(job) == ["failed"])
            log = worker.bus.get(job)
            assert log is not None and log.ended is not None
            assert (log.ended.state, log.ended.exit_code, log.ended.reason) == (
                "failed",
                None,
                "acquire hook failed: exit status 3",
            )


async def test_a_broken_bus_never_fails_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken(self: JobLog, stream: str, data: bytes) -> None:
        raise RuntimeError("bus on fire")

    monkeypatch.setattr(JobLog, "write", broken)
    with trio.fail_after(30):
        async with running() as (ctrl, worker):
            job = ctrl.submit(dev("gpu0"), ["sh", "-c", "echo one; echo two"])
            assert await until_terminal(ctrl, job) == ["running", "succeeded"]
            await ctrl.wait_for(lambda: ctrl.logs(job) == b"one\ntwo\n")
            log = worker.bus.get(job)
            assert log is not None and log.ended is not None and log.ended.state == "succeeded"


FLOOD = (
    "import sys\n"
    "out = sys.stdout.buffer\n"
    "for i in range(20000):\n"
    "    out.write(b'line %06d ' % i + b'x' * 40 + b'\\n')\n"
)


async def test_the_log_upload_reads_the_bus_and_loses_nothing_beyond_its_history() -> None:
    expected = b"".join(b"line %06d " % i + b"x" * 40 + b"\n" for i in range(20000))
    with trio.fail_after(60):
        async with running() as (ctrl, worker):
            worker.bus = LogBus(history_bytes=4096)  # ~1 MB of output through a 4 KiB history
            job = ctrl.submit(dev("gpu0"), [sys.executable, "-c", FLOOD])
            assert await until_terminal(ctrl, job) == ["running", "succeeded"]
            await ctrl.wait_for(lambda: len(ctrl.logs(job)) >= len(expected), timeout=20)
            assert ctrl.logs(job) == expected
            assert all(len(c) <= 1 << 20 for c in ctrl.log_chunks(job))
            log = worker.bus.get(job)
            assert log is not None and log.nbytes == len(expected)
            # the upload has let go: the history is back within its limit
            assert log.history.size <= max(4096, len(log.history.chunks()[-1][2]))


async def test_a_port_in_use_leaves_the_worker_running_without_a_tail() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with trio.fail_after(30):
            async with running(configure=tail_on(f"127.0.0.1:{port}")) as (ctrl, worker):
                assert worker.tail_url is None
                job = ctrl.submit(dev("gpu0"), ["sh", "-c", "echo fine"])
                assert await until_terminal(ctrl, job) == ["running", "succeeded"]
                await ctrl.wait_for(lambda: ctrl.logs(job) == b"fine\n")


async def test_a_port_in_use_is_a_start_error_naming_the_address() -> None:
    """The bind failure comes out of the shared server start (nursery.httpserve.serve_http)
    as the listener's own error, with the node's wording."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                with pytest.raises(TailListenError) as info:
                    await nursery.start(serve_tail_listener, LogBus(), f"127.0.0.1:{port}")
    assert str(info.value).startswith(f"cannot listen on 127.0.0.1:{port}: [Errno 98]")
    assert isinstance(info.value.__cause__, OSError)


# --------------------------------------------------------------------------------------------
# Config: tail_listen / tail_token, the listen guard, the CLI flag
# --------------------------------------------------------------------------------------------

BASE = "controller_url: http://c\ndevices: [g]\n"


def load(tmp_path: Path, text: str) -> WorkerConfig:
    path = tmp_path / "worker.yaml"
    path.write_text(BASE + text)
    return load_worker_config(path, environ={}, hostname=lambda: "gpubox")


def test_config_reads_tail_listen_and_token(tmp_path: Path) -> None:
    cfg = load(tmp_path, "tail_listen: 127.0.0.1:18812\ntail_token: s3cret\n")
    assert (cfg.tail_listen, cfg.tail_token) == ("127.0.0.1:18812", "s3cret")
    assert "tail_listen" not in cfg.ignored_keys and "tail_token" not in cfg.ignored_keys
    summary = cfg.to_summary()
    assert summary["tail_listen"] == "127.0.0.1:18812"
    assert summary["tail_token"] == "(redacted)"
    off = load(tmp_path, "")
    assert (off.tail_listen, off.tail_token) == ("", "")
    assert load(tmp_path, 'tail_listen: ""\n').tail_listen == ""
    assert load(tmp_path, "tail_listen: '[::1]:0'\n").tail_listen == "[::1]:0"


@pytest.mark.parametrize(
    "value", ["nope", "127.0.0.1", "127.0.0.1:http", "127.0.0.1:70000", "[::1", "a:b:c"]
)
def test_config_bad_tail_listen_names_key_and_file(tmp_path: Path, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, f"tail_listen: {json.dumps(value)}\n")
    err = info.value
    assert err.key == "tail_listen"
    assert str(err).startswith(f"{tmp_path / 'worker.yaml'}: tail_listen: ")
    assert "\n" not in str(err)


def test_non_loopback_needs_the_trusted_network_flag(tmp_path: Path) -> None:
    for addr in ("127.0.0.1:1", "127.5.0.1:1", "localhost:1", "[::1]:1"):
        check_tail_listen(load(tmp_path, f"tail_listen: '{addr}'\n"), False)
    for addr in ("0.0.0.0:18812", "100.64.0.7:18812", ":18812", "[::]:1", "example.com:1"):
        cfg = load(tmp_path, f"tail_listen: '{addr}'\n")
        with pytest.raises(ConfigError) as info:
            check_tail_listen(cfg, False)
        assert info.value.key == "tail_listen"
        assert str(info.value).startswith(f"{tmp_path / 'worker.yaml'}: tail_listen: ")
        assert "--listen-trusted-network" in str(info.value)
        check_tail_listen(cfg, True)
    check_tail_listen(load(tmp_path, ""), False)  # off: nothing to check


async def test_serve_worker_refuses_a_non_loopback_tail_without_the_flag() -> None:
    ctrl = sim()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            url = await nursery.start(serve_controller, ctrl)
            cfg = attrs.evolve(config(url), tail_listen="0.0.0.0:0")
            worker = Worker(cfg, timings=FAST, client_timings=FAST_CLIENT)
            with pytest.raises(ConfigError, match="tail_listen"):
                await serve_worker(worker)
            assert not ctrl.registrations()
            nursery.cancel_scope.cancel()


async def test_cli_worker_flag(tmp_path: Path) -> None:
    path = tmp_path / "worker.yaml"
    path.write_text(BASE + "tail_listen: 0.0.0.0:18812\n")

    async def cli(*args: str) -> subprocess.CompletedProcess[bytes]:
        with trio.fail_after(30):
            return await trio.run_process(
                [sys.executable, "-m", "fleet_trio", "worker", "-c", str(path), *args],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                env={**os.environ, "RC_TOKEN": ""},
            )

    refused = await cli("--check")
    assert refused.returncode == 1
    assert f"{path}: tail_listen: refusing to bind".encode() in refused.stderr
    allowed = await cli("--check", "--listen-trusted-network")
    assert allowed.returncode == 0, allowed.stderr
    assert json.loads(allowed.stdout)["tail_listen"] == "0.0.0.0:18812"
    usage = await cli("--help")
    assert b"--listen-trusted-network" in usage.stdout and b"tail_listen" in usage.stdout


async def test_browser_page_and_job_list_on_the_worker_listener() -> None:
    with trio.fail_after(30):
        async with running(configure=tail_on(token="tt")) as (ctrl, worker):
            job = ctrl.submit(dev("gpu0"), ["sh", "-c", "echo hi"])
            assert await until_terminal(ctrl, job) == ["running", "succeeded"]
            assert worker.tail_url is not None
            async with httpx.AsyncClient(base_url=worker.tail_url) as http:
                page = await http.get("/fleet/ui")
                assert page.status_code == 200
                assert page.headers["content-type"].startswith("text/html")
                assert (await http.get("/fleet/ui/jobs")).status_code == 401
                jobs = await http.get("/fleet/ui/jobs", headers={"Authorization": "Bearer tt"})
                assert jobs.status_code == 200
                listed = {j["job_id"]: j for j in jobs.json()}
                assert listed[job]["state"] == "succeeded"
                by_query = await http.get("/fleet/ui/jobs", params={"token": "tt"})
                assert by_query.status_code == 200


# --------------------------------------------------------------------------------------------
# Caps on live tails: max_tails, max_tails_per_job (docs/tail.md "Many tails")
# --------------------------------------------------------------------------------------------


async def test_listener_refuses_tails_beyond_its_caps_until_one_leaves() -> None:
    bus = LogBus()
    log = bus.open("w-watched")
    await log.write("stdout", b"hello\n")
    bus.open("w-other")
    limits = TailLimits(max_tails=2, max_tails_per_job=1)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            base = await nursery.start(
                functools.partial(serve_tail_listener, bus, "127.0.0.1:0", limits=limits)
            )

            async def refused(job_id: str) -> tuple[int, object]:
                with pytest.raises(ConnectionRejected) as info:
                    async with open_websocket_url(tail_url(base, job_id, {})):
                        pass
                return info.value.status_code, json.loads(info.value.body or b"{}")

            too_many = (503, {"status": "error", "error": "too many tails"})
            async with open_websocket_url(tail_url(base, "w-watched", {})) as first:
                assert isinstance(tail_loads(await first.get_message()), Output)
                assert await refused("w-watched") == too_many  # the 2nd of one job
                async with open_websocket_url(tail_url(base, "w-other", {})):
                    assert await refused("w-third") == too_many  # the 3rd in all
            # both clients gone: their slots come back, and a new tail is served

            async def served() -> bool:
                try:
                    async with open_websocket_url(tail_url(base, "w-watched", {})) as ws:
                        return isinstance(tail_loads(await ws.get_message()), Output)
                except ConnectionRejected as exc:
                    assert exc.status_code == 503
                    return False

            await wait_until(served, what="a tail served once the others left")
            nursery.cancel_scope.cancel()


def test_config_reads_the_tail_caps(tmp_path: Path) -> None:
    cfg = load(tmp_path, "max_tails: 10\nmax_tails_per_job: 4\n")
    assert (cfg.max_tails, cfg.max_tails_per_job) == (10, 4)
    assert not cfg.ignored_keys
    default = load(tmp_path, "")
    assert (default.max_tails, default.max_tails_per_job) == (256, 32)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("max_tails: 0\n", "max_tails"),
        ("max_tails_per_job: -3\n", "max_tails_per_job"),
        ("max_tails: many\n", "max_tails"),
        ("max_tails_per_job: 2.5\n", "max_tails_per_job"),
        ("max_tails: true\n", "max_tails"),
    ],
)
def test_config_bad_tail_caps_name_key_and_file(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text)
    assert info.value.key == key
    assert str(info.value).startswith(f"{tmp_path / 'worker.yaml'}: {key}: ")
