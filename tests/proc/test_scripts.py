"""The script-directory runner (worker-process.md §5.1, §6.4) with real scripts."""

from __future__ import annotations

import math
import os
from pathlib import Path

import trio

from fleet_trio.proc.scripts import (
    ScriptKind,
    failure_detail,
    run_script,
    run_scripts,
    stderr_head,
    stderr_tail,
)
from fleet_trio.proc.spec import Result
from fleet_trio.proc.stop import StopToken
from tests.helpers import scenario_pause, sh_script

# -- ordering and candidates ----------------------------------------------------------------


async def test_runs_in_bytewise_order_with_dotfiles_and_symlinks(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    log = tmp_path / "log"
    for name in ["b", "B", "a", "_x", ".hidden", "10-x", "9-x"]:
        sh_script(d, name, f'echo "{name}" >> "{log}"')
    (d / "subdir").mkdir()  # directories are never candidates
    target = sh_script(tmp_path, "outside.sh", f'echo linked >> "{log}"')
    (d / "link").symlink_to(target)
    with trio.fail_after(20):
        res = await run_scripts(str(d), max_runtime=5, budget=30)
    expected = [".hidden", "10-x", "9-x", "B", "_x", "a", "b", "link"]  # bytewise
    assert [o.name for o in res.outcomes] == expected
    assert all(o.kind is ScriptKind.OK for o in res.outcomes)
    assert log.read_text().split() == [*expected[:-1], "linked"]
    assert not res.missing and res.list_error is None and not res.budget_exhausted


async def test_dangling_symlink_is_a_stat_error_and_the_pass_continues(tmp_path: Path) -> None:
    (tmp_path / "10-dangling.sh").symlink_to(tmp_path / "nowhere")
    sh_script(tmp_path, "20-ok.sh", "exit 0")
    with trio.fail_after(10):
        res = await run_scripts(str(tmp_path), max_runtime=5, budget=30)
    first, second = res.outcomes
    assert first.kind is ScriptKind.STAT_ERROR
    assert first.result is None
    assert first.error == f"stat {tmp_path}/10-dangling.sh: no such file or directory"
    assert second.kind is ScriptKind.OK


async def test_non_executable_is_skipped_with_its_mode(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    sh_script(tmp_path, "10-plain", f'touch "{marker}"', mode=0o644)
    sh_script(tmp_path, "20-ok", "exit 0")
    with trio.fail_after(10):
        res = await run_scripts(str(tmp_path), max_runtime=5, budget=30)
    skipped, ok = res.outcomes
    assert skipped.kind is ScriptKind.SKIPPED
    assert skipped.mode == "-rw-r--r--"
    assert skipped.result is None
    assert not marker.exists()
    assert ok.kind is ScriptKind.OK and ok.mode == "-rwxr-xr-x"


async def test_failures_carry_their_detail_and_every_script_runs(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    sh_script(tmp_path, "10-bad.sh", "echo '72G still allocated' >&2; exit 1")
    sh_script(tmp_path, "20-good.sh", f'echo out; touch "{marker}"')
    with trio.fail_after(10):
        res = await run_scripts(str(tmp_path), max_runtime=5, budget=30)
    bad, good = res.outcomes
    assert bad.kind is ScriptKind.FAILED
    assert bad.error == "exited 1"
    assert bad.stderr == b"72G still allocated\n"
    assert stderr_tail(bad.stderr, bad.stderr_truncated) == "72G still allocated"
    assert good.kind is ScriptKind.OK and good.stdout == b"out\n" and good.stderr == b""
    assert marker.exists()


async def test_env_is_passed_on_top_of_ours(tmp_path: Path) -> None:
    sh_script(tmp_path, "check", 'test "$RC_EVENT" = verify && test -n "$PATH"')
    with trio.fail_after(10):
        res = await run_scripts(str(tmp_path), max_runtime=5, budget=30, env={"RC_EVENT": "verify"})
    assert [o.kind for o in res.outcomes] == [ScriptKind.OK]


# -- listing errors -------------------------------------------------------------------------


async def test_missing_directory(tmp_path: Path) -> None:
    with trio.fail_after(5):
        res = await run_scripts(str(tmp_path / "nope"), max_runtime=5, budget=30)
    assert res.missing
    assert res.list_error is None
    assert res.outcomes == ()


async def test_empty_directory(tmp_path: Path) -> None:
    with trio.fail_after(5):
        res = await run_scripts(str(tmp_path), max_runtime=5, budget=30)
    assert not res.missing and res.list_error is None and res.outcomes == ()


async def test_unlistable_directory_is_a_go_shaped_list_error(tmp_path: Path) -> None:
    # chmod 000 does not stop root; a regular file in place of the directory always fails.
    f = tmp_path / "file"
    f.write_text("x")
    with trio.fail_after(5):
        res = await run_scripts(str(f), max_runtime=5, budget=30)
    assert not res.missing
    assert res.list_error == f"open {f}: not a directory"
    assert res.outcomes == ()


async def test_unreadable_directory_as_non_root(tmp_path: Path, is_root: bool) -> None:
    if is_root:
        return  # root reads through mode 000; covered by the ENOTDIR case above
    d = tmp_path / "d"
    d.mkdir()
    d.chmod(0)
    try:
        with trio.fail_after(5):
            res = await run_scripts(str(d), max_runtime=5, budget=30)
    finally:
        d.chmod(0o755)
    assert res.list_error == f"open {d}: permission denied"


# -- timeouts and budget --------------------------------------------------------------------


async def test_per_script_timeout_kills_the_script(tmp_path: Path) -> None:
    sh_script(tmp_path, "10-hang.sh", "exec sleep 60")
    sh_script(tmp_path, "20-ok.sh", "exit 0")
    start = trio.current_time()
    with trio.fail_after(10):
        res = await run_scripts(str(tmp_path), max_runtime=0.3, budget=30)
    assert trio.current_time() - start < 5
    hang, ok = res.outcomes
    assert hang.kind is ScriptKind.FAILED
    assert hang.result is not None and hang.result.killed
    assert hang.result.reason == "max_runtime exceeded (300ms)"
    assert hang.error == "max_runtime exceeded (300ms)"
    assert ok.kind is ScriptKind.OK
    assert not res.budget_exhausted


async def test_whole_pass_budget_stops_the_loop(tmp_path: Path) -> None:
    log = tmp_path / "log"
    for name in ("10-a.sh", "20-b.sh", "30-c.sh"):
        sh_script(tmp_path, name, f'echo {name} >> "{log}"; exec sleep 10')
    start = trio.current_time()
    with trio.fail_after(15):
        # 1.5 s: time enough for the first script to start and log itself
        res = await run_scripts(str(tmp_path), max_runtime=30, budget=1.5)
    assert trio.current_time() - start < 8
    assert log.exists(), "the budget ran out before the first script had started"
    assert res.budget_exhausted
    assert res.budget_text == "1.5s"
    assert not res.stop_requested
    # the first script was cut by the budget (cancelled); nothing after it ran
    assert [o.name for o in res.outcomes] == ["10-a.sh"]
    first = res.outcomes[0]
    assert first.kind is ScriptKind.FAILED
    assert first.result is not None and first.result.reason == "cancelled"
    assert res.not_run == ("20-b.sh", "30-c.sh")
    assert log.read_text().split() == ["10-a.sh"]


async def test_budget_checked_before_each_script(tmp_path: Path) -> None:
    sh_script(tmp_path, "10-ok.sh", "exit 0")
    sh_script(tmp_path, "20-ok.sh", "exit 0")
    stop = StopToken()
    stop.set()
    with trio.fail_after(5):
        res = await run_scripts(str(tmp_path), max_runtime=5, budget=30, stop=stop)
    assert res.budget_exhausted and res.stop_requested
    assert res.outcomes == ()
    assert res.not_run == ("10-ok.sh", "20-ok.sh")


async def test_parent_stop_ends_the_pass(tmp_path: Path) -> None:
    sh_script(tmp_path, "10-hang.sh", "exec sleep 60")
    sh_script(tmp_path, "20-ok.sh", "exit 0")
    stop = StopToken()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:

            async def later() -> None:
                await scenario_pause(0.3, why="the stop comes while the script runs")
                stop.set()

            nursery.start_soon(later)
            res = await run_scripts(str(tmp_path), max_runtime=0, budget=0, stop=stop)
    assert math.isinf(res.budget) and res.budget_text == "unbounded"
    assert res.budget_exhausted and res.stop_requested
    assert res.outcomes[0].error == "cancelled"
    assert res.not_run == ("20-ok.sh",)


# -- caps -----------------------------------------------------------------------------------


async def test_output_is_capped_and_the_child_never_blocks(tmp_path: Path) -> None:
    sh_script(tmp_path, "big", "head -c 200000 /dev/zero; head -c 200000 /dev/zero >&2; exit 0")
    sh_script(tmp_path, "exact", "head -c 65536 /dev/zero")
    with trio.fail_after(10):
        res = await run_scripts(str(tmp_path), max_runtime=5, budget=30)
    big, exact = res.outcomes
    assert big.kind is ScriptKind.OK
    assert big.result is not None and big.result.exit_code == 0
    assert len(big.stdout) == 65536 and big.stdout_truncated
    assert len(big.stderr) == 65536 and big.stderr_truncated
    assert len(exact.stdout) == 65536 and not exact.stdout_truncated


# -- hooks ----------------------------------------------------------------------------------


async def test_run_script_combines_output(tmp_path: Path) -> None:
    path = sh_script(tmp_path, "hook.sh", "echo one; echo two >&2; exit 4")
    with trio.fail_after(10):
        full = await run_script(str(path), env={"RC_EVENT": "acquire"}, max_runtime=5)
        tail = await run_script(str(path), max_runtime=5, output_tail=4)
    assert full.output == b"one\ntwo\n" and not full.truncated
    assert full.result.exit_code == 4 and not full.ok
    assert failure_detail(full.result) == "exited 4"
    assert tail.output == b"two\n" and tail.truncated


# -- text helpers ---------------------------------------------------------------------------


def test_stderr_tail() -> None:
    assert stderr_tail(b"", False) == ""
    assert stderr_tail(b" \n\t ", True) == ""
    assert stderr_tail(b"  72G still allocated\n", False) == "72G still allocated"
    exactly = b"x" * 200
    assert stderr_tail(exactly, False) == "x" * 200
    long = b"A" * 50 + b"B" * 200 + b"\n"
    assert stderr_tail(long, False) == "...(truncated)" + "B" * 200
    overflowed = "...(truncated)" + "B" * 200 + " (stderr itself was truncated)"
    assert stderr_tail(long, True) == overflowed
    assert stderr_tail(b"short", True) == "short (stderr itself was truncated)"
    # bytes are sliced first, then decoded with replacement: a split 'é' becomes U+FFFD
    split = "é".encode() + b"z" * 199
    assert stderr_tail(split, False, limit=200) == "...(truncated)\ufffd" + "z" * 199


def test_stderr_head() -> None:
    assert stderr_head(b"\n", False) == ""
    assert stderr_head(b" warning \n", False) == "warning"
    long = b"A" * 200 + b"B" * 50
    assert stderr_head(long, False) == "A" * 200 + "...(truncated)"
    assert stderr_head(long, True) == "A" * 200 + "...(truncated) (stderr itself was truncated)"
    assert stderr_head(b"oops", True) == "oops (stderr itself was truncated)"


def test_failure_detail() -> None:
    assert failure_detail(Result(exit_code=-1, err="start: boom")) == "run: start: boom"
    assert (
        failure_detail(Result(exit_code=139, killed=True, reason="signal: segmentation fault"))
        == "signal: segmentation fault"
    )
    assert failure_detail(Result(exit_code=0, killed=True)) == "killed"
    assert failure_detail(Result(exit_code=3)) == "exited 3"


def test_script_path_is_never_bare(tmp_path: Path) -> None:
    # A relative directory still yields a path with a slash (never a PATH lookup).
    from fleet_trio.proc.scripts import _script_path

    assert _script_path("", "x") == "./x"
    assert _script_path("d", "x") == "d/x"
    assert os.path.isabs(_script_path(str(tmp_path), "x"))


async def test_x_bit_without_a_valid_format_fails_at_spawn(tmp_path: Path) -> None:
    # §15 Q8: only the mode bits are checked; an un-executable file with x bits fails to start.
    bad = tmp_path / "10-garbage"
    bad.write_bytes(b"\x00\x01\x02 not a program")
    bad.chmod(0o755)
    with trio.fail_after(5):
        res = await run_scripts(str(tmp_path), max_runtime=5, budget=30)
    (outcome,) = res.outcomes
    assert outcome.kind is ScriptKind.FAILED
    assert outcome.error == f"run: start: fork/exec {bad}: exec format error"
