"""Config typos are warnings at the default level with the closest known key; ``--check``
verifies the hook, probe and verify paths."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fleet_trio.cli import main
from fleet_trio.confighints import closest

FLEET_TRIO = [sys.executable, "-m", "fleet_trio"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*FLEET_TRIO, *args], capture_output=True, text=True, timeout=30, check=False
    )


def test_closest() -> None:
    assert closest("heartbeat_intervall", ["heartbeat_interval", "poll_wait"]) == (
        "heartbeat_interval"
    )
    assert closest("zzz", ["heartbeat_interval"]) is None


def test_worker_typo_is_a_warning_at_the_default_level(tmp_path: Path) -> None:
    cfg = tmp_path / "worker.yaml"
    cfg.write_text(
        "controller_url: http://127.0.0.1:1\ntoken: t\ndevices: [gpu0]\n"
        f"heartbeat_intervall: 5s\nprobe_dir: {tmp_path}\nverify_dir: {tmp_path}\n"
        "hooks:\n  on_aquire: /x\n"
    )
    done = run("worker", "-c", str(cfg), "--check")
    assert done.returncode == 0, done.stderr
    assert (
        f"WARNING fleet_trio.worker.config: {cfg}: unknown key heartbeat_intervall ignored "
        "(did you mean 'heartbeat_interval'?)"
    ) in done.stderr
    assert f"{cfg}: unknown key hooks.on_aquire ignored" in done.stderr


def test_node_typo_names_the_closest_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "node.yaml"
    cfg.write_text("node:\n  timings:\n    drain_timout: 5s\n")
    assert main(["node", "-c", str(cfg)]) == 1
    err = capsys.readouterr().err
    assert f"error: {cfg}: node.timings: extra fields found (drain_timout)" in err
    assert "(did you mean 'drain_timeout'?)" in err


def test_check_verifies_hook_probe_and_verify_paths(tmp_path: Path) -> None:
    verify = tmp_path / "verify.d"
    verify.mkdir()
    (verify / "10-not-executable").write_text("#!/bin/sh\n")
    good = tmp_path / "hook"
    good.write_text("#!/bin/sh\n")
    good.chmod(0o755)
    cfg = tmp_path / "worker.yaml"
    cfg.write_text(
        "controller_url: http://127.0.0.1:1\ntoken: t\n"
        f"devices:\n  - name: gpu0\n    on_acquire: {tmp_path}/missing\n"
        f"    on_release: {good}\n  - name: gpu1\n    on_acquire: {verify / '10-not-executable'}\n"
        f"probe_dir: {tmp_path}/no-probes\nverify_dir: {verify}\n"
    )
    done = run("worker", "-c", str(cfg), "--check")
    assert done.returncode == 1
    lines = [x for x in done.stderr.splitlines() if x.startswith(("error:", "warning:"))]
    assert lines == [
        f"error: {cfg}: devices[0].on_acquire (gpu0): {tmp_path}/missing: "
        "No such file or directory",
        f"error: {cfg}: devices[1].on_acquire (gpu1): {verify}/10-not-executable: "
        "not executable (chmod +x)",
        f"warning: {cfg}: probe_dir: {tmp_path}/no-probes: does not exist (none run)",
        f"warning: {cfg}: verify_dir: {verify}/10-not-executable: not executable (chmod +x); "
        "skipped",
    ]


def test_check_names_the_folder_a_relative_directory_was_looked_up_in(tmp_path: Path) -> None:
    """A relative verify_dir is taken from the working directory, not the file's folder:
    --check says where it looked, as the worker's start warning does."""
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "verify.d").mkdir()  # beside the file: not where the worker looks
    cfg = tmp_path / "conf" / "worker.yaml"
    cfg.write_text(
        "controller_url: http://127.0.0.1:1\ntoken: t\ndevices: [gpu0]\n"
        f"probe_dir: {tmp_path}\nverify_dir: verify.d\n"
    )
    done = subprocess.run(
        [*FLEET_TRIO, "worker", "-c", str(cfg), "--check"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert (
        f"warning: {cfg}: verify_dir: verify.d ({tmp_path}/verify.d): does not exist "
        "(none run; a relative path is taken from the working directory)"
    ) in done.stderr
