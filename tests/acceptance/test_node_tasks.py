"""node.md §9, items 73–77: task types, unsupported tasks and payload validation over HTTP."""

from __future__ import annotations

from pathlib import Path

from fleet_trio.node.config import config_from_mapping
from fleet_trio.node.tasks import TaskRegistry
from tests.node.harness import reference_config, running_node, work_dirs

FIVE = ["image-gen", "video-gen", "stt", "audio-gen", "run-graph"]


async def test_node_073_unknown_task_type(tmp_path: Path) -> None:
    async with running_node(tmp_path, reference_config(tmp_path)) as h:
        r = await h.dispatch("x", "mine-bitcoin", {"prompt": "p"})
        assert r.status_code == 400
        msg = r.json()["error"]
        assert "unsupported task_type" in msg and "mine-bitcoin" in msg
        for task in FIVE:
            assert task in msg
        assert msg.endswith("(supported: image-gen, video-gen, stt, audio-gen, run-graph)")


async def test_node_074_known_but_unbound_task(tmp_path: Path) -> None:
    async with running_node(tmp_path, reference_config(tmp_path, only=["stt"])) as h:
        r = await h.dispatch("x", "image-gen", {"prompt": "p"})
        assert r.status_code == 400
        assert r.json()["error"] == 'unsupported task_type "image-gen" (supported: stt)'


async def test_node_075_payload_not_object_each_task(tmp_path: Path) -> None:
    async with running_node(tmp_path, reference_config(tmp_path)) as h:
        for task in FIVE:
            for payload in ("a string", [1, 2], 42, True):
                r = await h.dispatch(f"{task}-x", task, payload)
                assert r.status_code == 400, (task, payload)
                assert r.json()["error"] == f"{task} payload: must be a JSON object"
        assert work_dirs(tmp_path) == []


async def test_node_076_absent_payload_required_member(tmp_path: Path) -> None:
    expected = {
        "image-gen": "image-gen payload: prompt required",
        "video-gen": "video-gen payload: prompt required",
        "stt": "stt payload: audio required (a path readable on this node)",
        "audio-gen": "audio-gen payload: text required",
        "run-graph": "run-graph payload: graph required "
        "(a ComfyUI API-format graph as a raw JSON object)",
    }
    async with running_node(tmp_path, reference_config(tmp_path)) as h:
        for task, message in expected.items():
            r = await h.dispatch(f"{task}-absent", task)  # no payload member at all
            assert r.status_code == 400 and r.json()["error"] == message
            r = await h.client.post(
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
