"""Issue 16 — multi-GPU nodes: every device advertised, one pinned job per device.

Real child processes on the fake GPU (``fleet_trio.gpu.fake``); the node is started in
process through the sim harness (``fleet_trio.sim.harness.open_node``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import trio

from fleet_trio.sim.harness import open_fake_gpu, open_node

# -- single device: the v2 health payload is byte-identical to the one before multi-GPU ------

SINGLE_HEALTH = (
    b'{"node_id":"sim-node","schema_version":1,"gpu_vendor":"nvidia","gpu_arch":"nvidia",'
    b'"vram_total_gb":80.0,"vram_free_gb":78.5,"supported_task_types":["sleepy"],'
    b'"loadable_model_families":["fam"],"model_footprints":[],"queue_depth":0}\n'
)


def _sleepy_config(seconds: float = 0.0, **task: Any) -> dict[str, Any]:
    script = (
        "import json, os, sys, time; p = json.loads(sys.stdin.read() or '{}'); "
        "time.sleep(p.get('sleep', %r)); "
        "print(json.dumps({'cuda': os.environ.get('CUDA_VISIBLE_DEVICES'), "
        "'nvidia': os.environ.get('NVIDIA_VISIBLE_DEVICES'), 't0': p.get('t0')}))" % seconds
    )
    return {
        "node": {"timings": {"drain_timeout": "2s", "kill_grace": "500ms"}},
        "tasks": {
            "sleepy": {"command": [sys.executable, "-c", script], "family": "fam", **task}
        },
    }


async def test_node_multi_gpu_single_device_health_bytes(tmp_path: Path) -> None:
    async with (
        open_fake_gpu(tmp_path / "gpu") as gpu,
        open_node(_sleepy_config(), fake_gpu=gpu, workdir=tmp_path / "node") as node,
    ):
        await gpu.hold("1.5G")
        with trio.fail_after(15):
            while True:
                r = await node.client.get("/fleet/health")
                if r.status_code == 200 and json.loads(r.content)["vram_free_gb"] == 78.5:
                    break
                await trio.sleep(0.1)
        assert r.content == SINGLE_HEALTH
