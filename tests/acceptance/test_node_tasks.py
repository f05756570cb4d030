"""node.md §9, items 73–77: task types, unsupported tasks and payload validation over HTTP,
against the ``fleet_node`` fixture (fleet_trio.sim.pytest_plugin)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet_trio.node.config import NodeConfig, config_from_mapping
from fleet_trio.node.tasks import TaskRegistry
from fleet_trio.sim.harness import NodeHandle
from tests.node.harness import reference_config

FIVE = ["image-gen", "video-gen", "stt", "audio-gen", "run-graph"]


@pytest.fixture
def fleet_node_config(tmp_path: Path, request: pytest.FixtureRequest) -> NodeConfig:
    """The five reference tasks (or those named by an indirect parameter), each running the
    echo script."""
    return reference_config(tmp_path, only=getattr(request, "param", None))


async def test_node_073_unknown_task_type(fleet_node: NodeHandle) -> None:
    r = await fleet_node.dispatch("mine-bitcoin", {"prompt": "p"}, job_id="x")
    assert r.status_code == 400
    msg = r.json()["error"]
    assert "unsupported task_type" in msg and "mine-bitcoin" in msg
    for task in FIVE:
        assert task in msg
    assert msg.endswith("(supported: image-gen, video-gen, stt, audio-gen, run-graph)")


@pytest.mark.parametrize("fleet_node_config", [["stt"]], indirect=True, ids=["stt-only"])
async def test_node_074_known_but_unbound_task(fleet_node: NodeHandle) -> None:
    r = await fleet_node.dispatch("image-gen", {"prompt": "p"}, job_id="x")
    assert r.status_code == 400
    assert r.json()["error"] == 'unsupported task_type "image-gen" (supported: stt)'


async def test_node_075_payload_not_object_each_task(fleet_node: NodeHandle) -> None:
    for task in FIVE:
        for payload in ("a string", [1, 2], 42, True):
            r = await fleet_node.dispatch(task, payload, job_id=f"{task}-x")
            assert r.status_code == 400, (task, payload)
            assert r.json()["error"] == f"{task} payload: must be a JSON object"
    assert fleet_node.work_dirs() == []


async def test_node_076_absent_payload_required_member(fleet_node: NodeHandle) -> None:
    expected = {
        "image-gen": "image-gen payload: prompt required",
        "video-gen": "video-gen payload: prompt required",
        "stt": "stt payload: audio required (a path readable on this node)",
        "audio-gen": "audio-gen payload: text required",
        "run-graph": "run-graph payload: graph required "
        "(a ComfyUI API-format graph as a raw JSON object)",
    }
    for task, message in expected.items():
        r = await fleet_node.dispatch(task, job_id=f"{task}-absent")  # no payload member at all
        assert r.status_code == 400 and r.json()["error"] == message
        r = await fleet_node.client.post(
            "/fleet/dispatch",
            content=f'{{"job_id":"{task}-null","task_type":"{task}","payload":null}}'.encode(),
        )
        assert r.status_code == 400 and r.json()["error"] == message


def test_node_077_cleanup_always_callable(tmp_path: Path) -> None:
    cfg = config_from_mapping(
        {"tasks": {"t": {"command": ["true"], "materialize": {"graph": "g.json"}}}},
        base_dir=str(tmp_path),
    )
    reg = TaskRegistry(cfg.tasks, base_dir=str(tmp_path), work_root=str(tmp_path))
    job = reg.prepare("t", None, "j")  # nothing materialized
    job.cleanup()
    job.cleanup()
    job.work_dir = ""
    job.cleanup()
