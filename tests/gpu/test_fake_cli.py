"""``--gpu fake`` with no other flag, and the ``fleet-trio fake-gpu`` helper (issue: the first
hour)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import trio

from fleet_trio.gpu.fake import ENV_DIR, read_device
from fleet_trio.gpu.fake_cli import prepare_fake_gpu

FLEET_TRIO = [sys.executable, "-m", "fleet_trio"]


def fresh_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (ENV_DIR, "XDG_STATE_HOME")}
    env.pop("STATE_DIRECTORY", None)
    env["HOME"] = str(home)
    return env


def test_prepare_creates_a_missing_directory(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b"
    path, note = prepare_fake_gpu(str(target))
    assert path == str(target)
    assert note is not None and str(target) in note and "80 GiB" in note
    assert read_device(path).total_gib == 80
    assert prepare_fake_gpu(str(target)) == (str(target), None)  # once is enough


def test_gpu_fake_alone_serves(tmp_path: Path) -> None:
    env = fresh_env(tmp_path)
    argv = [*FLEET_TRIO, "node", "--gpu", "fake", "--listen", "127.0.0.1:0"]

    async def main() -> list[str]:
        lines: list[str] = []
        with trio.fail_after(30):
            proc = await trio.lowlevel.open_process(argv, env=env, stderr=subprocess.PIPE)
            assert proc.stderr is not None
            buf = b""
            try:
                while b"serving on" not in buf:
                    chunk = await proc.stderr.receive_some()
                    assert chunk, buf.decode()
                    buf += chunk
            finally:
                proc.send_signal(signal.SIGTERM)
                await proc.wait()
            lines = buf.decode().splitlines()
        return lines

    lines = trio.run(main)
    gpu_dir = tmp_path / ".local" / "state" / "fleet-trio" / "fake-gpu"
    assert lines[0] == (
        f"fleet-trio node: fake GPU initialised in {gpu_dir} (Fake GPU, 80 GiB, one device; "
        "`fleet-trio fake-gpu` changes it)"
    )
    assert lines[1].startswith("fleet-trio node: node ")  # not "fleet-trio node: fleet-trio node"
    assert "serving on 127.0.0.1:" in lines[1] and "vram total 80.0 GiB" in lines[1]
    # --listen 127.0.0.1:0: the line names the port the node really bound
    assert "serving on 127.0.0.1:0 " not in lines[1]
    assert json.loads((gpu_dir / "device.json").read_text())["total_gib"] == 80


def test_fake_gpu_helper_uses_the_state_directory(tmp_path: Path) -> None:
    env = fresh_env(tmp_path)
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    done = subprocess.run(
        [*FLEET_TRIO, "fake-gpu", "init", "--total-gib", "24"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert read_device(str(tmp_path / "state" / "fleet-trio" / "fake-gpu")).total_gib == 24
    usage = subprocess.run(
        [*FLEET_TRIO, "fake-gpu", "hold", "lots"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert usage.returncode == 2
    assert "fleet-trio fake-gpu" in usage.stderr and "Traceback" not in usage.stderr


def test_fake_gpu_helper_refuses_impossible_values(tmp_path: Path) -> None:
    env = fresh_env(tmp_path)
    for verb in (
        ["init", "--total-gib", "-5"],
        ["init", "--total-gib", "nan"],
        ["hold", "2G", "--for", "-1"],
    ):
        proc = subprocess.run(
            [*FLEET_TRIO, "fake-gpu", *verb, "--dir", str(tmp_path / "fg")],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert proc.returncode == 2, (verb, proc.stderr)
        assert "error: argument" in proc.stderr
    assert not (tmp_path / "fg" / "device.json").exists()
