"""The shipped example configs load, and the sleepy task runs."""

from __future__ import annotations

import json
from pathlib import Path

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
