"""The shipped example configs load, and the sleepy task runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from fleet_trio.node.config import load_config
from fleet_trio.node.jobs import Done
from fleet_trio.node.tasks import TaskRegistry, TaskRunner

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_reference_yaml_loads() -> None:
    cfg = load_config(EXAMPLES / "node-reference.yaml")
    assert [t.name for t in cfg.tasks] == [
        "image-gen",
        "video-gen",
        "stt",
        "audio-gen",
        "run-graph",
    ]


async def test_sleepy_runs(tmp_path: Path) -> None:
    cfg = load_config(EXAMPLES / "node.yaml")
    reg = TaskRegistry(cfg.tasks, base_dir=cfg.base_dir, work_root=str(tmp_path))
    assert reg.supported == ("sleepy",)
    job = reg.prepare("sleepy", '{"seconds": 0.05, "hold": ""}', "s1")
    with trio.fail_after(10):
        outcome = await TaskRunner(kill_grace=1).execute(job)
    assert isinstance(outcome, Done)
    assert json.loads(outcome.data)["job_id"] == "s1"


@pytest.mark.slow
def test_shipped_measure_example_records_a_footprint_under_the_state_dir(tmp_path: Path) -> None:
    """`fleet-trio measure -c examples/node.yaml --gpu fake` as shipped: the probe outlasts the
    sampling interval, so a peak is recorded, and every file goes under $XDG_STATE_HOME."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "FLEET_TRIO_"))}
    env.pop("STATE_DIRECTORY", None)
    env.update(HOME=str(tmp_path / "home"), XDG_STATE_HOME=str(tmp_path / "state"))
    root = Path(__file__).resolve().parents[2]
    FLEET_TRIO_MEASURE = [sys.executable, "-m", "fleet_trio", "measure"]
    for _ in range(2):  # twice: a fresh fake GPU, then the existing one
        done = subprocess.run(
            [*FLEET_TRIO_MEASURE, "-c", "examples/node.yaml", "--gpu", "fake"],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        entries = json.loads(done.stdout)
        assert [e["task_type"] for e in entries] == ["sleepy"]
        assert entries[0]["vram_peak_gb"] > 0.5  # 512M held, margin 1.2
    state = tmp_path / "state" / "fleet-trio"
    assert (state / "footprints.json").is_file() and (state / "fake-gpu" / "device.json").is_file()
    assert not (tmp_path / "home").exists()  # nothing written into $HOME
