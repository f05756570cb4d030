"""The logging setup (fleet_trio.logs, docs/logging.md): formats, levels, context, redaction."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from trio_websocket import open_websocket_url

from fleet_trio.cli import build_parser, main
from fleet_trio.gpu.fake import init_device
from fleet_trio.logs import (
    REDACTED,
    LogSetupError,
    RedactFilter,
    job_context,
    redact_secrets,
    resolve_format,
    resolve_level,
    setup_logging,
    teardown_logging,
)
from fleet_trio.sim import SimController, serve_controller
from fleet_trio.sim.fleet import free_port
from tests.helpers import answer, wait_until, write_worker_yaml

PY = sys.executable
CLI = [PY, "-m", "fleet_trio"]
TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    try:
        yield
    finally:
        teardown_logging()
        root.setLevel(level)
        for h in list(root.handlers):
            if h not in handlers:
                root.removeHandler(h)


def capture(level: str = "DEBUG", fmt: str = "json", **kw: Any) -> io.StringIO:
    out = io.StringIO()
    setup_logging(level, fmt, stream=out, environ={}, **kw)
    return out


def json_lines(text: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in text.splitlines()]
    assert all(isinstance(line, dict) for line in lines)
    return lines


# -- formats ----------------------------------------------------------------------------------


def test_json_line_has_the_documented_keys(restore_logging: None) -> None:
    out = capture()
    ctx = job_context(job_id="j1", task="echo", device="box:gpu0", worker_id="w-1", node_id="n1")
    logging.getLogger("fleet_trio.x").info("job %s: %s", "j1", "done", extra={**ctx, "n": 3})
    (line,) = json_lines(out.getvalue())
    assert list(line) == [
        "ts",
        "level",
        "logger",
        "event",
        "job_id",
        "task",
        "device",
        "worker_id",
        "node_id",
        "n",
    ]
    assert TS.match(line["ts"]), line["ts"]
    assert line["level"] == "INFO" and line["logger"] == "fleet_trio.x"
    assert line["event"] == "job j1: done"
    assert (line["job_id"], line["device"], line["n"]) == ("j1", "box:gpu0", 3)


def test_json_exception_is_an_exc_string_on_one_line(restore_logging: None) -> None:
    out = capture()
    try:
        raise ValueError("boom\nsecond line")
    except ValueError:
        logging.getLogger("fleet_trio.x").exception("it failed", extra={"job_id": "j2"})
    assert out.getvalue().count("\n") == 1
    (line,) = json_lines(out.getvalue())
    assert line["event"] == "it failed" and line["job_id"] == "j2" and line["level"] == "ERROR"
    assert line["exc"].startswith("Traceback") and "ValueError: boom" in line["exc"]


def test_text_line_is_readable_with_key_value_context(restore_logging: None) -> None:
    out = capture(fmt="text")
    extra = {"job_id": "j1", "device": "box:gpu0", "why": "two words"}
    logging.getLogger("fleet_trio.w").warning("job %s: slow", "j1", extra=extra)
    line = out.getvalue().rstrip("\n")
    ts, level, rest = line.split(" ", 2)
    assert TS.match(ts) and level == "WARNING"
    assert rest == 'fleet_trio.w: job j1: slow job_id=j1 device=box:gpu0 why="two words"'


def test_level_filters(restore_logging: None) -> None:
    out = capture(level="WARNING")
    log = logging.getLogger("fleet_trio.x")
    log.info("hidden")
    log.warning("shown")
    assert [line["event"] for line in json_lines(out.getvalue())] == ["shown"]


def test_flag_wins_over_environment_then_default() -> None:
    env = {"FLEET_TRIO_LOG_LEVEL": "info", "FLEET_TRIO_LOG_FORMAT": "JSON"}
    assert resolve_level(None, env) == "INFO" and resolve_format(None, env) == "json"
    assert resolve_level("ERROR", env) == "ERROR" and resolve_format("text", env) == "text"
    assert resolve_level(None, {}) == "WARNING" and resolve_format(None, {}) == "text"
    with pytest.raises(LogSetupError, match=r"\$FLEET_TRIO_LOG_LEVEL: invalid log level 'loud'"):
        resolve_level(None, {"FLEET_TRIO_LOG_LEVEL": "loud"})
    with pytest.raises(LogSetupError, match=r"\$FLEET_TRIO_LOG_FORMAT: invalid log format"):
        resolve_format(None, {"FLEET_TRIO_LOG_FORMAT": "xml"})


def _subcommand_paths() -> list[list[str]]:
    paths: list[list[str]] = []
    todo: list[tuple[list[str], Any]] = [([], build_parser())]
    while todo:
        path, parser = todo.pop()
        for action in parser._actions:
            if hasattr(action, "choices") and isinstance(action.choices, dict):
                for name, sub in action.choices.items():
                    paths.append([*path, name])
                    todo.append(([*path, name], sub))
    return paths


@pytest.mark.parametrize("where", ["before", "after", "both"])
def test_global_flags_before_or_after_every_subcommand(where: str) -> None:
    parser = build_parser()
    paths = _subcommand_paths()
    assert ["node"] in paths and ["worker"] in paths
    for path in paths:
        before = ["--log-level", "info", "--log-format", "json"] if where != "after" else []
        after = ["--log-level", "debug"] if where != "before" else []
        try:
            args, _ = parser.parse_known_args([*before, *path, *after])
        except SystemExit:  # a subcommand that only takes further subcommands
            continue
        want = "DEBUG" if after else "INFO"
        assert (args.log_level, args.log_format) == (want, "json" if before else None), path


def test_cli_environment_and_flag_after_the_subcommand(
    restore_logging: None, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_TRIO_LOG_LEVEL", "info")
    monkeypatch.setenv("FLEET_TRIO_LOG_FORMAT", "json")
    assert main(["exec", "--", "true"]) == 0
    lines = json_lines(capfd.readouterr().err)
    assert lines and all(line["level"] == "INFO" for line in lines)
    assert main(["exec", "--log-format", "text", "--", "true"]) == 0
    err = capfd.readouterr().err
    assert err and not err.startswith("{") and " INFO    fleet_trio." in err
    monkeypatch.setenv("FLEET_TRIO_LOG_LEVEL", "loud")
    assert main(["exec", "--", "true"]) == 2
    assert "$FLEET_TRIO_LOG_LEVEL: invalid log level 'loud'" in capfd.readouterr().err


def test_bad_level_flag_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["node", "--log-level", "loud"])
    assert exit_.value.code == 2
    assert "--log-level: invalid choice: 'LOUD'" in capsys.readouterr().err


# -- redaction --------------------------------------------------------------------------------

SECRET = "s3cr3t-Tok/en+value"


def test_redaction_patterns_in_message_args_extra_and_traceback(restore_logging: None) -> None:
    out = capture(secrets=[SECRET])
    log = logging.getLogger("fleet_trio.x")
    log.info("header %s", {"Authorization": "Bearer abcdef123"})
    log.info("raw (b'Authorization', b'Basic dXNlcjpwYXNz')")
    log.info("GET http://h:1/fleet/jobs/j/tail?from=0&token=qwerty99&streams=stdout")
    log.info("connect to https://user:hunter22@example.com/x")
    log.info('summary {"tail_token": "zzz-secret", "host": "box"}')
    log.info("configured %s and encoded %s", SECRET, "s3cr3t-Tok%2Fen%2Bvalue")
    log.warning("extra", extra={"token": "plain-token-1", "headers": {"authorization": "x y"}})
    try:
        raise RuntimeError(f"request failed: Authorization: Bearer {SECRET}")
    except RuntimeError:
        log.exception("with traceback")
    text = out.getvalue()
    for leaked in (
        "abcdef123",
        "dXNlcjpwYXNz",
        "qwerty99",
        "hunter22",
        "zzz-secret",
        SECRET,
        "s3cr3t-Tok%2Fen%2Bvalue",
        "plain-token-1",
        "x y",
    ):
        assert leaked not in text, leaked
    lines = json_lines(text)
    assert len(lines) == 8
    assert lines[0]["event"] == "header {'Authorization': 'Bearer [REDACTED]'}"
    assert "from=0&token=[REDACTED]&streams=stdout" in lines[2]["event"]
    assert "https://user:[REDACTED]@example.com/x" in lines[3]["event"]
    assert lines[6]["token"] == REDACTED and lines[6]["headers"] == {"authorization": REDACTED}
    assert "RuntimeError: request failed" in lines[7]["exc"]


def test_secrets_added_after_setup_are_redacted(restore_logging: None) -> None:
    out = capture()
    log = logging.getLogger("fleet_trio.x")
    redact_secrets("late-secret-value", None, "")
    log.warning("the value is late-secret-value")
    (line,) = json_lines(out.getvalue())
    assert line["event"] == f"the value is {REDACTED}"


def test_redaction_never_breaks_a_log_call() -> None:
    record = logging.LogRecord("x", logging.INFO, "", 0, "%d items", ("nope",), None)
    assert RedactFilter(["abcd"]).filter(record)
    assert "unformattable" in record.getMessage()


# -- the real thing: a node, a worker and the HTTP libraries at DEBUG, no token anywhere -------


async def _tail_all(url: str) -> list[dict[str, Any]]:
    messages = []
    async with open_websocket_url(url) as ws:
        while True:
            msg = json.loads(await ws.get_message())
            messages.append(msg)
            if msg["type"] in ("end", "error"):
                return messages


async def _stop(proc: trio.Process) -> None:
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
        with trio.move_on_after(15):
            await proc.wait()
    if proc.returncode is None:
        proc.kill()
        await proc.wait()


@pytest.mark.slow
async def test_no_token_in_any_log_line_of_a_node_and_its_clients(
    tmp_path: Path, restore_logging: None
) -> None:
    token = f"node-{uuid.uuid4().hex}"
    gpu = tmp_path / "gpu"
    init_device(str(gpu))
    port = free_port()
    script = "import sys, json; json.load(sys.stdin); print(json.dumps({'ok': True}))"
    (tmp_path / "node.yaml").write_text(
        f"node:\n  listen: 127.0.0.1:{port}\n  timings: {{drain_timeout: 2s, kill_grace: 1s}}\n"
        f"tasks:\n  echo:\n    command: [{json.dumps(PY)}, -c, {json.dumps(script)}]\n"
    )
    err = tmp_path / "node.err"
    # the clients in this process log through the same setup (httpx logs URLs at INFO,
    # trio-websocket its connect URL at DEBUG): their lines are checked too
    ours = capture()
    argv = [*CLI, "--log-format", "json", "node", "-c", str(tmp_path / "node.yaml")]
    argv += ["--gpu", "fake", "--footprints", str(tmp_path / "fp.json"), "--token", token]
    argv += ["--log-level", "DEBUG"]  # after the subcommand, as operators type it
    env = {**os.environ, "FLEET_TRIO_FAKE_GPU_DIR": str(gpu)}
    with trio.fail_after(30), err.open("wb") as err_file:
        proc = await trio.lowlevel.open_process(argv, env=env, stderr=err_file)
        try:
            base = f"http://127.0.0.1:{port}"
            auth = {"Authorization": f"Bearer {token}"}
            async with httpx.AsyncClient(base_url=base) as client:
                health = f"/fleet/health?token={token}"
                r = await wait_until(lambda: answer(client, health, headers=auth), timeout=30)
                assert r.status_code == 200
                assert (await client.get("/fleet/health")).status_code == 401
                job = {"job_id": "j1", "task_type": "echo", "payload": {}}
                r = await client.post("/fleet/dispatch", json=job, headers=auth)
                assert r.status_code == 202, r.text
                messages = await _tail_all(
                    f"ws://127.0.0.1:{port}/fleet/jobs/j1/tail?token={token}"
                )
                assert messages[-1]["type"] == "end" and messages[-1]["state"] == "done"
                r = await client.get("/fleet/jobs/j1", headers=auth)
                assert r.json()["state"] == "done"
        finally:
            await _stop(proc)
    assert proc.returncode == 0
    node_lines = json_lines(err.read_text())
    our_lines = json_lines(ours.getvalue())
    events = [line["event"] for line in node_lines]
    assert "job j1: started (echo)" in events and "job j1: done" in events
    ended = next(line for line in node_lines if line["event"] == "job j1: done")
    assert (ended["job_id"], ended["task"]) == ("j1", "echo")
    # not vacuous: the token was in URLs the libraries logged, and came out redacted
    assert any(
        line["logger"] == "httpx" and f"token={REDACTED}" in line["event"] for line in our_lines
    )
    assert any(
        line["logger"] == "trio-websocket" and f"token={REDACTED}" in line["event"]
        for line in our_lines
    )
    assert token not in err.read_text() and token not in ours.getvalue()


@pytest.mark.slow
async def test_no_token_in_any_log_line_of_a_worker(tmp_path: Path) -> None:
    token = f"ctrl-{uuid.uuid4().hex}"
    tail_token = f"tail-{uuid.uuid4().hex}"
    ctrl = SimController(token=token, reaper_interval=0.05, startup_grace=0.0)
    err = tmp_path / "worker.err"
    tail_port = free_port()
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            url = await nursery.start(serve_controller, ctrl)
            tail = f"tail_listen: 127.0.0.1:{tail_port}\ntail_token: {tail_token}\n"
            cfg = write_worker_yaml(tmp_path, url, token=token, host="logbox", extra=tail)
            env = {k: v for k, v in os.environ.items() if k != "RC_REQUIRE_MANUAL_CLEAR"}
            argv = [*CLI, "--log-level", "DEBUG", "--log-format", "json", "worker", "-c", str(cfg)]
            with err.open("wb") as err_file:
                proc = await trio.lowlevel.open_process(
                    argv, env=env, stdin=subprocess.DEVNULL, stderr=err_file
                )
                try:
                    await ctrl.wait_for(lambda: bool(ctrl.polls()), timeout=15)
                    job = ctrl.submit("logbox:gpu0", ["sh", "-c", "echo hello"])
                    await ctrl.wait_for(lambda: "succeeded" in ctrl.statuses(job), timeout=15)
                    messages = await _tail_all(
                        f"ws://127.0.0.1:{tail_port}/fleet/jobs/{job}/tail?token={tail_token}"
                    )
                    assert messages[-1]["type"] == "end"
                finally:
                    await _stop(proc)
            nursery.cancel_scope.cancel()
    text = err.read_text()
    lines = json_lines(text)
    assert token not in text and tail_token not in text
    started = [line for line in lines if line["event"].startswith(f"job {job}: started")]
    assert started and started[0]["device"] == "logbox:gpu0" and started[0]["worker_id"]
    assert any(line["logger"] == "httpx" for line in lines)  # the controller requests
