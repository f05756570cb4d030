"""The task registry and runner (node.md §6.6), with real child processes."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest
import trio

from fleet_trio.errors import ConfigError, WireError
from fleet_trio.node.config import config_from_mapping
from fleet_trio.node.jobs import Done, Failed
from fleet_trio.node.tasks import TaskRegistry, TaskRunner
from tests.helpers import wait_until
from tests.node.conftest import PY, TASK_SCRIPT


def registry(tmp_path: Path, **tasks: dict[str, object]) -> TaskRegistry:
    (tmp_path / "task.py").write_text(TASK_SCRIPT)
    cfg = config_from_mapping(
        {"tasks": tasks}, path=str(tmp_path / "n.yaml"), base_dir=str(tmp_path)
    )
    return TaskRegistry(cfg.tasks, base_dir=cfg.base_dir, work_root=str(tmp_path))


def echo_task(**extra: object) -> dict[str, object]:
    return {"command": [PY, "task.py", "--dir", "{work_dir}", "{job_id}"], **extra}


def test_advertising_in_declaration_order(tmp_path: Path) -> None:
    reg = registry(
        tmp_path,
        **{
            "b-task": echo_task(family="wan2.2"),
            "a-task": echo_task(family="wan2.2"),
            "c-task": echo_task(family="sdxl"),
            "off": echo_task(enabled=False),
            "missing": {"command": ["./no-such-binary"]},
        },
    )
    assert reg.supported == ("b-task", "a-task", "c-task")
    assert reg.families == ("wan2.2", "sdxl")


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ('"x"', "t payload: must be a JSON object"),
        ("[1]", "t payload: must be a JSON object"),
        (None, "t payload: graph required (a graph)"),
        ('{"graph": null}', "t payload: graph required (a graph)"),
        ('{"graph": "s"}', "t payload: graph must be a JSON object"),
        ('{"graph": {}}', "t payload: graph must be a non-empty JSON object"),
        ('{"graph": {"a": 1}, "n": 1.5}', "t payload: n must be a JSON integer"),
        ('{"graph": {"a": 1}, "n": true}', "t payload: n must be a JSON integer"),
        ('{"graph": {"a": 1}, "s": 3}', "t payload: s must be a JSON string"),
        ('{"graph": {"a": 1}, "b": "true"}', "t payload: b must be a JSON boolean"),
    ],
)
def test_validation_messages(tmp_path: Path, payload: str | None, message: str) -> None:
    reg = registry(
        tmp_path,
        t=echo_task(
            payload={
                "graph": {"type": "object", "required": True, "non_empty": True, "hint": "a graph"},
                "n": {"type": "integer"},
                "s": {"type": "string"},
                "b": {"type": "boolean"},
            }
        ),
    )
    with pytest.raises(WireError) as info:
        reg.prepare("t", payload, "j")
    assert str(info.value) == message and info.value.status == 400
    assert [p for p in tmp_path.iterdir() if p.name.startswith("fleet-job-")] == []


def test_unsupported_lists_supported(tmp_path: Path) -> None:
    reg = registry(tmp_path, **{"image-gen": echo_task(), "run-graph": echo_task()})
    with pytest.raises(WireError) as info:
        reg.prepare("llm", None, "j")
    assert str(info.value) == 'unsupported task_type "llm" (supported: image-gen, run-graph)'


async def test_runs_with_raw_stdin_env_placeholders_and_cleans_up(tmp_path: Path) -> None:
    reg = registry(
        tmp_path,
        t=echo_task(materialize={"graph": "graph.json"}, family="fam", env={"X": "1"}),
    )
    raw = '{"graph" : {"b":1.50,  "a":[1]}, "n": 1}'
    job = reg.prepare("t", raw, "job-1")
    graph = Path(job.files["graph"])
    assert graph.read_text() == '{"b":1.50,  "a":[1]}'
    with trio.fail_after(10):
        outcome = await TaskRunner(kill_grace=1).execute(job)
    assert isinstance(outcome, Done)
    data = json.loads(outcome.data)
    assert data["stdin"] == raw
    assert data["argv"] == ["--dir", job.work_dir, "job-1"]
    env = data["env"]
    assert env["FLEET_JOB_ID"] == "job-1" and env["FLEET_TASK_TYPE"] == "t"
    assert env["FLEET_FAMILY"] == "fam" and env["FLEET_FILE_GRAPH"] == str(graph)
    assert not os.path.exists(job.work_dir)
    job.cleanup()  # item 77: can always be called


async def test_failures_map_to_messages(tmp_path: Path) -> None:
    # the timeout case has its own short timeout; the others a long one, so an interpreter
    # slow to start on a loaded machine is not read as a timeout
    reg = registry(tmp_path, t=echo_task(timeout="60s"), short=echo_task(timeout="300ms"))
    runner = TaskRunner(kill_grace=0.5)
    with trio.fail_after(20):
        outcome = await runner.execute(reg.prepare("short", '{"sleep": 5}', "j"))
    assert outcome == Failed("short failed: timed out after 300ms")
    cases = [
        ('{"exit": 3, "stderr": "boom"}', "t failed: exit status 3 (boom)"),
        ('{"stdout": "not json"}', "t failed: result is not a JSON object (not json)"),
        ('{"stdout": ""}', "t failed: result is not a JSON object"),
        ('{"result": {"deferred": true, "code": "C", "detail": "d"}}', "C: d"),
        ('{"result": {"deferred": true, "reason": "gpu_busy: x"}}', "gpu_busy: x"),
        ('{"result": {"deferred": true}}', "deferred"),
    ]
    with trio.fail_after(20):
        for raw, message in cases:
            outcome = await runner.execute(reg.prepare("t", raw, "j"))
            assert outcome == Failed(message), raw


async def test_stderr_tail_is_last_400_bytes(tmp_path: Path) -> None:
    reg = registry(tmp_path, t=echo_task())
    err = "x" * 1000 + "END"
    with trio.fail_after(10):
        outcome = await TaskRunner(kill_grace=1).execute(
            reg.prepare("t", json.dumps({"exit": 1, "stderr": err}), "j")
        )
    assert isinstance(outcome, Failed)
    assert outcome.message == f"t failed: exit status 1 ({err[-400:]})"


async def test_gpu_tasks_run_one_at_a_time(tmp_path: Path) -> None:
    reg = registry(tmp_path, t=echo_task(gpu=True))
    runner = TaskRunner(kill_grace=1)
    t0 = trio.current_time()
    with trio.fail_after(10):
        async with trio.open_nursery() as n:
            for i in range(2):
                n.start_soon(runner.execute, reg.prepare("t", '{"sleep": 0.3}', f"j{i}"))
    assert trio.current_time() - t0 >= 0.6


async def test_an_escaped_process_is_swept_by_its_job_marker(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pid_file = tmp_path / "escapee.pid"
    script = f"setsid sh -c 'echo $$ > {pid_file}; exec sleep 300' </dev/null >/dev/null 2>&1 &"
    script += f' while [ ! -s {pid_file} ]; do sleep 0.01; done; echo "{{}}"'
    cfg = config_from_mapping(
        {"tasks": {"esc": {"command": ["sh", "-c", script]}}},
        path=str(tmp_path / "node.yaml"),
        base_dir=str(tmp_path),
    )
    registry = TaskRegistry(cfg.tasks, base_dir=str(tmp_path), work_root=str(tmp_path))
    runner = TaskRunner(kill_grace=1.0)
    job = registry.prepare("esc", None, "esc-1")
    with trio.fail_after(20):
        outcome = await runner.execute(job)
    assert isinstance(outcome, Done)
    pid = int(pid_file.read_text())
    # found by its FLEET_JOB_ID and killed before the job ended (gone, or a zombie of init's)
    state = ""
    with contextlib.suppress(FileNotFoundError):
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    assert state in ("", "Z"), state
    assert any("outlived the group" in r.getMessage() for r in caplog.records)


async def test_expect_file_path_with_nul_is_a_failed_job_not_a_crash(tmp_path: Path) -> None:
    # The path comes from the job's own result (its stdout), so it is job output: a NUL in it
    # (or a path too long for the OS) fails that job with the usual message.
    reg = registry(tmp_path, t=echo_task(timeout="60s", expect_file="out"))
    runner = TaskRunner(kill_grace=0.5)
    cases = {
        "a\u0000b": "t failed: expected file out='a\\x00b' is missing or empty",
        "x" * 5000: f"t failed: expected file out={'x' * 5000!r} is missing or empty",
    }
    with trio.fail_after(20):
        for path, message in cases.items():
            raw = json.dumps({"result": {"out": path}})
            outcome = await runner.execute(reg.prepare("t", raw, "j"))
            assert outcome == Failed(message)


@pytest.mark.parametrize("name", ["A=B", ""])
def test_an_environment_name_no_process_can_get_is_a_config_error(
    tmp_path: Path, name: str
) -> None:
    """Python refuses ``A=B`` as an environment name (and ``""`` is none): every job of the
    task would fail to start; the config names the key instead."""
    with pytest.raises(ConfigError, match=r"tasks\.t\.env: an environment name must be"):
        config_from_mapping(
            {"tasks": {"t": {"command": ["true"], "env": {name: "x"}}}},
            path=str(tmp_path / "n.yaml"),
            base_dir=str(tmp_path),
        )


async def test_a_result_over_the_cap_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """stdout over RESULT_CAP was reported with only its last bytes (or nothing, when they were
    whitespace): the message now names the cap."""
    monkeypatch.setattr("fleet_trio.node.tasks.RESULT_CAP", 1024)  # the job prints 2 KiB
    reg = registry(tmp_path, t=echo_task(timeout="60s"))
    runner = TaskRunner(kill_grace=0.5)
    with trio.fail_after(20):
        outcome = await runner.execute(reg.prepare("t", json.dumps({"stdout": " " * 2048}), "j"))
    assert outcome == Failed("t failed: result is not a JSON object (stdout over the 1KiB cap)")


async def test_the_nodes_token_in_its_environment_is_not_passed_to_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``FLEET_TRIO_TOKEN`` (the node's own API token, and the tail client's default) reached
    every job, which could then dispatch or read other jobs' output as an operator."""
    monkeypatch.setenv("FLEET_TRIO_TOKEN", "s3cret-node-token")
    monkeypatch.setenv("RC_TOKEN", "s3cret-worker-token")
    script = 'printf \'{"t": "%s|%s"}\' "${FLEET_TRIO_TOKEN-unset}" "${RC_TOKEN-unset}"'
    reg = registry(tmp_path, t={"command": ["sh", "-c", script]})
    with trio.fail_after(20):
        outcome = await TaskRunner(kill_grace=0.5).execute(reg.prepare("t", "{}", "j"))
    assert outcome == Done(b'{"t": "unset|unset"}')


async def test_a_shutdown_does_not_wait_long_for_a_slow_work_dir_removal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job cancelled by the shutdown still removes its work dir, but a removal that takes
    long (hundreds of thousands of files) held the shutdown up to its 10 s bound, past the
    documented shutdown bound; the next start's recovery removes what is left."""
    import time

    from fleet_trio.node import tasks as tasks_module

    reg = registry(tmp_path, t=echo_task(timeout="60s"))
    job = reg.prepare("t", '{"sleep": 30}', "j")
    removal_started = trio.Event()
    token = trio.lowlevel.current_trio_token()

    def slow_cleanup() -> None:
        token.run_sync_soon(removal_started.set)
        time.sleep(4)  # a big tree: far longer than the shutdown's share

    monkeypatch.setattr(tasks_module.PreparedJob, "cleanup", lambda self: slow_cleanup())
    runner = TaskRunner(kill_grace=0.5)
    started = os.path.join(job.work_dir, "stdin.txt")  # the task script writes it first
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(runner.execute, job)
            await wait_until(lambda: os.path.exists(started), what="the job runs")
            cancelled_at = trio.current_time()
            nursery.cancel_scope.cancel()  # the job is stopped (its kill grace), then removed
    assert removal_started.is_set()
    assert trio.current_time() - cancelled_at < 3.0
    assert tasks_module.SHUTDOWN_CLEANUP_BOUND <= 1.0


@pytest.mark.parametrize("value", ["é", ["a"], 3])
def test_a_payload_field_that_is_not_a_mapping_says_so(tmp_path: Path, value: object) -> None:
    """It was ``unknown error ('str' object has no attribute 'keys')``."""
    with pytest.raises(ConfigError) as info:
        config_from_mapping(
            {"tasks": {"t": {"command": ["true"], "payload": {"prompt": value}}}},
            path=str(tmp_path / "n.yaml"),
            base_dir=str(tmp_path),
        )
    assert "tasks.t.payload.prompt: expected a mapping" in str(info.value)
