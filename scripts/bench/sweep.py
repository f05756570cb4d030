"""Benchmark: one RC_JOB_ID sweep pass vs. a loop that only reads every ``/proc/*/environ``.

Starts 500 extra idle processes (``sleep 300``), then times, interleaved, N repetitions of

* ``sweep``:    one full ``sweep_job_survivors`` for a fresh job id (nothing matches), i.e.
                ancestor set + marker scan (+ its settling re-listing) in a worker thread;
* ``scan``:     the marker scan alone, called directly (no thread hop);
* ``baseline``: list ``/proc`` and read every ``/proc/<pid>/environ`` (nothing else),

prints the medians and the ratios (target: sweep / baseline ≤ 1.5), then kills the 500.

Run: ``.venv/bin/python scripts/bench/sweep.py [--procs 500] [--reps 40]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import uuid

import trio

from fleet_trio.proc.procfs import ancestor_set, scan_job_marker
from fleet_trio.proc.sweep import sweep_job_survivors


def baseline_pass() -> int:
    """The floor: list /proc and read every environ, nothing else. Returns bytes read."""
    total = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fd = os.open(f"/proc/{name}/environ", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            total += len(os.read(fd, 32768))
        except OSError:
            pass
        finally:
            os.close(fd)
    return total


async def bench(reps: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"sweep": [], "scan": [], "baseline": []}
    me = os.getpid()
    protected = frozenset(ancestor_set(me))
    # Warm up every path once (thread pool, page cache of the dentries).
    await sweep_job_survivors(f"bench-{uuid.uuid4()}", me)
    scan_job_marker(f"bench-{uuid.uuid4()}", protected)
    baseline_pass()
    for rep in range(reps):
        job = f"bench-{uuid.uuid4()}"
        order = ("sweep", "scan", "baseline")
        shift = rep % len(order)  # rotate, so no variant always runs first (caches, wakeups)
        for key in order[shift:] + order[:shift]:
            t0 = time.perf_counter()
            if key == "sweep":
                rep_ = await sweep_job_survivors(job, me)
                assert rep_.scanned and not rep_.found, rep_
            elif key == "scan":
                res = scan_job_marker(job, protected)
                assert res.scanned and not res.pids, res
            else:
                baseline_pass()
            times[key].append(time.perf_counter() - t0)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--procs", type=int, default=500, help="extra idle processes")
    parser.add_argument("--reps", type=int, default=40, help="repetitions of each")
    args = parser.parse_args()

    sleepers: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(args.procs):
            sleepers.append(
                subprocess.Popen(
                    ["sleep", "300"],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        nprocs = sum(1 for n in os.listdir("/proc") if n.isdigit())
        times = trio.run(bench, args.reps)
    finally:
        for p in sleepers:
            p.kill()
        for p in sleepers:
            p.wait()

    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"processes in /proc: {nprocs} ({args.procs} extra sleepers), reps: {args.reps}")
    for key in ("sweep", "scan", "baseline"):
        print(f"  {key:<9} median {med[key] * 1e3:8.3f} ms   min {min(times[key]) * 1e3:8.3f} ms")
    ratio = med["sweep"] / med["baseline"]
    print(f"  ratio sweep/baseline: {ratio:.2f}   (target <= 1.5)")
    print(f"  ratio scan/baseline:  {med['scan'] / med['baseline']:.2f}")
    return 0 if ratio <= 1.5 else 1


if __name__ == "__main__":
    sys.exit(main())
