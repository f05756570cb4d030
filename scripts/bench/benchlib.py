"""What the benchmarks share: starting a child that serves (this same script re-run with
``--serve …``) and waiting for the URL it writes, the node such a child serves, stopping it,
the nearest-rank quantile, a process's CPU seconds from ``/proc``, the one line a broken run
prints (and :func:`served_run`, which ends such a run), and the ``-n`` / ``--warmup`` options
of the job benchmarks. Imported by the scripts
beside it (their folder is on ``sys.path`` when they run)."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import trio

START_TIMEOUT = 30.0


async def serve_node_child(config_path: Path, gpu_dir: Path, url_file: Path) -> None:
    """In the ``--serve`` child: ``serve_node`` with ``config_path`` on the fake GPU in
    ``gpu_dir``; writes the node's URL to ``url_file`` once it serves."""
    from fleet_trio.node.config import load_config
    from fleet_trio.node.server import NodeOptions, RunningNode, serve_node

    config = load_config(config_path)
    options = NodeOptions(gpu="fake", fake_gpu_dir=str(gpu_dir))
    async with trio.open_nursery() as nursery:
        node: RunningNode = await nursery.start(
            lambda task_status: serve_node(
                config, options, announce=lambda line: None, task_status=task_status
            )
        )
        url_file.write_text(node.url)


class BrokenRun(Exception):
    """The benchmark could not measure what it should (not: a target was missed)."""


def start_served(
    script: str, serve_args: list[str], url_file: Path, label: str
) -> tuple[subprocess.Popen[bytes], str]:
    """Run ``script --serve *serve_args`` and return it with the URL it writes to
    ``url_file`` once it listens; :class:`BrokenRun` if it exits or takes too long."""
    proc = subprocess.Popen(
        [sys.executable, os.path.abspath(script), "--serve", *serve_args],
        stdin=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if url_file.exists() and url_file.read_text():
            return proc, url_file.read_text()
        if proc.poll() is not None:
            raise BrokenRun(f"{label} exited with status {proc.returncode}")
        time.sleep(0.05)
    proc.kill()
    raise BrokenRun(f"{label} did not start within {START_TIMEOUT:g}s")


def stop_served(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (the server drains), then SIGKILL after 15 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1), nearest-rank."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q * len(ordered) + 0.5)))
    return ordered[rank - 1]


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(own user+sys, reaped children's user+sys) of process ``pid`` in seconds, from
    ``/proc/PID/stat``; ``(0.0, 0.0)`` where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        # fields[0] is field 3 (state): utime is field 14, index 11
        utime, stime, cutime, cstime = (int(v) for v in fields[11:15])
    except (OSError, IndexError, ValueError):
        return 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    return (utime + stime) / tick, (cutime + cstime) / tick


def describe(exc: BaseException) -> str:
    """One line for a broken run: the first leaf of an exception group (nurseries wrap what
    their tasks raise), with its type."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


@contextlib.contextmanager
def served_run() -> Iterator[list[subprocess.Popen[bytes]]]:
    """The measuring part of a benchmark's run: every served child the body appends to the
    list it yields is stopped on the way out, then the run's total time is printed; an
    exception is a broken run (its one line on stderr, then exit status 1)."""
    started = time.monotonic()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        yield procs
    except Exception as exc:  # a broken run, whatever broke it
        print(f"broken run: {describe(exc)}", file=sys.stderr)
        raise SystemExit(1) from None
    finally:
        for p in procs:
            stop_served(p)
    print(f"total {time.monotonic() - started:.1f} s")


def _at_least_two(text: str) -> int:
    n = int(text)
    if n < 2:
        raise argparse.ArgumentTypeError("must be at least 2")
    return n


def job_bench_parser(description: str, *, n: int, n_help: str) -> argparse.ArgumentParser:
    """An argument parser with what every job benchmark takes: ``-n`` timed jobs (at least
    2; ``n_help`` says what they are) and ``--warmup`` untimed jobs first."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("-n", type=_at_least_two, default=n, help=f"{n_help} (default {n})")
    parser.add_argument("--warmup", type=int, default=5, help="untimed jobs first (default 5)")
    return parser
