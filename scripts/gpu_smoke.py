"""The Python part of ``scripts/gpu-smoke``: what ``fleet_trio.gpu`` sees of a real NVIDIA GPU.

Sections (each prints a ``==`` header):

1. NVML snapshot through ``open_source("nvml")`` (falls back to ``"smi"`` and says so): device
   name, ``gpu_arch``, total / used / free.
2. A child that allocates 2 GiB with torch for 3 s, sampled with ``measure_job_peak`` (mode
   ``auto``, its pid as the process group, a ``FLEET_JOB_ID`` marker): per-process attribution
   (pid → bytes) and the peak. Skipped, with a note, when torch is not importable.
3. The peak recorded into a temporary ``FootprintStore``; the record as health lists it.

Exit status: 0 when every step that must work did; 1 when one failed (no GPU source, a failed
snapshot, a torch child that failed or was not attributed); 2 on usage errors.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import uuid
from typing import Any

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


def torch_available() -> bool:
    probe = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if probe.returncode != 0:
        print(f"torch is not importable by {sys.executable}; skipping the allocation check")
        return False
    if probe.stdout.strip() != "True":
        print("torch is importable but torch.cuda.is_available() is False; skipping")
        return False
    return True


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


async def measure_section(source: GpuSource) -> float | None:
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
        [sys.executable, "-c", TORCH_CHILD], env=env, start_new_session=True
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
        if await trio.to_thread.run_sync(torch_available):
            peak = await measure_section(source)
            if peak is None or not await store_section(peak):
                status = 1
        else:
            header("footprint record: skipped (no peak without torch)")
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
