"""``GET /metrics`` on a real node (fake GPU), scraped while a real job runs and after it ends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fleet_trio.node.metrics import GIB
from tests.helpers import logged, wait_until
from tests.metrics.scrape import parse, scrape, total, value
from tests.node.conftest import PY
from tests.node.harness import FakeFootprints, FakeSampler, node_config, running_node

# Writes 1000 bytes on stderr, waits for the gate file named in the payload, then prints its
# result (or exits 3 when the payload says so).
GATED = r"""
import json, os, sys, time
p = json.loads(sys.stdin.read())
sys.stderr.write("x" * 999 + "\n")
sys.stderr.flush()
while not os.path.exists(p["gate"]):
    time.sleep(0.01)
if p.get("fail"):
    sys.exit(3)
sys.stdout.write(json.dumps({"ok": True}))
"""


def config(tmp_path: Path) -> Any:
    return node_config(tmp_path, {"gated": {"command": [PY, "-c", GATED]}})


async def test_counters_follow_a_real_job_from_ack_to_done(tmp_path: Path) -> None:
    footprints = FakeFootprints(
        [{"model_family": "sdxl", "task_type": "gated", "vram_peak_gb": 2.5}]
    )
    async with running_node(tmp_path, config(tmp_path), footprints=footprints) as h:
        before = await scrape(h.client)
        assert value(before, "fleet_trio_node_jobs", state="running") == 0
        assert value(before, "fleet_trio_node_jobs", state="done") == 0
        assert value(before, "fleet_trio_node_queue_depth") == 0
        assert value(before, "fleet_trio_node_draining") == 0
        assert total(before, "fleet_trio_node_job_duration_seconds_count") == 0
        assert value(before, "fleet_trio_build_info", role="node", version="0.1.0") == 1
        # the fake GPU: 16 GiB total, 3.5 GiB used (tests/node/harness.py)
        assert value(before, "fleet_trio_gpu_vram_total_bytes", gpu="0") == 16 * GIB
        assert value(before, "fleet_trio_gpu_vram_used_bytes", gpu="0") == 3.5 * GIB
        assert value(before, "fleet_trio_gpu_vram_free_bytes", gpu="0") == 12.5 * GIB
        age = value(before, "fleet_trio_gpu_sample_age_seconds", gpu="0")
        assert age is not None and 0 <= age < 30
        key = {"model_family": "sdxl", "quant": "", "task_type": "gated"}
        assert value(before, "fleet_trio_footprint_bytes", **key) == 2.5 * GIB

        gate = tmp_path / "gate"
        r = await h.dispatch("job-1", "gated", {"gate": str(gate)})
        assert r.status_code == 202
        await wait_until(lambda: h.state_is("job-1", "running"), what="job-1 running")
        await wait_until(lambda: logged(h.node.context.bus, "job-1", 1000), what="1000 bytes")

        running = await scrape(h.client)
        assert value(running, "fleet_trio_node_jobs", state="running") == 1
        assert value(running, "fleet_trio_node_jobs", state="done") == 0
        assert value(running, "fleet_trio_node_queue_depth") == 1
        assert value(running, "fleet_trio_node_jobs_started_total", task_type="gated") == 1
        assert value(running, "fleet_trio_node_dispatch_seconds_count", code="202") == 1
        assert total(running, "fleet_trio_node_job_duration_seconds_count") == 0
        assert value(running, "fleet_trio_log_jobs", state="running") == 1
        log_bytes = value(running, "fleet_trio_log_retained_bytes")
        assert log_bytes is not None and log_bytes >= 1000
        assert total(running, "fleet_trio_log_bytes_total") >= 1000

        gate.write_text("go")
        assert (await h.wait_terminal("job-1"))["state"] == "done"
        done = await scrape(h.client)
        assert value(done, "fleet_trio_node_jobs", state="running") == 0
        assert value(done, "fleet_trio_node_jobs", state="done") == 1
        assert value(done, "fleet_trio_node_queue_depth") == 0
        finished = {"task_type": "gated", "state": "done"}
        assert value(done, "fleet_trio_node_jobs_finished_total", **finished) == 1
        assert value(done, "fleet_trio_node_job_duration_seconds_count", **finished) == 1
        seconds = value(done, "fleet_trio_node_job_duration_seconds_sum", **finished)
        assert seconds is not None and seconds > 0
        assert value(done, "fleet_trio_log_jobs", state="ended") == 1
        assert (value(done, "fleet_trio_log_retained_bytes") or 0) > log_bytes  # the result


async def test_failed_job_and_refused_dispatches_are_counted(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    gate.write_text("open")
    async with running_node(tmp_path, config(tmp_path)) as h:
        assert (await h.dispatch("bad-1", "no-such-task", {})).status_code == 400
        assert (
            await h.dispatch("job-2", "gated", {"gate": str(gate), "fail": 1})
        ).status_code == 202
        assert (await h.wait_terminal("job-2"))["state"] == "error"
        assert (await h.dispatch("job-2", "gated", {"gate": str(gate)})).status_code == 409
        samples = await scrape(h.client)
        assert value(samples, "fleet_trio_node_dispatch_seconds_count", code="400") == 1
        assert value(samples, "fleet_trio_node_dispatch_seconds_count", code="202") == 1
        assert value(samples, "fleet_trio_node_dispatch_seconds_count", code="409") == 1
        failed = {"task_type": "gated", "state": "error"}
        assert value(samples, "fleet_trio_node_jobs_finished_total", **failed) == 1
        assert value(samples, "fleet_trio_node_jobs", state="error") == 1


async def test_metrics_need_the_token_when_the_node_has_one(tmp_path: Path) -> None:
    async with running_node(tmp_path, config(tmp_path), token="s3cret") as h:
        refused = await h.client.get("/metrics")
        assert refused.status_code == 401
        assert refused.json() == {"status": "error", "error": "unauthorized"}
        samples = await scrape(h.client, Authorization="Bearer s3cret")
        assert value(samples, "fleet_trio_node_queue_depth") == 0


async def test_openmetrics_when_the_scraper_asks_for_it(tmp_path: Path) -> None:
    async with running_node(tmp_path, config(tmp_path)) as h:
        r = await h.client.get("/metrics", headers={"Accept": "application/openmetrics-text"})
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("application/openmetrics-text")
        assert r.text.endswith("# EOF\n")
        assert "fleet_trio_node_queue_depth 0.0" in r.text


async def test_no_snapshot_leaves_vram_out_and_serves_the_rest(tmp_path: Path) -> None:
    sampler = FakeSampler()
    async with running_node(tmp_path, config(tmp_path), sampler=sampler) as h:
        sampler.snap = None  # the snapshot went away (a fake; the real sampler keeps it)
        samples = parse((await h.client.get("/metrics")).text)
        assert value(samples, "fleet_trio_gpu_vram_total_bytes", gpu="0") is None
        assert value(samples, "fleet_trio_node_queue_depth") == 0
