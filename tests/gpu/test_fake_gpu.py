"""The fake GPU with real holder processes, and the per-job sampler against it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from fleet_trio.gpu import GIB, GpuError, job_pids, measure_job_peak, open_source
from fleet_trio.gpu.fake import FakeGpu, main, parse_size, read_holdings
from fleet_trio.proc.procfs import pid_alive
from tests.helpers import CountingSource, wait_until

PY = sys.executable
HELPER = [PY, "-m", "fleet_trio.gpu.fake"]


@pytest.fixture
def gpu_dir(tmp_path: Path) -> str:
    d = tmp_path / "gpu"
    d.mkdir()
    (d / "device.json").write_text(json.dumps({"name": "Fake H200", "total_gib": 80}))
    return str(d)


class Procs:
    """Kills (by pid, SIGKILL) every process a test started, even escapees."""

    def __init__(self) -> None:
        self.pids: list[int] = []
        self.groups: list[int] = []

    def add(self, pid: int) -> int:
        self.pids.append(pid)
        return pid

    def add_group(self, pgid: int) -> int:
        self.groups.append(pgid)
        return pgid

    def kill_all(self) -> None:
        for pgid in self.groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
async def procs() -> AsyncIterator[Procs]:
    p = Procs()
    try:
        yield p
    finally:
        p.kill_all()


def test_parse_size() -> None:
    assert parse_size("2.5G") == int(2.5 * GIB)
    assert parse_size("512M") == 512 << 20
    assert parse_size("512MiB") == 512 << 20
    assert parse_size("1gb") == GIB
    assert parse_size("1024") == 1024
    assert parse_size(" 64K\n") == 65536
    for bad in ("", "G", "-1G", "2X", "1.2.3"):
        with pytest.raises(ValueError):
            parse_size(bad)


async def test_defaults_without_device_json(tmp_path: Path) -> None:
    gpu = FakeGpu(str(tmp_path))
    snap = await gpu.snapshot()
    assert (snap.total_gb, snap.used_gb, snap.free_gb) == (80.0, 0.0, 80.0)
    assert await gpu.device_name() == "Fake GPU"
    assert await gpu.process_used_bytes() == {}


async def test_missing_directory_fails(tmp_path: Path) -> None:
    gpu = FakeGpu(str(tmp_path / "nope"))
    with pytest.raises(GpuError):
        await gpu.snapshot()
    assert await gpu.process_used_bytes() is None
    assert await gpu.device_name() == ""


async def test_holder_is_attributed_then_gone_after_kill(gpu_dir: str, procs: Procs) -> None:
    code = f"from fleet_trio.gpu.fake import main; main(['hold', '2G', '--dir', {gpu_dir!r}])"
    gpu = open_source("fake", fake_dir=gpu_dir)
    assert gpu.name == "fake"
    assert await gpu.device_name() == "Fake H200"
    with trio.fail_after(20):
        proc = await trio.lowlevel.open_process([PY, "-c", code])
        procs.add(proc.pid)
        await wait_until(lambda: os.path.exists(os.path.join(gpu_dir, str(proc.pid))))
        assert await gpu.process_used_bytes() == {proc.pid: 2 * GIB}
        snap = await gpu.snapshot()
        assert (snap.used_gb, snap.free_gb) == (2.0, 78.0)
        proc.kill()  # SIGKILL: the holder cannot clean up; the reader ignores its file
        await proc.wait()
        assert await gpu.process_used_bytes() == {}
        assert (await gpu.snapshot()).used_gb == 0.0
        assert not os.path.exists(os.path.join(gpu_dir, str(proc.pid)))


async def test_holder_removes_its_file_on_sigterm(gpu_dir: str, procs: Procs) -> None:
    with trio.fail_after(20):
        proc = await trio.lowlevel.open_process([*HELPER, "hold", "512M", "--dir", gpu_dir])
        procs.add(proc.pid)
        path = os.path.join(gpu_dir, str(proc.pid))
        await wait_until(lambda: os.path.exists(path))
        proc.terminate()
        await proc.wait()
        assert not os.path.exists(path)


async def test_hold_for_a_duration_and_env_default_dir(gpu_dir: str) -> None:
    env = dict(os.environ, FLEET_TRIO_FAKE_GPU_DIR=gpu_dir)
    with trio.fail_after(20):
        res = await trio.run_process([*HELPER, "hold", "1G", "--for", "0.1"], env=env)
    assert res.returncode == 0
    assert read_holdings(gpu_dir) == {}


async def test_escaped_holder_keeps_used_up(gpu_dir: str, procs: Procs) -> None:
    """A holder that outlives its job (setsid, parent gone) is a leak the GPU still shows."""
    script = (
        f'setsid {PY} -m fleet_trio.gpu.fake hold 1.5G --dir "{gpu_dir}" >/dev/null 2>&1 & echo $!'
    )
    gpu = FakeGpu(gpu_dir)
    with trio.fail_after(20):
        res = await trio.run_process(["sh", "-c", script], capture_stdout=True)
        escaped = procs.add(int(res.stdout.decode().strip()))
        await wait_until(lambda: os.path.exists(os.path.join(gpu_dir, str(escaped))))
        assert (await gpu.snapshot()).used_gb == 1.5
        assert await gpu.process_used_bytes() == {escaped: int(1.5 * GIB)}
    os.kill(escaped, signal.SIGKILL)
    await wait_until(lambda: not pid_alive(escaped))
    assert (await gpu.snapshot()).used_gb == 0.0


async def test_alloc_and_free_on_behalf_of_a_shell(gpu_dir: str, procs: Procs) -> None:
    script = (
        f'{PY} -m fleet_trio.gpu.fake alloc 3G --pid $$ --dir "{gpu_dir}"; echo ready; '
        "read line; "
        f'{PY} -m fleet_trio.gpu.fake free --pid $$ --dir "{gpu_dir}"; echo freed; read line'
    )
    gpu = FakeGpu(gpu_dir)
    with trio.fail_after(30):
        proc = await trio.lowlevel.open_process(
            ["sh", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        procs.add(proc.pid)
        assert proc.stdin is not None and proc.stdout is not None
        assert b"ready" in await proc.stdout.receive_some(100)
        assert await gpu.process_used_bytes() == {proc.pid: 3 * GIB}
        await proc.stdin.send_all(b"go\n")
        assert b"freed" in await proc.stdout.receive_some(100)
        assert await gpu.process_used_bytes() == {}
        await proc.stdin.send_all(b"go\n")
        await proc.wait()


async def test_fail_and_recover(gpu_dir: str) -> None:
    gpu = FakeGpu(gpu_dir)
    assert main(["fail", "driver reset", "--dir", gpu_dir]) == 0
    with pytest.raises(GpuError, match="driver reset"):
        await gpu.snapshot()
    assert main(["recover", "--dir", gpu_dir]) == 0
    assert (await gpu.snapshot()).total_gb == 80.0


async def test_base_used_and_init(tmp_path: Path) -> None:
    d = str(tmp_path / "new")
    assert main(["init", "--dir", d, "--name", "Fake A100", "--total-gib", "40"]) == 0
    gpu = FakeGpu(d)
    assert await gpu.device_name() == "Fake A100"
    Path(d, "device.json").write_text('{"total_gib": 40, "base_used_gib": 0.5}')
    snap = await gpu.snapshot()
    assert (snap.total_gb, snap.used_gb, snap.free_gb) == (40.0, 0.5, 39.5)


# -- the per-job sampler against real process groups -----------------------------------------

JOB_SCRIPT = """
H="{py} -m fleet_trio.gpu.fake"
$H alloc 2G --pid $$ --dir "{d}"
$H hold 1G --dir "{d}" &
holder=$!
while [ ! -e "{d}/$holder" ]; do sleep 0.02; done
: > "{d}/held"
while [ ! -e "{d}/go" ]; do sleep 0.02; done
kill $holder; wait $holder
$H free --pid $$ --dir "{d}"
"""


async def _run_job(
    gpu_dir: str,
    script: str,
    procs: Procs,
    *,
    marker: tuple[str, str] | None,
    mode: str,
    env: dict[str, str] | None = None,
) -> tuple[float | None, int]:
    """Run ``script`` under the per-job sampler. The script writes ``held`` once its VRAM is
    held and then waits for ``go``, which this writes once a sample has been taken after."""
    gpu = CountingSource(FakeGpu(gpu_dir))
    held, go = Path(gpu_dir, "held"), Path(gpu_dir, "go")
    held.unlink(missing_ok=True)
    go.unlink(missing_ok=True)
    stop = trio.Event()
    peak: list[float | None] = []
    with trio.fail_after(30):
        baseline = await gpu.snapshot()
        proc = await trio.lowlevel.open_process(["sh", "-c", script], process_group=0, env=env)
        procs.add_group(proc.pid)

        async def sample() -> None:
            peak.append(
                await measure_job_peak(
                    gpu,  # type: ignore[arg-type]
                    pgid=proc.pid,
                    stop=stop,
                    interval=0.05,
                    baseline=baseline,
                    marker=marker,
                    mode=mode,
                )
            )

        async with trio.open_nursery() as nursery:
            nursery.start_soon(sample)
            await wait_until(held.exists, what="the job holds its VRAM")
            seen = gpu.reads  # the read in flight may predate the holding; the next cannot
            await wait_until(lambda: gpu.reads >= seen + 2, what="a sample of the holding")
            go.touch()
            await proc.wait()
            stop.set()
    return peak[0], proc.returncode


async def _bystander(gpu_dir: str, procs: Procs) -> int:
    proc = await trio.lowlevel.open_process([*HELPER, "hold", "5G", "--dir", gpu_dir])
    procs.add(proc.pid)
    await wait_until(lambda: os.path.exists(os.path.join(gpu_dir, str(proc.pid))))
    return proc.pid


@pytest.mark.parametrize("mode", ["auto", "nvml"])
async def test_job_peak_attributed_by_process_group(gpu_dir: str, procs: Procs, mode: str) -> None:
    await _bystander(gpu_dir, procs)  # someone else's 5 GiB is never the job's
    peak, rc = await _run_job(
        gpu_dir, JOB_SCRIPT.format(py=PY, d=gpu_dir), procs, marker=None, mode=mode
    )
    assert rc == 0
    assert peak == 3.0


async def test_job_peak_global_delta(gpu_dir: str, procs: Procs) -> None:
    await _bystander(gpu_dir, procs)  # in the baseline, so not in the delta
    peak, rc = await _run_job(
        gpu_dir, JOB_SCRIPT.format(py=PY, d=gpu_dir), procs, marker=None, mode="global"
    )
    assert rc == 0
    assert peak == 3.0


async def test_auto_falls_back_to_global_without_per_process(gpu_dir: str, procs: Procs) -> None:
    Path(gpu_dir, "device.json").write_text('{"total_gib": 80, "per_process": false}')
    peak, _ = await _run_job(
        gpu_dir, JOB_SCRIPT.format(py=PY, d=gpu_dir), procs, marker=None, mode="auto"
    )
    assert peak == 3.0
    peak, _ = await _run_job(
        gpu_dir, JOB_SCRIPT.format(py=PY, d=gpu_dir), procs, marker=None, mode="nvml"
    )
    assert peak is None  # per-process forced, never available: no successful sample


ESCAPE_SCRIPT = """
H="{py} -m fleet_trio.gpu.fake"
(setsid $H hold 1.5G --dir "{d}" >/dev/null 2>&1 & echo $! > "{d}/escapee.txt")
while [ ! -s "{d}/escapee.txt" ]; do sleep 0.02; done
e=$(cat "{d}/escapee.txt")
while [ ! -e "{d}/$e" ]; do sleep 0.02; done
: > "{d}/held"
while [ ! -e "{d}/go" ]; do sleep 0.02; done
"""


@pytest.mark.parametrize(("marker", "want"), [(("FLEET_JOB", "job-7"), 1.5), (None, 0.0)])
async def test_job_peak_attributed_by_marker(
    gpu_dir: str, procs: Procs, marker: tuple[str, str] | None, want: float
) -> None:
    """An escapee (own session, reparented) is found by its env marker, and only by it."""
    env = dict(os.environ, FLEET_JOB="job-7")
    script = ESCAPE_SCRIPT.format(py=PY, d=gpu_dir)
    try:
        peak, rc = await _run_job(gpu_dir, script, procs, env=env, marker=marker, mode="auto")
    finally:
        text = Path(gpu_dir, "escapee.txt").read_text().strip()
        if text:
            procs.add(int(text))
    assert rc == 0
    assert peak == want


async def test_job_pids_membership(procs: Procs) -> None:
    """Group members, their descendants in other groups, and marked processes."""
    with trio.fail_after(20):
        script = "sleep 30 & setsid sleep 30 >/dev/null & echo $! ; wait"
        leader = await trio.lowlevel.open_process(
            ["sh", "-c", script], process_group=0, stdout=subprocess.PIPE
        )
        procs.add_group(leader.pid)
        assert leader.stdout is not None
        child_in_other_session = procs.add(int((await leader.stdout.receive_some(100)).strip()))
        marked = await trio.lowlevel.open_process(
            ["sleep", "30"], env=dict(os.environ, MARK="m1"), start_new_session=True
        )
        procs.add(marked.pid)
        stranger = await trio.lowlevel.open_process(["sleep", "30"], start_new_session=True)
        procs.add(stranger.pid)
        cands = [leader.pid, child_in_other_session, marked.pid, stranger.pid, os.getpid()]
        got = await trio.to_thread.run_sync(job_pids, cands, leader.pid, ("MARK", "m1"))
        assert got == {leader.pid, child_in_other_session, marked.pid}
        got = await trio.to_thread.run_sync(job_pids, cands, leader.pid, None)
        assert got == {leader.pid, child_in_other_session}
        for p in (leader, marked, stranger):
            p.kill()
            await p.wait()


async def test_stop_already_set_still_samples_once(gpu_dir: str) -> None:
    stop = trio.Event()
    stop.set()
    gpu = FakeGpu(gpu_dir)
    assert await measure_job_peak(gpu, pgid=1, marker=None, stop=stop, mode="global") == 0.0
    assert await measure_job_peak(gpu, pgid=1, marker=None, stop=stop) == 0.0
    with pytest.raises(ValueError):
        await measure_job_peak(gpu, pgid=1, marker=None, stop=stop, mode="pdh")
