"""``fleet-trio`` run as a real subprocess (``python -m fleet_trio``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from pathlib import Path
from typing import Any

import trio

from fleet_trio import __version__
from fleet_trio.proc.procfs import job_env_id, pid_alive
from tests.helpers import CLI, fleet, scenario_pause, wait_until


def last_json(stdout: bytes) -> dict[str, Any]:
    lines = stdout.decode().splitlines()
    assert lines, "no stdout at all"
    value: dict[str, Any] = json.loads(lines[-1])
    return value


def one_line(stderr: bytes) -> str:
    text = stderr.decode()
    assert text.endswith("\n") and text.count("\n") == 1, text
    return text[:-1]


# -- exit codes and streams -----------------------------------------------------------------


async def test_exit_code_passes_through() -> None:
    done = await fleet("exec", "--", "sh", "-c", "exit 3")
    assert done.returncode == 3
    assert done.stdout == b"" and done.stderr == b""


async def test_signal_death_exits_128_plus_n() -> None:
    done = await fleet("exec", "--json", "--", "sh", "-c", "kill -9 $$")
    assert done.returncode == 137
    res = last_json(done.stdout)
    assert res["exit_code"] == 137 and res["killed"] is True
    assert res["reason"] == "signal: killed"


async def test_stdout_and_stderr_stay_separate() -> None:
    done = await fleet("exec", "--", "sh", "-c", "echo out; echo err >&2; echo out2")
    assert done.returncode == 0
    assert done.stdout == b"out\nout2\n"
    assert done.stderr == b"err\n"


async def test_large_output_passes_through_uncapped() -> None:
    done = await fleet("exec", "--", "head", "-c", "1000000", "/dev/zero")
    assert done.returncode == 0
    assert len(done.stdout) == 1_000_000


async def test_command_without_double_dash() -> None:
    done = await fleet("exec", "echo", "-n", "hi")
    assert done.returncode == 0 and done.stdout == b"hi"


async def test_json_is_the_last_stdout_line() -> None:
    done = await fleet("exec", "--json", "--", "sh", "-c", "echo first; echo e >&2; printf partial")
    assert done.returncode == 0
    lines = done.stdout.decode().splitlines()
    assert lines[:2] == ["first", "partial"]  # a partial last line is ended before the JSON
    assert len(lines) == 3
    assert json.loads(lines[-1]) == {
        "exit_code": 0,
        "killed": False,
        "reason": "",
        "error": None,
        "sweep": None,  # no --job-id: no sweep, so no claim of clean or dirty
    }
    assert done.stderr == b"e\n"


async def test_job_id_and_cwd_reach_the_job(tmp_path: Path) -> None:
    cmd = ["sh", "-c", 'echo "$RC_JOB_ID"; pwd']
    done = await fleet("exec", "--job-id", "J-1", "--cwd", str(tmp_path), "--", *cmd)
    assert done.returncode == 0
    assert done.stdout.decode().splitlines() == ["J-1", str(tmp_path)]


async def test_stdin_is_dev_null() -> None:
    # Our own stdin is a pipe we never close: the job must not be reading it.
    with trio.fail_after(20):
        proc = await trio.lowlevel.open_process(
            [*CLI, "exec", "--", "sh", "-c", "cat; echo done"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        try:
            assert proc.stdout is not None
            out = b""
            while chunk := await proc.stdout.receive_some(4096):
                out += chunk
            assert await proc.wait() == 0
            assert out == b"done\n"
        finally:
            assert proc.stdin is not None
            await proc.stdin.aclose()


# -- watchdogs --------------------------------------------------------------------------------


async def test_max_runtime_kills_the_job() -> None:
    start = trio.current_time()
    done = await fleet("exec", "--json", "--max-runtime", "300ms", "--", "sleep", "60")
    assert trio.current_time() - start < 10
    assert done.returncode == 143
    res = last_json(done.stdout)
    assert res["killed"] is True
    assert res["reason"] == "max_runtime exceeded (300ms)"
    assert res["error"] is None


async def test_a_stopped_job_says_why_without_json() -> None:
    """Without --json the exit status alone (143) does not tell a timeout from a job that
    died of SIGTERM: the reason is one line on stderr."""
    done = await fleet("exec", "--max-runtime", "300ms", "--", "sleep", "60")
    assert done.returncode == 143
    assert done.stdout == b""
    assert one_line(done.stderr) == "fleet-trio exec: killed: max_runtime exceeded (300ms)"
    done = await fleet("exec", "--json", "--max-runtime", "300ms", "--", "sleep", "60")
    assert done.stderr == b""  # with --json the reason is in the JSON line only


async def test_idle_timeout_kills_the_job() -> None:
    done = await fleet("exec", "--json", "--idle-timeout", "300ms", "--", "sleep", "60")
    assert done.returncode == 143
    assert last_json(done.stdout)["reason"] == "idle: no output for 300ms"


async def test_grace_bounds_a_term_ignoring_job() -> None:
    """The limit (1.5 s: a shell still installing its trap when a short one tripped would die
    of the SIGTERM, 143) comes after the job said its trap is in place (``trapped``)."""
    start = trio.current_time()
    done = await fleet(
        "exec", "--json", "--grace", "300ms", "--max-runtime", "1500ms", "--",
        "sh", "-c", "trap '' TERM; echo trapped; sleep 60",
    )  # fmt: skip
    assert trio.current_time() - start < 15
    assert done.stdout.startswith(b"trapped\n")
    assert done.returncode == 137  # SIGTERM ignored, SIGKILL after the 300 ms grace
    assert last_json(done.stdout)["reason"] == "max_runtime exceeded (1.5s)"


# -- the sweep (needs fleet_trio/proc/sweep.py) -------------------------------------------------


async def _escapee_case(shell: str) -> None:
    job_id = f"cli-test-{uuid.uuid4()}"
    done = await fleet("exec", "--job-id", job_id, "--json", "--", "sh", "-c", shell)
    lines = done.stdout.decode().splitlines()
    escapee = int(lines[0])
    try:
        assert done.returncode == 0, done.stderr
        res = last_json(done.stdout)
        assert res["exit_code"] == 0 and res["killed"] is False and res["reason"] == ""
        assert escapee in res["sweep"]["found"]
        assert res["sweep"]["remaining"] == []
        assert res["sweep"]["scanned"] is True
        await wait_until(lambda: not pid_alive(escapee), timeout=5)
    finally:
        # Never leak the escapee when the sweep is missing: only our marker is killed.
        value, _err = job_env_id(escapee)
        if value == job_id:
            os.kill(escapee, signal.SIGKILL)


async def test_escaped_setsid_child_is_swept() -> None:
    await _escapee_case("setsid sleep 300 >/dev/null 2>&1 & echo $!; exit 0")


async def test_escapee_still_holding_stdout_is_swept() -> None:
    # The issue's own example: the escapee keeps our stdout open. Once only processes outside
    # the job's group hold the pipes, a swept job lets them go and the sweep reaps the escapee.
    await _escapee_case("setsid sleep 300 & echo $!; exit 0")


async def test_double_forked_escapee_is_swept() -> None:
    await _escapee_case("setsid sh -c 'sleep 300 >/dev/null 2>&1 & echo $!'; exit 0")


async def test_double_forked_escapee_holding_stdout_is_swept() -> None:
    await _escapee_case("setsid sh -c 'sleep 300 & echo $!'; exit 0")


# -- bad input --------------------------------------------------------------------------------


async def test_malformed_duration_is_a_one_line_error() -> None:
    for flag in ("--grace", "--max-runtime", "--idle-timeout"):
        done = await fleet("exec", flag, "10", "--", "true")
        assert done.returncode == 2
        line = one_line(done.stderr)
        expected = f"fleet-trio exec: error: {flag}: invalid duration '10': missing unit"
        assert line.startswith(expected)
        assert done.stdout == b""


async def test_empty_command() -> None:
    for args in (["exec", "--"], ["exec"], ["exec", "--json", "--"]):
        done = await fleet(*args)
        assert done.returncode == 2
        assert one_line(done.stderr) == "fleet-trio exec: error: empty command"
        assert done.stdout == b""


async def test_missing_executable() -> None:
    done = await fleet("exec", "--json", "--", "no-such-program-xyz")
    assert done.returncode == 127
    err = 'start: exec: "no-such-program-xyz": executable file not found in $PATH'
    assert one_line(done.stderr) == f"fleet-trio exec: {err}"
    res = last_json(done.stdout)
    assert res["exit_code"] == -1 and res["error"] == err and res["killed"] is False
    assert done.stdout.decode().count("\n") == 1

    done = await fleet("exec", "--", "/no/such/path")
    assert done.returncode == 127
    assert one_line(done.stderr).startswith("fleet-trio exec: start: fork/exec /no/such/path:")
    assert done.stdout == b""


async def test_nonexistent_cwd(tmp_path: Path) -> None:
    cwd = tmp_path / "gone"
    done = await fleet("exec", "--json", "--cwd", str(cwd), "--", "true")
    assert done.returncode == 127
    err = f"start: chdir {cwd}: no such file or directory"
    assert one_line(done.stderr) == f"fleet-trio exec: {err}"
    assert last_json(done.stdout)["error"] == err


async def test_cwd_that_is_a_file(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("")
    done = await fleet("exec", "--cwd", str(f), "--", "true")
    assert done.returncode == 127
    assert one_line(done.stderr) == f"fleet-trio exec: start: chdir {f}: not a directory"


# -- signals ----------------------------------------------------------------------------------


async def _signal_case(
    signum: int, shell: str, *flags: str, again: bool = False
) -> tuple[int, dict[str, Any], float]:
    with trio.fail_after(30):
        proc = await trio.lowlevel.open_process(
            [*CLI, "exec", "--json", *flags, "--", "sh", "-c", shell],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        try:
            assert proc.stdout is not None
            out = b""
            while b"ready\n" not in out:
                chunk = await proc.stdout.receive_some(4096)
                assert chunk, out
                out += chunk
            start = trio.current_time()
            proc.send_signal(signum)
            if again:
                await scenario_pause(
                    0.2, why="the second signal comes while the first is being handled"
                )
                proc.send_signal(signum)
            while chunk := await proc.stdout.receive_some(4096):
                out += chunk
            code = await proc.wait()
            return code, last_json(out), trio.current_time() - start
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


async def test_sigterm_cancels_the_job() -> None:
    code, res, took = await _signal_case(signal.SIGTERM, "echo ready; exec sleep 60")
    assert took < 5
    assert res["reason"] == "cancelled" and res["killed"] is True
    assert res["exit_code"] == 143 and code == 143


async def test_sighup_stops_the_job_with_its_grace_as_sigterm_does() -> None:
    """A closed terminal (SIGHUP) used to kill ``exec`` by the default action at once (exit
    -1), leaving the job running in its own process group; now it is a stop like SIGTERM:
    the job gets SIGTERM, its grace, and its Result is printed."""
    code, res, took = await _signal_case(
        signal.SIGHUP, "trap 'echo bye; exit 7' TERM; echo ready; while :; do sleep 0.05; done"
    )
    assert took < 5
    assert res["reason"] == "cancelled" and res["killed"] is True
    assert res["exit_code"] == 7 and code == 7  # it trapped the SIGTERM: the grace was given


async def test_sigint_cancels_the_job_and_a_trapping_job_exits_its_own_way() -> None:
    code, res, took = await _signal_case(
        signal.SIGINT,
        "trap 'echo bye; exit 0' TERM; echo ready; while :; do sleep 0.05; done",
    )
    assert took < 5
    assert res["reason"] == "cancelled" and res["killed"] is True
    assert res["exit_code"] == 0 and code == 0  # the job's real status: it trapped TERM


async def test_a_second_signal_still_yields_the_result() -> None:
    # The second signal skips the tree's drain; the job is already on its SIGTERM → grace →
    # SIGKILL path, which cannot be cut shorter, and its Result is still printed.
    code, res, took = await _signal_case(
        signal.SIGINT, "trap '' TERM; echo ready; sleep 60", "--grace", "1s", again=True
    )
    assert took < 6
    assert res["reason"] == "cancelled" and res["killed"] is True
    assert res["exit_code"] == 137 and code == 137


# -- help -------------------------------------------------------------------------------------


async def test_help_lists_only_existing_subcommands() -> None:
    done = await fleet("--help")
    assert done.returncode == 0
    text = done.stdout.decode()
    for present in ("exec", "node", "measure", "worker", "tail", "sim", "demo", "--version"):
        assert present in text


async def test_exec_help_documents_every_flag() -> None:
    done = await fleet("exec", "--help")
    assert done.returncode == 0
    text = done.stdout.decode()
    for flag in ("--job-id", "--grace", "--max-runtime", "--idle-timeout", "--cwd", "--json"):
        assert flag in text
    assert "-- CMD" in text


async def test_version() -> None:
    done = await fleet("--version")
    assert done.returncode == 0
    assert done.stdout.decode().strip() == f"fleet-trio {__version__}"


async def test_no_subcommand_prints_help_and_fails() -> None:
    done = await fleet()
    assert done.returncode == 2
    assert b"exec" in done.stderr


def test_an_in_process_command_leaves_the_callers_signal_handlers_alone() -> None:
    """Only a command that owns its process ignores late signals after its tree has closed; a
    test (or any caller) running ``main`` in-process keeps its handlers, or every child it
    spawns afterwards would inherit an ignored SIGTERM."""
    from fleet_trio.cli import main

    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    assert main(["exec", "--", "true"]) == 0
    assert {s: signal.getsignal(s) for s in before} == before
