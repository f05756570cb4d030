"""node.md §9, items 20–43: health, dispatch and jobs over real HTTP (fake GPU, real tasks)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from fleet_trio.node.app import create_app
from fleet_trio.node.server import hypercorn_config, server_timeouts
from fleet_trio.node.wire import HEALTH_FIELDS
from tests.helpers import bare_node_context, dispatch_as, quiet_for, wait_until
from tests.node.harness import (
    FakeFootprints,
    FakeSampler,
    echo_task,
    node_config,
    running_node,
    runs,
    work_dirs,
)

GOLDEN = {
    "node_id": "node-a",
    "schema_version": 1,
    "gpu_vendor": "nvidia",
    "gpu_arch": "blackwell",
    "vram_total_gb": 16,
    "vram_free_gb": 12.5,
    "supported_task_types": ["image-gen", "run-graph"],
    "loadable_model_families": ["sdxl", "comfy-graph"],
    "model_footprints": [
        {"model_family": "sdxl", "quant": "bf16", "task_type": "image-gen", "vram_peak_gb": 9.6}
    ],
    "queue_depth": 0,
}
ODD_ID = "a3f9-XYZ_0123456789abcdef.fleet~job"


def two_tasks(tmp_path: Path) -> dict[str, object]:
    return {
        "image-gen": echo_task(tmp_path, family="sdxl"),
        "run-graph": echo_task(
            tmp_path,
            family="comfy-graph",
            materialize={"graph": "graph.json"},
            payload={"graph": {"type": "object", "required": True, "non_empty": True}},
        ),
    }


async def test_node_020_health_golden(tmp_path: Path) -> None:
    fps = FakeFootprints([GOLDEN["model_footprints"][0]])  # type: ignore[index]
    cfg = node_config(tmp_path, two_tasks(tmp_path))
    async with running_node(tmp_path, cfg, footprints=fps) as h:
        r = await h.client.get("/fleet/health")
        assert r.status_code == 200
        assert r.headers["content-type"] == "application/json"
        body = r.json()
        assert list(body) == list(HEALTH_FIELDS)
        assert body == GOLDEN
        assert fps.reloads >= 1


async def test_node_021_empty_lists_never_null(tmp_path: Path) -> None:
    async with running_node(tmp_path, node_config(tmp_path, {})) as h:
        text = (await h.client.get("/fleet/health")).text
        assert '"supported_task_types":[]' in text
        assert '"loadable_model_families":[]' in text
        assert '"model_footprints":[]' in text


async def test_node_022_no_snapshot_503(tmp_path: Path) -> None:
    sampler = FakeSampler()
    async with running_node(tmp_path, node_config(tmp_path, {}), sampler=sampler) as h:
        sampler.snap = None
        r = await h.client.get("/fleet/health")
        assert r.status_code == 503
        assert r.json() == {"status": "error", "error": "vram snapshot unavailable"}
        assert "snapshot" in r.json()["error"]


async def test_node_023_snapshot_60s_old_stale(tmp_path: Path) -> None:
    sampler = FakeSampler()
    async with running_node(tmp_path, node_config(tmp_path, {}), sampler=sampler) as h:
        sampler.publish(16, 2, age=60)
        r = await h.client.get("/fleet/health")
        assert r.status_code == 503
        assert r.json() == {"status": "error", "error": "vram snapshot stale"}


async def test_node_024_snapshot_5s_old_ok(tmp_path: Path) -> None:
    sampler = FakeSampler()
    async with running_node(tmp_path, node_config(tmp_path, {}), sampler=sampler) as h:
        sampler.publish(16, 2, age=5)
        assert (await h.client.get("/fleet/health")).status_code == 200


async def test_node_025_ack_exact_echo_and_done(tmp_path: Path) -> None:
    async with running_node(tmp_path, node_config(tmp_path, two_tasks(tmp_path))) as h:
        r = await h.dispatch(ODD_ID, "image-gen", {"prompt": "x"})
        assert r.status_code == 202
        assert r.json() == {"job_id": ODD_ID, "status": "accepted"}
        assert (await h.wait_terminal(ODD_ID))["state"] == "done"


async def test_node_026_syntax_error_malformed(tmp_path: Path) -> None:
    async with running_node(tmp_path, node_config(tmp_path, {})) as h:
        r = await h.client.post("/fleet/dispatch", content=b'{"job_id": "x",')
        assert r.status_code == 400 and "malformed" in r.json()["error"]
        assert set(r.json()) == {"status", "error"} and r.json()["status"] == "error"


async def test_node_027_unknown_member_named(tmp_path: Path) -> None:
    async with running_node(tmp_path, node_config(tmp_path, {})) as h:
        body = b'{"job_id":"x","task_type":"image-gen","bogus_field":1}'
        r = await h.client.post("/fleet/dispatch", content=body)
        assert r.status_code == 400 and "bogus_field" in r.json()["error"]


async def test_node_028_reserved_members_ignored(tmp_path: Path) -> None:
    reserved = {
        "model_family": "flux",
        "quant": "q8_0",
        "priority": {"any": [1]},
        "width": 1,
        "height": 2,
        "num_frames": 3,
        "params_b": 4.5,
        "context_len": 6,
        "num_layers": 7,
        "hidden_dim": 8,
        "batch_size": 9,
    }
    async with running_node(tmp_path, node_config(tmp_path, two_tasks(tmp_path))) as h:
        r = await h.dispatch("r1", "image-gen", {"prompt": "p"}, **reserved)
        assert r.status_code == 202
        data = (await h.wait_terminal("r1"))["data"]
        assert data["stdin"] == '{"prompt": "p"}'
        blob = json.dumps(data["env"]) + json.dumps(data["argv"])
        for name in reserved:
            assert name not in blob
        assert runs(tmp_path, "r1") == 1


async def test_node_029_missing_job_id(tmp_path: Path) -> None:
    async with running_node(tmp_path, node_config(tmp_path, two_tasks(tmp_path))) as h:
        r = await h.client.post("/fleet/dispatch", content=b'{"task_type":"image-gen"}')
        assert r.status_code == 400 and r.json()["error"] == "job_id required"


async def test_node_030_unsupported_lists_supported(tmp_path: Path) -> None:
    async with running_node(tmp_path, node_config(tmp_path, two_tasks(tmp_path))) as h:
        r = await h.dispatch("x", "llm", {})
        assert r.status_code == 400 and "image-gen, run-graph" in r.json()["error"]
        assert r.json()["error"] == 'unsupported task_type "llm" (supported: image-gen, run-graph)'


async def test_node_031_body_over_1mib(tmp_path: Path) -> None:
    async with running_node(tmp_path, node_config(tmp_path, two_tasks(tmp_path))) as h:
        big = b'{"job_id":"x","task_type":"image-gen","payload":{"p":"' + b"a" * (1 << 20) + b'"}}'
        r = await h.client.post("/fleet/dispatch", content=big)
        assert r.status_code == 400 and "too large" in r.json()["error"]
        assert r.json()["error"] == "request body too large (limit 1 MiB)"


async def test_node_032_text_plain_400(tmp_path: Path) -> None:
    async with running_node(tmp_path, node_config(tmp_path, two_tasks(tmp_path))) as h:
        r = await dispatch_as(h.client, "text/plain", "x")
        assert r.status_code == 400
        assert r.json()["error"] == 'content-type must be application/json (got "text/plain")'


async def test_node_033_dispatch_after_drain_503(tmp_path: Path) -> None:
    async with running_node(tmp_path, node_config(tmp_path, two_tasks(tmp_path))) as h:
        assert (await h.dispatch("hold", "image-gen", {"sleep": 0.5})).status_code == 202
        h.node.request_shutdown()
        r = await h.dispatch("late", "image-gen", {})
        assert r.status_code == 503 and r.json()["error"] == "node draining"


async def test_node_034_graph_string_400_never_stored(tmp_path: Path) -> None:
    async with running_node(tmp_path, node_config(tmp_path, two_tasks(tmp_path))) as h:
        r = await h.dispatch("g1", "run-graph", {"graph": "nope"})
        assert r.status_code == 400 and "graph must be a JSON object" in r.json()["error"]
        assert runs(tmp_path, "g1") == 0
        p = await h.poll("g1")
        assert p.status_code == 404 and p.json()["error"] == "unknown job"
        assert work_dirs(tmp_path) == []


async def test_node_035_duplicate_while_running_202(tmp_path: Path) -> None:
    async with running_node(tmp_path, node_config(tmp_path, two_tasks(tmp_path))) as h:
        assert (await h.dispatch("d1", "image-gen", {"sleep": 0.4})).status_code == 202
        r = await h.dispatch("d1", "image-gen", {"sleep": 0.4})
        assert r.status_code == 202 and r.json() == {"job_id": "d1", "status": "accepted"}
        await h.wait_terminal("d1")
        assert runs(tmp_path, "d1") == 1


async def test_node_036_duplicate_after_done_202_same_data(tmp_path: Path) -> None:
    async with running_node(tmp_path, node_config(tmp_path, two_tasks(tmp_path))) as h:
        await h.dispatch("d2", "image-gen", {"result": {"image_path": "/x.png", "seed": 7}})
        first = await h.wait_terminal("d2")
        r = await h.dispatch("d2", "image-gen", {"result": {"other": 1}})
        assert r.status_code == 202 and r.json() == {"job_id": "d2", "status": "accepted"}
        again = (await h.poll("d2")).json()
        assert again == first and again["data"] == {"image_path": "/x.png", "seed": 7}
        await quiet_for(0.1, reason="the duplicate dispatch does not run the task again")
        assert runs(tmp_path, "d2") == 1


async def test_node_037_duplicate_after_error_409(tmp_path: Path) -> None:
    async with running_node(tmp_path, node_config(tmp_path, two_tasks(tmp_path))) as h:
        bad = {"result": {"deferred": True, "reason": "oom: cudaMalloc failed"}}
        await h.dispatch("d3", "image-gen", bad)
        assert (await h.wait_terminal("d3"))["error"] == "oom: cudaMalloc failed"
        r = await h.dispatch("d3", "image-gen", bad)
        assert r.status_code == 409
        assert r.json() == {
            "status": "error",
            "error": "job previously failed on this node: oom: cudaMalloc failed",
        }
        assert runs(tmp_path, "d3") == 1


async def test_node_038_poll_unknown_404(tmp_path: Path) -> None:
    async with running_node(tmp_path, node_config(tmp_path, {})) as h:
        r = await h.poll("never")
        assert r.status_code == 404
        assert r.json() == {"status": "error", "error": "unknown job"}


async def test_node_039_done_data_is_result(tmp_path: Path) -> None:
    async with running_node(tmp_path, node_config(tmp_path, two_tasks(tmp_path))) as h:
        raw = '{"image_path": "/tmp/a.png",   "seed": 7, "w": 16.0}'
        await h.dispatch("p1", "image-gen", {"stdout": raw})
        body = await h.wait_terminal("p1")
        assert body == {"job_id": "p1", "state": "done", "data": json.loads(raw)}
        text = (await h.poll("p1")).text
        assert raw in text  # echoed byte-identical


async def test_node_040_deferred_reason_is_error(tmp_path: Path) -> None:
    async with running_node(tmp_path, node_config(tmp_path, two_tasks(tmp_path))) as h:
        reason = "gpu_busy: a gen job holds the GPU lock"
        await h.dispatch("p2", "image-gen", {"result": {"deferred": True, "reason": reason}})
        assert await h.wait_terminal("p2") == {"job_id": "p2", "state": "error", "error": reason}


async def test_node_041_failed_empty_reason_is_deferred(tmp_path: Path) -> None:
    async with running_node(tmp_path, node_config(tmp_path, two_tasks(tmp_path))) as h:
        await h.dispatch("p3", "image-gen", {"result": {"deferred": True, "reason": ""}})
        body = await h.wait_terminal("p3")
        assert body == {"job_id": "p3", "state": "error", "error": "deferred"}


async def test_node_042_graph_file_lifetime(tmp_path: Path) -> None:
    async with running_node(tmp_path, node_config(tmp_path, two_tasks(tmp_path))) as h:
        graph = {"3": {"class_type": "KSampler", "inputs": {"seed": 1}}}
        await h.dispatch("rg", "run-graph", {"graph": graph, "sleep": 0.5})
        await wait_until(lambda: bool(work_dirs(tmp_path)), timeout=5)
        (wd,) = work_dirs(tmp_path)
        graph_file = tmp_path / "work" / wd / "graph.json"
        assert json.loads(graph_file.read_text()) == graph
        await h.wait_terminal("rg")
        await wait_until(lambda: not graph_file.exists(), timeout=2)
        assert not os.path.exists(tmp_path / "work" / wd)


def test_node_043_server_timeouts() -> None:
    ctx = bare_node_context()
    t = server_timeouts(hypercorn_config("127.0.0.1:18811"), create_app(ctx))
    # read-header 5 s: the server's own header timeout (hypercorn has none; docs/node.md).
    assert t["read_header"] == 5.0
    assert (t["read"], t["write"], t["idle"]) == (30.0, 30.0, 120.0)
