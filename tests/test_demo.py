"""``fleet-trio demo`` as a user runs it: a subprocess, its output, its exit status, and what it
leaves behind (docs/demo.md).

The two end-to-end tests are ``slow`` (the story takes about 20-30 s; the keep-running test
about 5 s). Every process the demo starts inherits ``DEMO_TEST_MARK`` from the test's
environment, so a survivor of any job (an escapee included) is found by scanning ``/proc``.
"""

from __future__ import annotations

import functools
import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest
import trio

from fleet_trio.node.config import load_config
from fleet_trio.sim.demo.console import Console
from fleet_trio.sim.demo.files import prepare_files, worker_yaml, write_worker_yaml
from fleet_trio.sim.demo.model import EXIT_MISMATCH, EXIT_OK, Step
from fleet_trio.sim.demo.report import marked_processes, story_status, summary
from fleet_trio.worker.config import load_worker_config

MARK = "DEMO_TEST_MARK"
STEPS = (
    "render-ok",
    "footprint",
    "two-gpus",
    "render-fail",
    "train-ok",
    "train-fail",
    "kill",
    "timeout",
    "escape",
    "leak",
    "clear",
    "drain",
    "late-dispatch",
    "no-leftovers",
)


def demo_env(mark: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_TRIO_")}
    env[MARK] = mark
    return env


def survivors(mark: str) -> list[int]:
    """Live processes (other than us) that inherited ``MARK=mark``."""
    return marked_processes(mark, marker=MARK)


@pytest.mark.slow
async def test_demo_runs_the_whole_story_checks_it_and_leaves_nothing_behind() -> None:
    mark = uuid.uuid4().hex
    with trio.fail_after(120):
        proc = await trio.run_process(
            [sys.executable, "-m", "fleet_trio", "demo"],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env=demo_env(mark),
        )
    out = proc.stdout.decode()
    err = proc.stderr.decode()
    assert proc.returncode == 0, f"stdout:\n{out}\nstderr:\n{err}"
    for step in STEPS:  # the summary table: one line per step, each ending "ok"
        row = re.compile(rf"^\s*\d+\s+{re.escape(step)}\s.*\sok$", re.M)
        assert row.search(out), f"no ok summary line for {step}:\n{out}"
    assert "every step went as expected" in out
    assert "MISMATCH" not in out
    # the live tails, prefixed with the job's name
    assert re.search(r"^\s+render-ok\s+\| denoise step 4/4$", out, re.M)
    assert re.search(r"^\s+kill\s+\| tick 3$", out, re.M)
    assert re.search(r"^\s+train-drain\s+\| train: SIGTERM received", out, re.M)
    assert "\x1b[" not in out  # no colours on a pipe
    assert "Traceback" not in err
    assert survivors(mark) == []
    # the generated files are removed at exit
    root = re.search(r"generated files: (\S+)", out)
    assert root is not None and not Path(root.group(1)).exists()


@pytest.mark.slow
async def test_keep_running_prints_both_tail_pages_and_exits_0_on_sigint() -> None:
    mark = uuid.uuid4().hex
    text = ""
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            proc: trio.Process = await nursery.start(
                functools.partial(
                    trio.run_process,
                    [sys.executable, "-m", "fleet_trio", "demo", "--keep-running", "--no-story"],
                    stdout=subprocess.PIPE,
                    check=False,
                    env=demo_env(mark),
                )
            )
            assert proc.stdout is not None
            while "fleet-trio sim submit --url" not in text:
                chunk = await proc.stdout.receive_some()
                assert chunk, f"the demo ended before printing its URLs:\n{text}"
                text += chunk.decode()
            pages = re.findall(r"tail page:\s+(http://127\.0\.0\.1:\d+/fleet/ui)$", text, re.M)
            assert len(pages) == 2 and pages[0] != pages[1], text
            async with httpx.AsyncClient(timeout=10) as client:
                for page in pages:  # both pages are really served while it waits
                    r = await client.get(page)
                    assert r.status_code == 200
                    assert r.headers["content-type"].startswith("text/html")
            # its rc controller takes a job from the shell (client token printed)
            m = re.search(r"fleet-trio sim submit --url (\S+) --token (\S+) ", text)
            assert m is not None, text
            submit = ["sim", "submit", "--url", m[1], "--token", m[2], "--"]
            submitted = await trio.run_process(
                [
                    sys.executable,
                    "-m",
                    "fleet_trio",
                    *submit,
                    "sh",
                    "-c",
                    "echo hi from $RC_DEVICE",
                ],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
            assert submitted.returncode == 0, submitted.stderr
            assert submitted.stdout.startswith(b"hi from demo-box:gpu"), submitted.stdout
            proc.send_signal(signal.SIGINT)
            while chunk := await proc.stdout.receive_some():
                text += chunk.decode()
    assert proc.returncode == 0, text
    assert "SIGINT: shutting the fleet down" in text
    assert "fleet stopped" in text
    assert survivors(mark) == []


# -- the pieces, without starting a fleet ---------------------------------------------------------


def test_generated_configs_load_with_the_real_loaders(tmp_path: Path) -> None:
    files = prepare_files(str(tmp_path))
    node = load_config(files.node_yaml)
    assert [t.name for t in node.tasks] == ["render", "train"]
    write_worker_yaml(files, "http://127.0.0.1:9")
    worker = load_worker_config(files.worker_yaml)
    assert worker.device_ids == ("demo-box:gpu0", "demo-box:gpu1")
    assert worker.tail_listen == "127.0.0.1:0"
    assert worker.verify_dir == files.verify_dir
    assert worker_yaml(files, "u")["controller_url"] == "u"
    verify = Path(files.verify_dir) / "10-fake-vram-free"
    assert os.access(verify, os.X_OK)
    # nothing is read from the repository: the task scripts are the generated ones
    for task in node.tasks:
        assert task.command[0] == sys.executable
        assert task.command[1].startswith(str(tmp_path))
        assert Path(task.command[1]).is_file()


async def test_a_mismatch_is_marked_in_the_table_and_fails_the_run() -> None:
    steps = [
        Step("a", "node", "x", "done", observed="done", status="ok"),
        Step("b", "worker gpu0", "y", "killed: cancelled", observed="succeeded", status="MISMATCH"),
        Step("c", "node", "z", "error: interrupted", observed="skipped", status="skipped"),
    ]
    con = Console(1, colour=False)  # not served: the lines stay in its channel
    lines = summary(con, steps)
    assert lines[2].endswith("MISMATCH") and "killed: cancelled" in lines[2]
    assert lines[1].endswith("ok") and lines[3].endswith("skipped")
    assert story_status(steps) == EXIT_MISMATCH
    assert story_status([steps[0], steps[2]]) == EXIT_OK
