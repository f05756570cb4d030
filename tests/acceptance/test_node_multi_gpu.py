"""Issue 16 — multi-GPU nodes: every device advertised, one pinned job per device.

Real child processes on the fake GPU (``fleet_trio.gpu.fake``); the node is started in
process through the sim harness (``fleet_trio.sim.harness.open_node``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import httpx
import trio

from fleet_trio.gpu import GIB, FootprintKey, FootprintStore
from fleet_trio.node.wire import GPU_DEVICE_FIELDS, HEALTH_FIELDS
from fleet_trio.sim.harness import NodeHandle, open_fake_gpu, open_node
from tests.helpers import wait_until
from tests.metrics.scrape import scrape, value

# -- single device: the v2 health payload is byte-identical to the one before multi-GPU ------

SINGLE_HEALTH = (
    b'{"node_id":"sim-node","schema_version":1,"gpu_vendor":"nvidia","gpu_arch":"nvidia",'
    b'"vram_total_gb":80.0,"vram_free_gb":78.5,"supported_task_types":["sleepy"],'
    b'"loadable_model_families":["fam"],"model_footprints":[],"queue_depth":0}\n'
)


def _sleepy_config(seconds: float = 0.0, node_gpu: Any = None, **task: Any) -> dict[str, Any]:
    """One task ``sleepy`` (family ``fam``): sleeps, prints its pinning and its start/end."""
    script = (
        "import json, os, sys, time; p = json.loads(sys.stdin.read() or '{}'); t0 = time.time();"
        f" time.sleep(p.get('sleep', {seconds!r})); "
        # a rendezvous: n jobs that run at once meet in a directory (a job alone times out)
        "m = p.get('meet'); m and open(os.path.join(m, str(os.getpid())), 'w').close(); "
        "end = time.time() + 30\n"
        "while m and len(os.listdir(m)) < p['n'] and time.time() < end: time.sleep(0.02)\n"
        # and then wait for the test's go-ahead (a file), when the payload names one
        "g = p.get('go')\n"
        "while g and not os.path.exists(g) and time.time() < end: time.sleep(0.02)\n"
        "print(json.dumps({'cuda': os.environ.get('CUDA_VISIBLE_DEVICES'), "
        "'nvidia': os.environ.get('NVIDIA_VISIBLE_DEVICES'), 't0': t0, 't1': time.time()}))"
    )
    node: dict[str, Any] = {
        "timings": {
            "drain_timeout": "2s",
            "kill_grace": "500ms",
            "health_sample_interval": "200ms",
            "max_snapshot_age": "1s",
        }
    }
    if node_gpu is not None:
        node["gpu"] = node_gpu
    return {
        "node": node,
        "tasks": {"sleepy": {"command": [sys.executable, "-c", script], "family": "fam", **task}},
    }


async def _health(node: NodeHandle) -> tuple[int, dict[str, Any]]:
    r = await node.client.get("/fleet/health")
    body: dict[str, Any] = json.loads(r.content)
    return r.status_code, body


async def health_reads(node: NodeHandle, free_gb: float) -> httpx.Response | None:
    """The health answer once it is 200 and reads ``free_gb`` free; else ``None``."""
    r = await node.client.get("/fleet/health")
    ok = r.status_code == 200 and json.loads(r.content)["vram_free_gb"] == free_gb
    return r if ok else None


async def health_has(node: NodeHandle, key: str, value: object) -> bool:
    return (await _health(node))[1].get(key) == value


async def health_status_is(node: NodeHandle, status: int) -> bool:
    return (await _health(node))[0] == status


async def health_devices_are(node: NodeHandle, count: int) -> bool:
    return len((await _health(node))[1].get("gpu_devices", [])) == count


async def _data(node: NodeHandle, job_id: str) -> dict[str, Any]:
    body = await node.wait(job_id, 30)
    assert body["state"] == "done", body
    data: dict[str, Any] = body["data"]
    return data


async def test_node_multi_gpu_single_device_health_bytes(tmp_path: Path) -> None:
    config = _sleepy_config()
    config["node"]["timings"] = {"drain_timeout": "2s", "kill_grace": "500ms"}
    async with (
        open_fake_gpu(tmp_path / "gpu") as gpu,
        open_node(config, fake_gpu=gpu, workdir=tmp_path / "node") as node,
    ):
        await gpu.hold("1.5G")
        r = await wait_until(lambda: health_reads(node, 78.5), timeout=15)
        assert r.content == SINGLE_HEALTH
        # and /metrics still reads the sampler as before (snapshot, counters, gpu="0")
        samples = await scrape(node.client)
    assert value(samples, "fleet_trio_gpu_vram_free_bytes", gpu="0") == 78.5 * GIB
    assert (value(samples, "fleet_trio_gpu_samples_total", gpu="0") or 0) >= 1
    assert value(samples, "fleet_trio_gpu_sample_failures_total", gpu="0") == 0


# -- acceptance: three gpu: true jobs of 1.5 s on two devices --------------------------------


async def test_node_multi_gpu_two_devices_run_two_jobs_at_once(tmp_path: Path) -> None:
    async with (
        open_fake_gpu(tmp_path / "gpu", devices=2) as gpu,
        open_node(_sleepy_config(1.5, gpu=True), fake_gpu=gpu, workdir=tmp_path / "n") as node,
    ):
        uuids = {gpu.uuid(0), gpu.uuid(1)}
        assert len(uuids) == 2
        meet, go = tmp_path / "meet", tmp_path / "go"
        meet.mkdir()
        # the first two meet (they run at once), then hold their devices until told to go
        payload = {"meet": str(meet), "n": 2, "go": str(go)}
        ids = [await node.submit("sleepy", payload) for _ in range(3)]
        with trio.fail_after(10):  # all three are in flight: two running, one queued
            await wait_until(lambda: health_has(node, "queue_depth", 3))
        go.touch()
        first, second, third = [await _data(node, i) for i in ids]
    assert {first["cuda"], second["cuda"]} == uuids  # distinct devices, by UUID
    assert first["nvidia"] == first["cuda"] and second["nvidia"] == second["cuda"]
    assert max(first["t0"], second["t0"]) < min(first["t1"], second["t1"])  # at once
    assert third["cuda"] in uuids
    assert third["t0"] >= min(first["t1"], second["t1"])  # it waited for a device


async def test_node_multi_gpu_health_lists_every_device(tmp_path: Path) -> None:
    async with (
        open_fake_gpu(tmp_path / "gpu", devices=2, total_gib=[40.0, 80.0]) as gpu,
        open_node(_sleepy_config(gpu=True), fake_gpu=gpu, workdir=tmp_path / "n") as node,
    ):
        await gpu.hold("10G", device=1)
        await wait_until(lambda: health_has(node, "vram_free_gb", 70.0), timeout=10)
        status, body = await _health(node)
        samples = await scrape(node.client)
    assert status == 200
    assert list(body) == [*HEALTH_FIELDS, "gpu_devices"]
    assert body["schema_version"] == 1
    assert (body["vram_total_gb"], body["vram_free_gb"]) == (80.0, 70.0)  # the largest device
    assert body["gpu_devices"] == [
        {
            "index": 0,
            "uuid": gpu.uuid(0),
            "name": "Fake GPU",
            "vram_total_gb": 40.0,
            "vram_free_gb": 40.0,
        },
        {
            "index": 1,
            "uuid": gpu.uuid(1),
            "name": "Fake GPU",
            "vram_total_gb": 80.0,
            "vram_free_gb": 70.0,
        },
    ]
    assert all(list(d) == list(GPU_DEVICE_FIELDS) for d in body["gpu_devices"])
    free = {u: value(samples, "fleet_trio_gpu_device_vram_free_bytes", index=str(i), uuid=u)
            for i, u in enumerate((gpu.uuid(0), gpu.uuid(1)))}  # fmt: skip
    assert free == {gpu.uuid(0): 40 * GIB, gpu.uuid(1): 70 * GIB}
    assert value(samples, "fleet_trio_gpu_vram_free_bytes", gpu="0") == 70 * GIB  # headline


async def test_node_multi_gpu_primary_uuid_pins_the_headline(tmp_path: Path) -> None:
    async with open_fake_gpu(tmp_path / "gpu", devices=2, total_gib=[40.0, 80.0]) as gpu:
        config = _sleepy_config(node_gpu={"primary_gpu_uuid": gpu.uuid(0)}, gpu=True)
        async with open_node(config, fake_gpu=gpu, workdir=tmp_path / "n") as node:
            status, body = await _health(node)
            assert status == 200
            assert (body["vram_total_gb"], body["vram_free_gb"]) == (40.0, 40.0)
            # the pinned device stops reading: health's stale rule applies to it
            await gpu.fail(device=0)
            await wait_until(lambda: health_status_is(node, 503), timeout=10)
            assert (await _health(node))[1] == {"status": "error", "error": "vram snapshot stale"}


async def test_node_multi_gpu_devices_restricts_the_node(tmp_path: Path) -> None:
    async with open_fake_gpu(tmp_path / "gpu", devices=3) as gpu:
        config = _sleepy_config(node_gpu={"devices": [gpu.uuid(2), 0]}, gpus=2)
        async with open_node(config, fake_gpu=gpu, workdir=tmp_path / "n") as node:
            _status, body = await _health(node)
            data = await _data(node, await node.submit("sleepy"))
    assert [d["index"] for d in body["gpu_devices"]] == [0, 2]
    assert data["cuda"] == f"{gpu.uuid(0)},{gpu.uuid(2)}"


# -- acceptance: a footprint larger than one device's free VRAM waits for one that fits ------


async def test_node_multi_gpu_footprint_waits_for_a_device_that_fits(tmp_path: Path) -> None:
    store = await FootprintStore.open(str(tmp_path / "n" / "footprints.json"))
    await store.record(FootprintKey("fam", "", "sleepy"), 25.0)  # advertised 30.0 GiB
    async with open_fake_gpu(tmp_path / "gpu", devices=2) as gpu:
        await gpu.hold("60G", device=0)  # device 0: 20 GiB free, too little for 30
        async with open_node(
            _sleepy_config(1.5, gpu=True, footprint={"family": "fam"}),
            fake_gpu=gpu,
            workdir=tmp_path / "n",
        ) as node:
            first = await node.submit("sleepy")
            second = await node.submit("sleepy")
            a, b = await _data(node, first), await _data(node, second)
    assert a["cuda"] == b["cuda"] == gpu.uuid(1)  # never the device without room
    assert b["t0"] >= a["t1"]  # the second waited for device 1


# -- acceptance: a stale device does not stop jobs on the others ------------------------------


async def test_node_multi_gpu_stale_device_does_not_stop_the_others(tmp_path: Path) -> None:
    async with (
        open_fake_gpu(tmp_path / "gpu", devices=2) as gpu,
        open_node(_sleepy_config(gpu=True), fake_gpu=gpu, workdir=tmp_path / "n") as node,
    ):
        await gpu.fail("driver fell off the bus", device=0)
        await wait_until(lambda: health_devices_are(node, 1), timeout=10)
        # health judges a snapshot's age when asked, placement at each sampling round: wait
        # for the round that tells placement too (a round can be late on a busy machine)
        slot = node.node.context.runner.placement.allocator.slot(gpu.uuid(0))
        await wait_until(lambda: not slot.usable, timeout=10, what="placement sees gpu0 stale")
        status, body = await _health(node)
        assert status == 200  # the headline is the device that still reads
        assert body["gpu_devices"][0]["uuid"] == gpu.uuid(1)
        ids = [await node.submit("sleepy") for _ in range(3)]
        pinned = {(await _data(node, i))["cuda"] for i in ids}
    assert pinned == {gpu.uuid(1)}


async def test_node_multi_gpu_one_gpu_machine_stays_v2(tmp_path: Path) -> None:
    async with (
        open_fake_gpu(tmp_path / "gpu") as gpu,
        open_node(_sleepy_config(gpu=True), fake_gpu=gpu, workdir=tmp_path / "n") as node,
    ):
        _status, body = await _health(node)
        data = await _data(node, await node.submit("sleepy"))
    assert "gpu_devices" not in body
    assert data["cuda"] is None and data["nvidia"] is None  # the job's environment untouched


async def test_node_multi_gpu_devices_keeping_one_still_pins(tmp_path: Path) -> None:
    async with open_fake_gpu(tmp_path / "gpu", devices=3) as gpu:
        config = _sleepy_config(node_gpu={"devices": [1]}, gpu=True)
        async with open_node(config, fake_gpu=gpu, workdir=tmp_path / "n") as node:
            _status, body = await _health(node)
            data = await _data(node, await node.submit("sleepy"))
    assert "gpu_devices" not in body  # one device from the node's view
    assert data["cuda"] == data["nvidia"] == gpu.uuid(1)
