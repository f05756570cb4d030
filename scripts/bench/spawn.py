"""Spawn overhead of ``run()`` against a bare ``trio.run_process`` (target ratio ≤ 1.15).

Runs N trivial jobs (``true``) both ways in the same process, interleaved pair by pair (the
order inside each pair alternates) so that machine noise hits both sides alike, and prints
both medians in milliseconds and the ratio run/baseline; also each side's median CPU time in
this process (the event loop and the spawning thread; the child's own CPU is not counted),
which a loaded machine disturbs far less than the wall clock.

    .venv/bin/python scripts/bench/spawn.py [-n 200] [--warmup 10] [--profile]
    .venv/bin/python scripts/bench/spawn.py -n 300 --before TREE [--rounds 3]

``--profile`` runs only the ``run()`` side under cProfile and prints the top entries.

``--cgroup`` compares ``run()`` under the cgroup backend (docs/containment.md: a job cgroup
made, entered by the spawn shim before the exec, swept and removed per job) against today's
``run()`` (the marker backend), interleaved the same way (target ratio ≤ 1.3); the job
cgroups are made in a temporary cgroup in ours (``--cgroup-base DIR``: in DIR), removed after.
``--cgroup --no-shim`` is a diagnostic: the same, but the child is spawned without the shim
(so it is NOT in its cgroup): what the backend costs besides the shim's exec.

``--before TREE`` compares two versions of ``run()`` in one session: each round runs this
benchmark once with TREE's ``fleet_trio`` (another checkout, e.g. the commit before a change)
and once with this tree's, in a fresh interpreter each, the order alternating round by
round; it prints each run's ratios with the load average it started at, then each tree's
median wall and CPU ratio.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable

import trio

from fleet_trio.proc.containment import (
    CgroupContainment,
    ContainmentError,
    check_writable,
    own_cgroup_dir,
)
from fleet_trio.proc.run import run
from fleet_trio.proc.sinks import NullSink
from fleet_trio.proc.spec import JobSpec

TARGET_RATIO = 1.15
CGROUP_TARGET_RATIO = 1.3

TRUE = shutil.which("true") or "/bin/true"


async def via_run() -> None:
    result = await run(JobSpec(command=["true"]), NullSink())
    assert result.exit_code == 0 and not result.killed, result


async def via_run_process() -> None:
    done = await trio.run_process([TRUE], check=False)
    assert done.returncode == 0


Samples = list[tuple[float, float]]
"""(wall ms, CPU ms) per job."""


async def timed(fn: Callable[[], Awaitable[None]]) -> tuple[float, float]:
    start, cpu = time.perf_counter(), time.process_time()
    await fn()
    return (time.perf_counter() - start) * 1000.0, (time.process_time() - cpu) * 1000.0


def via_run_in(containment: CgroupContainment) -> Callable[[], Awaitable[None]]:
    async def contained() -> None:
        spec = JobSpec(command=["true"], containment=containment, cgroup_key="bench")
        result = await run(spec, NullSink())
        assert result.exit_code == 0 and not result.killed, result

    return contained


async def bench(
    n: int,
    warmup: int,
    ours_fn: Callable[[], Awaitable[None]] = via_run,
    base_fn: Callable[[], Awaitable[None]] = via_run_process,
) -> tuple[Samples, Samples]:
    for _ in range(warmup):
        await ours_fn()
        await base_fn()
    ours: Samples = []
    base: Samples = []
    for i in range(n):
        if i % 2 == 0:
            ours.append(await timed(ours_fn))
            base.append(await timed(base_fn))
        else:
            base.append(await timed(base_fn))
            ours.append(await timed(ours_fn))
    return ours, base


def cgroup_bench(n: int, warmup: int, base_dir: str, no_shim: bool = False) -> int:
    try:
        directory = base_dir or own_cgroup_dir()
        check_writable(directory)
    except ContainmentError as exc:
        print(f"no cgroup to measure in: {exc}", file=sys.stderr)
        return 1
    if no_shim:  # diagnostic only: the child is not contained
        run_module = sys.modules["fleet_trio.proc.run"]
        run_module.shim_argv = lambda _cgroup, argv, _env: argv  # type: ignore[attr-defined]
    parent = os.path.join(directory, f"fleet-trio-bench-{os.getpid()}")
    os.mkdir(parent)
    try:
        ours_s, base_s = trio.run(bench, n, warmup, via_run_in(CgroupContainment(parent)), via_run)
    finally:
        os.rmdir(parent)
    ours = statistics.median(wall for wall, _ in ours_s)
    base = statistics.median(wall for wall, _ in base_s)
    ratio = ours / base
    verdict = "ok" if ratio <= CGROUP_TARGET_RATIO else "ABOVE TARGET"
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    shim = " (NO SHIM: diagnostic)" if no_shim else ""
    print(f"jobs per side      {n} (`true`, interleaved, {warmup} warm-up each){shim}")
    print(f"load average       {load} (at the end)")
    p90_ours = statistics.quantiles([w for w, _ in ours_s], n=10)[-1]
    p90_base = statistics.quantiles([w for w, _ in base_s], n=10)[-1]
    print(f"run() cgroup       {ours:.3f} ms   (p90 {p90_ours:.3f})")
    print(f"run() marker       {base:.3f} ms   (p90 {p90_base:.3f})")
    print(f"ratio cgroup/marker {ratio:.3f}   (target <= {CGROUP_TARGET_RATIO}: {verdict})")
    c_ours = statistics.median(cpu for _, cpu in ours_s)
    c_base = statistics.median(cpu for _, cpu in base_s)
    cpu_ratio = c_ours / c_base
    print(f"CPU ms per job     cgroup {c_ours:.3f}   marker {c_base:.3f}   ratio {cpu_ratio:.3f}")
    return 0


async def profile_only(n: int) -> None:
    for _ in range(n):
        await via_run()


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def one_run(tree: str, n: int, warmup: int) -> tuple[str, float, float]:
    """This benchmark in a fresh interpreter with ``tree``'s ``fleet_trio`` first on the path:
    ``(load average, wall ratio, CPU ratio)``."""
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    env = dict(os.environ, PYTHONPATH=tree)
    argv = [sys.executable, os.path.abspath(__file__), "-n", str(n), "--warmup", str(warmup)]
    print(f"   load average {load}", flush=True)
    out = subprocess.run(argv, env=env, cwd=tree, capture_output=True, text=True, check=True)
    text = out.stdout
    print(text, end="", flush=True)
    wall = re.search(r"ratio run/baseline ([0-9.]+)", text)
    cpu = re.search(r"CPU ms per job .* ratio ([0-9.]+)", text)
    assert wall is not None and cpu is not None, text
    return load, float(wall.group(1)), float(cpu.group(1))


def compare(before: str, n: int, warmup: int, rounds: int) -> int:
    trees = {"before": os.path.abspath(before), "after": REPO}
    seen: dict[str, list[tuple[float, float]]] = {"before": [], "after": []}
    for i in range(rounds):
        order = ["before", "after"] if i % 2 == 0 else ["after", "before"]
        for name in order:
            print(f"-- {name} (round {i + 1})", flush=True)
            _load, wall, cpu = one_run(trees[name], n, warmup)
            seen[name].append((wall, cpu))
    for name, runs in seen.items():
        walls = " ".join(f"{w:.3f}" for w, _ in runs)
        cpus = " ".join(f"{c:.3f}" for _, c in runs)
        print(
            f"{name:6s} wall ratios {walls} (median {statistics.median(w for w, _ in runs):.3f}); "
            f"CPU ratios {cpus} (median {statistics.median(c for _, c in runs):.3f})"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=200, help="jobs per side (default 200)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed jobs per side first")
    parser.add_argument("--profile", action="store_true", help="cProfile the run() side only")
    parser.add_argument(
        "--before",
        metavar="TREE",
        help="also run the benchmark with TREE's fleet_trio (another checkout), alternating",
    )
    parser.add_argument("--rounds", type=int, default=3, help="runs per tree with --before")
    parser.add_argument(
        "--cgroup", action="store_true", help="run() under the cgroup backend against run()"
    )
    parser.add_argument("--cgroup-base", default="", help="with --cgroup: where to measure")
    parser.add_argument(
        "--no-shim", action="store_true", help="with --cgroup: diagnostic, spawn without the shim"
    )
    args = parser.parse_args(argv)

    if args.cgroup:
        return cgroup_bench(args.n, args.warmup, args.cgroup_base, args.no_shim)

    if args.before:
        return compare(args.before, args.n, args.warmup, args.rounds)

    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        trio.run(profile_only, args.n)
        prof.disable()
        stats = pstats.Stats(prof, stream=sys.stdout).sort_stats("cumulative")
        stats.print_stats(40)
        return 0

    ours_s, base_s = trio.run(bench, args.n, args.warmup)
    ours = [wall for wall, _cpu in ours_s]
    base = [wall for wall, _cpu in base_s]
    m_ours = statistics.median(ours)
    m_base = statistics.median(base)
    c_ours = statistics.median(cpu for _wall, cpu in ours_s)
    c_base = statistics.median(cpu for _wall, cpu in base_s)
    ratio = m_ours / m_base
    print(f"jobs per side      {args.n} (`true`, interleaved, {args.warmup} warm-up each)")
    print(f"run() median       {m_ours:.3f} ms   (p90 {statistics.quantiles(ours, n=10)[-1]:.3f})")
    print(f"run_process median {m_base:.3f} ms   (p90 {statistics.quantiles(base, n=10)[-1]:.3f})")
    verdict = "ok" if ratio <= TARGET_RATIO else "ABOVE TARGET"
    print(f"ratio run/baseline {ratio:.3f}   (target <= {TARGET_RATIO}: {verdict})")
    print(
        f"CPU ms per job     run() {c_ours:.3f}   run_process {c_base:.3f}   "
        f"ratio {c_ours / c_base:.3f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
