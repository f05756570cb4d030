"""The Python part of ``scripts/gpu-smoke``: what ``fleet_trio.gpu`` sees of a real NVIDIA GPU.

Sections (each prints a ``==`` header):

1. NVML snapshot through ``open_source("nvml")`` (falls back to ``"smi"`` and says so): device
   name, ``gpu_arch``, total / used / free.
2. A child that allocates 2 GiB with torch for 3 s, sampled with ``measure_job_peak`` (mode
   ``auto``, its pid as the process group, a ``FLEET_JOB_ID`` marker): per-process attribution
   (pid → bytes) and the peak. Skipped, with a note, when torch is not importable.
3. The peak recorded into a temporary ``FootprintStore``; the record as health lists it.
5. The worker's host side: the GPU labels a probe pass produces (NVML, nvidia-smi fallback),
   and ``examples/verify.d/10-gpu-memory-free`` failing while a torch child holds memory on
   GPU 0 and passing once it is gone.
4. End to end: ``fleet-trio node --gpu auto`` with a one-task config (``examples/tasks/
   torch_alloc.py``), a dispatch, polls until ``done``, and the ``model_footprints`` that health
   then advertises (the node's own per-job sampler measured it).
6. Multi-GPU: ``fleet-trio node --gpu auto``'s health lists exactly the devices NVML
   enumerates in ``gpu_devices`` (index, UUID, name, total; absent on a one-device machine),
   and ``gpu: true`` jobs (one per device, at once) each see exactly the device they were
   pinned to: torch in the child reports one device, whose UUID is its
   ``CUDA_VISIBLE_DEVICES``. The torch part is skipped, with a note, when torch is absent.

Exit status: 0 when every step that must work did; 1 when one failed (no GPU source, a failed
snapshot, a torch child that failed or was not attributed); 2 on usage errors.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import httpx
import trio

from fleet_trio.gpu import (
    GIB,
    FootprintKey,
    FootprintStore,
    GpuError,
    GpuSource,
    gpu_arch,
    measure_job_peak,
    open_source,
)
from fleet_trio.gpu.smi import find_nvidia_smi

ALLOC_BYTES = 2 * GIB
HOLD_SECONDS = 3
TORCH_CHILD = (
    "import torch, time; "
    f"x = torch.empty({ALLOC_BYTES}, dtype=torch.uint8, device='cuda'); "
    "torch.cuda.synchronize(); "
    f"time.sleep({HOLD_SECONDS})"
)
CHILD_TIMEOUT = 120.0


NODE_PORT = 18899
NODE_TASK = "torch-alloc"
NODE_TIMEOUT = 180.0
TASK_SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "tasks" / "torch_alloc.py"


def header(text: str) -> None:
    print(f"== {text}", flush=True)


def fail(text: str) -> None:
    print(f"FAIL: {text}", flush=True)


def open_gpu() -> GpuSource | None:
    try:
        return open_source("nvml")
    except GpuError as nvml_error:
        print(f"NVML unavailable ({nvml_error}); falling back to nvidia-smi")
        if find_nvidia_smi() is None:
            fail("no GPU source: NVML did not initialise and nvidia-smi is not on PATH")
            return None
        try:
            return open_source("smi")
        except GpuError as smi_error:
            fail(f"no GPU source: {smi_error}")
            return None


def torch_python() -> str | None:
    """The interpreter the allocating child runs under, or None when none has CUDA torch.

    ``GPU_SMOKE_TORCH_PYTHON`` if set; else this interpreter; else ``python3`` on PATH (a GPU
    box's system Python often holds torch while the project's venv does not).
    """
    override = os.environ.get("GPU_SMOKE_TORCH_PYTHON")
    candidates = [override] if override else [sys.executable, shutil.which("python3")]
    for candidate in dict.fromkeys(c for c in candidates if c):
        probe = subprocess.run(
            [candidate, "-c", "import torch; print(torch.cuda.is_available())"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if probe.returncode != 0:
            print(f"torch is not importable by {candidate}")
            continue
        if probe.stdout.strip() != "True":
            print(f"{candidate}: torch is importable but torch.cuda.is_available() is False")
            continue
        print(f"torch child interpreter: {candidate}")
        return candidate
    print("no interpreter with CUDA torch; skipping the allocation check")
    return None


async def snapshot_section(source: GpuSource) -> bool:
    header(f"VRAM snapshot (source: {source.name})")
    try:
        name = await source.device_name()
        snap = await source.snapshot()
    except GpuError as exc:
        fail(f"snapshot: {exc}")
        return False
    print(f"device    {name or '(unknown)'}")
    print(f"gpu_arch  {gpu_arch(name)}")
    print(f"total     {snap.total_gb:8.2f} GiB")
    print(f"used      {snap.used_gb:8.2f} GiB")
    print(f"free      {snap.free_gb:8.2f} GiB")
    return True


async def measure_section(source: GpuSource, python: str) -> float | None:
    """Run the torch child, sampled; returns the peak (GiB) or None on failure."""
    header(f"per-job sampling: a child allocating {ALLOC_BYTES / GIB:g} GiB with torch")
    job_id = f"gpu-smoke-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "FLEET_JOB_ID": job_id}
    seen: dict[int, int] = {}
    accounted = True
    stop = trio.Event()
    peak: float | None = None

    async def sample() -> None:
        nonlocal peak
        peak = await measure_job_peak(
            source, pgid=proc.pid, marker=("FLEET_JOB_ID", job_id), stop=stop, mode="auto"
        )

    async def watch() -> None:  # the raw per-process view, for the report
        nonlocal accounted
        while not stop.is_set():
            used = await source.process_used_bytes()
            if used is None:
                accounted = False
            elif used:
                for pid, nbytes in used.items():
                    seen[pid] = max(seen.get(pid, 0), nbytes)
            with trio.move_on_after(0.5):
                await stop.wait()

    proc = await trio.lowlevel.open_process(
        [python, "-c", TORCH_CHILD], env=env, start_new_session=True
    )
    print(f"child pid {proc.pid} (its own process group), marker FLEET_JOB_ID={job_id}")
    with trio.move_on_after(CHILD_TIMEOUT) as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sample)
            nursery.start_soon(watch)
            await proc.wait()
            stop.set()
    if scope.cancelled_caught:
        proc.kill()
        await proc.wait()
        fail(f"the torch child did not finish within {CHILD_TIMEOUT:g}s")
        return None
    if proc.returncode != 0:
        fail(f"the torch child exited with status {proc.returncode}")
        return None
    if not accounted:
        print("per-process attribution: unavailable on this source (auto used the global delta)")
    else:
        print("per-process attribution (largest seen while the child ran):")
        for pid, nbytes in sorted(seen.items()):
            mark = "  <- the child" if pid == proc.pid else ""
            print(f"  pid {pid:>8}  {nbytes:>14,d} bytes  ({nbytes / GIB:.2f} GiB){mark}")
        if not seen:
            print("  (no process reported)")
    if peak is None:
        fail("no successful sample")
        return None
    print(f"peak      {peak:.3f} GiB (allocated {ALLOC_BYTES / GIB:g} GiB + CUDA context)")
    if peak < ALLOC_BYTES / GIB:
        fail(f"peak {peak:.3f} GiB is below the {ALLOC_BYTES / GIB:g} GiB the child allocated")
        return None
    return peak


async def store_section(peak: float) -> bool:
    header("footprint record (temporary store, margin 1.2)")
    with tempfile.TemporaryDirectory(prefix="gpu-smoke-") as tmp:
        store = await FootprintStore.open(os.path.join(tmp, "footprints.json"), margin=1.2)
        entry = await store.record(FootprintKey("gpu-smoke", "", "torch-alloc"), peak)
        if entry is None:
            fail("the store dropped the peak")
            return False
        wire: dict[str, Any] = entry.to_wire()
        print(f"as health lists it: {wire}")
    return True


def node_config(python: str) -> str:
    return (
        "node:\n"
        "  node_id: gpu-smoke\n"
        "tasks:\n"
        f"  {NODE_TASK}:\n"
        "    family: gpu-smoke\n"
        '    footprint: { family: gpu-smoke, quant: "" }\n'
        f"    command: [{json.dumps(python)}, {json.dumps(str(TASK_SCRIPT))}]\n"
        "    timeout: 2m\n"
        "    gpu: true\n"
    )


async def healthy(client: httpx.AsyncClient) -> dict[str, Any]:
    """Poll ``/fleet/health`` until the node answers 200; its body."""
    while True:
        try:
            health = await client.get("/fleet/health")
            if health.status_code == 200:
                body: dict[str, Any] = health.json()
                return body
        except httpx.TransportError:
            pass
        await trio.sleep(0.2)


async def finished(client: httpx.AsyncClient, job_id: str, every: float) -> dict[str, Any]:
    """Poll the job's status until it is ``done`` or ``error``; that status."""
    while True:
        status: dict[str, Any] = (await client.get(f"/fleet/jobs/{job_id}")).json()
        if status["state"] in ("done", "error"):
            return status
        await trio.sleep(every)


async def stop_node(node: trio.Process) -> None:
    """SIGTERM, up to 40 s for the drain, then SIGKILL."""
    node.terminate()
    with trio.move_on_after(40, shield=True):
        await node.wait()
    if node.returncode is None:
        node.kill()


async def node_section(python: str) -> bool:
    header("end to end: fleet-trio node --gpu auto, a dispatched torch job, health's footprints")
    base = f"http://127.0.0.1:{NODE_PORT}"
    with tempfile.TemporaryDirectory(prefix="gpu-smoke-node-") as tmp:
        cfg = Path(tmp) / "node.yaml"
        cfg.write_text(node_config(python))
        argv = [
            sys.executable,
            "-m",
            "fleet_trio",
            "node",
            "-c",
            str(cfg),
            "--gpu",
            "auto",
            "--listen",
            f"127.0.0.1:{NODE_PORT}",
            "--footprints",
            f"{tmp}/fp.json",
        ]
        node = await trio.lowlevel.open_process(argv)
        try:
            with trio.fail_after(NODE_TIMEOUT):
                async with httpx.AsyncClient(base_url=base, timeout=10) as client:
                    body = await healthy(client)
                    print(
                        f"health before: vram_total_gb={body['vram_total_gb']} "
                        f"vram_free_gb={body['vram_free_gb']} gpu_arch={body['gpu_arch']}"
                    )
                    job_id = f"smoke-{uuid.uuid4().hex[:8]}"
                    job = {
                        "job_id": job_id,
                        "task_type": NODE_TASK,
                        "payload": {"gib": ALLOC_BYTES / GIB, "seconds": HOLD_SECONDS},
                    }
                    t0 = trio.current_time()
                    ack = await client.post("/fleet/dispatch", json=job)
                    ack_ms = (trio.current_time() - t0) * 1000
                    print(f"dispatch: {ack.status_code} {ack.text.strip()} ({ack_ms:.1f} ms)")
                    status = await finished(client, job_id, 0.5)
                    print(f"job: {json.dumps(status)}")
                    body = (await client.get("/fleet/health")).json()
                    print(f"health after: model_footprints={body['model_footprints']}")
        except trio.TooSlowError:
            fail(f"the node check did not finish within {NODE_TIMEOUT:g}s")
            return False
        finally:
            await stop_node(node)
    if status["state"] != "done":
        fail("the dispatched torch job did not end done")
        return False
    fps = [f for f in body["model_footprints"] if f.get("task_type") == NODE_TASK]
    if not fps or fps[0]["vram_peak_gb"] < ALLOC_BYTES / GIB:
        fail("health does not advertise a footprint at least the allocated size")
        return False
    return True


VERIFY_SCRIPT = TASK_SCRIPT.parent.parent / "verify.d" / "10-gpu-memory-free"


async def worker_section(python: str | None) -> bool:
    from fleet_trio.worker.config import DeviceConfig, WorkerConfig
    from fleet_trio.worker.probes import Prober

    header("worker: GPU labels from a probe pass (NVML first, nvidia-smi fallback)")
    cfg = WorkerConfig(
        controller_url="http://127.0.0.1:1",
        host="gpu-smoke",
        devices=(DeviceConfig(name="gpu0"),),
        probe_dir="/nonexistent",
    )
    prober = Prober(cfg)
    labels = prober.wire_labels(await prober.run_pass())
    print(f"labels: {json.dumps(labels, sort_keys=True)}")
    ok = labels is not None and "vram" in labels.get("gpu0", {})
    if not ok:
        fail("no gpu0 facts in the labels")
    if python is None:
        header("worker: verify example skipped (no torch to hold memory)")
        return ok
    header("worker: examples/verify.d/10-gpu-memory-free with memory held, then free")
    env = {**os.environ, "RC_DEVICE": "gpu-smoke:gpu0", "RC_JOB_ID": "smoke"}

    async def verify() -> subprocess.CompletedProcess[bytes]:
        return await trio.run_process(
            [str(VERIFY_SCRIPT)], env=env, capture_stdout=True, capture_stderr=True, check=False
        )

    hold_20s = TORCH_CHILD.replace(f"time.sleep({HOLD_SECONDS})", "time.sleep(20)")
    holder = await trio.lowlevel.open_process([python, "-c", hold_20s])
    try:
        with trio.fail_after(60):
            while True:  # wait until the allocation shows
                held = await verify()
                if held.returncode != 0:
                    break
                await trio.sleep(0.5)
        print(f"held:  exit {held.returncode}: {held.stderr.decode().strip().splitlines()[-1]}")
    finally:
        holder.kill()
        await holder.wait()
    with trio.fail_after(60):
        while True:
            free = await verify()
            if free.returncode == 0:
                break
            await trio.sleep(0.5)
    print(f"freed: exit {free.returncode}: {free.stderr.decode().strip() or '(no output)'}")
    return ok


MULTI_PORT = 18898
PINNED_TASK = "pinned"
PINNED_CHILD = r"""
import json, os, sys, time
out = {"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
       "nvidia_visible_devices": os.environ.get("NVIDIA_VISIBLE_DEVICES", "")}
try:
    import torch
except ImportError:
    out["torch"] = None
else:
    out["torch"] = torch.__version__
    out["count"] = torch.cuda.device_count()
    if out["count"]:
        props = torch.cuda.get_device_properties(0)
        uuid = getattr(props, "uuid", None)
        out["uuid"] = None if uuid is None else str(uuid)
        out["name"] = props.name
        torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
time.sleep(float(os.environ.get("PINNED_HOLD", "2")))
print(json.dumps(out))
"""


def _bare_uuid(text: str) -> str:
    """``GPU-8f6c…`` and torch's ``8f6c…`` compare equal (MIG ids keep their prefix)."""
    return text.strip().lower().removeprefix("gpu-")


def pinned_config(python: str) -> str:
    return (
        "node:\n"
        "  node_id: gpu-smoke-multi\n"
        "tasks:\n"
        f"  {PINNED_TASK}:\n"
        f"    command: [{json.dumps(python)}, '-c', {json.dumps(PINNED_CHILD)}]\n"
        "    timeout: 2m\n"
        "    gpu: true\n"
    )


def compare_devices(
    listed: list[dict[str, Any]] | None, expected: list[dict[str, Any]]
) -> list[str]:
    """What differs between health's ``gpu_devices`` and the enumeration (empty: they match).
    ``expected``: index, uuid, name, vram_total_gb per device; free is not compared (it moves).
    """
    if len(expected) == 1:
        return [] if listed is None else ["gpu_devices is present on a one-device machine"]
    if listed is None:
        return [f"gpu_devices is absent but the machine has {len(expected)} devices"]
    problems = []
    keys = ["index", "uuid", "name", "vram_total_gb", "vram_free_gb"]
    for entry in listed:
        if list(entry) != keys:
            problems.append(f"gpu_devices entry has members {list(entry)}, want {keys}")
    got = [(d.get("index"), d.get("uuid"), d.get("name"), d.get("vram_total_gb")) for d in listed]
    want = [(d["index"], d["uuid"], d["name"], d["vram_total_gb"]) for d in expected]
    if got != want:
        problems.append(f"gpu_devices {got} != enumerated {want}")
    return problems


async def multi_gpu_section(
    python: str | None,
    *,
    gpu_args: tuple[str, ...] = ("--gpu", "auto"),
    port: int = MULTI_PORT,
) -> bool:
    """Health's ``gpu_devices`` against the enumeration, then one pinned job per device."""
    from fleet_trio.gpu.source import open_devices

    header("multi-GPU: health's gpu_devices against the enumeration, pinned jobs")
    kind = gpu_args[gpu_args.index("--gpu") + 1] if "--gpu" in gpu_args else "auto"
    fake_dir = gpu_args[gpu_args.index("--fake-gpu-dir") + 1] if kind == "fake" else None
    fake_gpus = int(gpu_args[gpu_args.index("--fake-gpus") + 1]) if "--fake-gpus" in gpu_args else 1
    try:
        found = await open_devices(kind, fake_dir=fake_dir, fake_gpus=fake_gpus)
        expected = []
        for device in found.devices:
            snap = await device.source.snapshot()
            expected.append(
                {
                    "index": device.index,
                    "uuid": device.uuid,
                    "name": device.name,
                    "vram_total_gb": snap.total_gb,
                }
            )
        await found.aclose()
    except GpuError as exc:
        fail(f"device enumeration: {exc}")
        return False
    for d in expected:
        print(f"device {d['index']}: {d['uuid']} {d['name']} {d['vram_total_gb']:.2f} GiB")
    child_python = python or sys.executable
    base = f"http://127.0.0.1:{port}"
    ok = True
    with tempfile.TemporaryDirectory(prefix="gpu-smoke-multi-") as tmp:
        cfg = Path(tmp) / "node.yaml"
        cfg.write_text(pinned_config(child_python))
        argv = [sys.executable, "-m", "fleet_trio", "node", "-c", str(cfg), *gpu_args]
        argv += ["--listen", f"127.0.0.1:{port}", "--footprints", f"{tmp}/fp.json"]
        node = await trio.lowlevel.open_process(argv)
        results: list[dict[str, Any]] = []
        try:
            with trio.fail_after(NODE_TIMEOUT):
                async with httpx.AsyncClient(base_url=base, timeout=10) as client:
                    listed = (await healthy(client)).get("gpu_devices")
                    print(f"gpu_devices: {json.dumps(listed)}")
                    for problem in compare_devices(listed, expected):
                        fail(problem)
                        ok = False
                    jobs = [f"pinned-{uuid.uuid4().hex[:8]}" for _ in expected[:8]]
                    for job_id in jobs:
                        body = {"job_id": job_id, "task_type": PINNED_TASK}
                        await client.post("/fleet/dispatch", json=body)
                    for job_id in jobs:
                        status = await finished(client, job_id, 0.3)
                        if status["state"] != "done":
                            fail(f"pinned job {job_id}: {status.get('error')}")
                            ok = False
                            continue
                        results.append(status["data"])
        except trio.TooSlowError:
            fail(f"the multi-GPU check did not finish within {NODE_TIMEOUT:g}s")
            return False
        finally:
            await stop_node(node)
    uuids = {d["uuid"] for d in expected}
    pins = [r["cuda_visible_devices"] for r in results]
    print(f"pinned to: {pins}")
    if len(expected) == 1:
        # a one-GPU machine is the v2 node: the job's environment is left alone; the job
        # must still see exactly that one device
        if any(pins):
            fail(f"a one-GPU node pinned a job ({pins}); it should leave CUDA_VISIBLE_DEVICES")
            ok = False
        for r in results:
            r["cuda_visible_devices"] = expected[0]["uuid"]
    elif any(r["cuda_visible_devices"] not in uuids for r in results) or any(
        r["cuda_visible_devices"] != r["nvidia_visible_devices"] for r in results
    ):
        fail("a job was not pinned to exactly one of the node's devices by UUID")
        ok = False
    if len(set(pins)) != len(pins):
        fail("two jobs that ran at once were pinned to the same device")
        ok = False
    if python is None or not results or results[0].get("torch") is None:
        print("torch is not available to the child: the torch pinning check is skipped")
        return ok
    for r in results:
        if r.get("count") != 1:
            pinned = r["cuda_visible_devices"]
            fail(f"torch in a job pinned to {pinned} sees {r.get('count')} devices")
            ok = False
        elif r.get("uuid") is None:
            print(f"torch {r['torch']} reports no device UUID; it sees one device ({r['name']})")
        elif _bare_uuid(r["uuid"]) != _bare_uuid(r["cuda_visible_devices"]):
            fail(f"torch sees {r['uuid']} but the job was pinned to {r['cuda_visible_devices']}")
            ok = False
        else:
            print(f"torch in the job sees exactly {r['cuda_visible_devices']} ({r['name']})")
    return ok


async def amain() -> int:
    header("GPU source: NVML (fleet_trio.gpu.open_source)")
    source = await trio.to_thread.run_sync(open_gpu)
    if source is None:
        print("this check needs a machine with an NVIDIA GPU and its driver")
        return 1
    status = 0
    try:
        if not await snapshot_section(source):
            return 1
        header("torch")
        python = await trio.to_thread.run_sync(torch_python)
        if python is not None:
            peak = await measure_section(source, python)
            if peak is None or not await store_section(peak):
                status = 1
            if not await node_section(python):
                status = 1
        else:
            header("footprint record: skipped (no peak without torch)")
        if not await worker_section(python):
            status = 1
        if not await multi_gpu_section(python):
            status = 1
    finally:
        aclose = getattr(source, "aclose", None)
        if aclose is not None:
            await aclose()
    return status


def main() -> int:
    if len(sys.argv) > 1:
        print(__doc__)
        return 2
    return trio.run(amain)


if __name__ == "__main__":
    sys.exit(main())
