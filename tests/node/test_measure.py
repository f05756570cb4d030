"""``fleet-trio measure`` as a real subprocess with the fake GPU (node.md §8)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
import yaml

from fleet_trio.gpu.fake import init_device
from tests.helpers import wait_until
from tests.node.conftest import PY

# A probe that holds 2 GiB of fake VRAM for 1.5 s (its own pid, in the job's process group),
# then prints a JSON result: 15 of the sampler's 100 ms rounds, room for a loaded machine.
HOLD_2G = (
    "import subprocess, sys; "
    "subprocess.run([sys.executable, '-m', 'fleet_trio.gpu.fake', 'hold', '2G', '--for', '1.5'],"
    " check=True); "
    'print(\'{"held": "2G"}\')'
)


def write_config(tmp_path: Path, tasks: dict[str, Any]) -> Path:
    cfg = tmp_path / "node.yaml"
    raw = {
        "node": {
            "footprints": {"path": "fp.json", "margin": 1.2},  # relative: next to the YAML
            "timings": {"render_sample_interval": "100ms", "kill_grace": "1s"},
        },
        "tasks": tasks,
    }
    cfg.write_text(yaml.safe_dump(raw, sort_keys=False))
    return cfg


HOLDER = {
    "family": "sdxl",
    "footprint": {"family": "sdxl", "quant": "bf16"},
    "command": [PY, "-c", HOLD_2G],
    "gpu": True,
    "payload": {"prompt": {"type": "string", "required": True}},
    "probe": {"prompt": "fleet-measure probe"},
}


async def run_measure(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    gpu_dir = tmp_path / "gpu"
    if not gpu_dir.exists():
        init_device(str(gpu_dir))
    full_env = {**os.environ, "FLEET_TRIO_FAKE_GPU_DIR": str(gpu_dir), **(env or {})}
    argv = [sys.executable, "-m", "fleet_trio", "measure", *args]
    with trio.fail_after(30):
        return await trio.run_process(
            argv, env=full_env, capture_stdout=True, capture_stderr=True, check=False
        )


def fake_args(tmp_path: Path) -> list[str]:
    return ["--gpu", "fake", "--fake-gpu-dir", str(tmp_path / "gpu")]


@pytest.mark.slow
async def test_measure_records_the_probe_peak_with_margin(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, {"image-gen": HOLDER})
    proc = await run_measure(tmp_path, "-c", str(cfg), *fake_args(tmp_path))
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    assert json.loads(proc.stdout) == [
        {"model_family": "sdxl", "quant": "bf16", "task_type": "image-gen", "vram_peak_gb": 2.4}
    ]
    lines = err.splitlines()
    assert "[fleet-trio measure] image-gen: started (footprint key sdxl/bf16/image-gen)" in lines
    assert any(
        line.startswith("[fleet-trio measure] image-gen: done (")
        and "peak 2.00 GiB, footprint now 2.4 GiB" in line
        for line in lines
    ), err
    stored = json.loads((tmp_path / "fp.json").read_text())
    assert [(r["observed_peak_gb"], r["vram_peak_gb"]) for r in stored] == [(2, 2.4)]
    assert "stopping" not in err, err  # a run that ends by itself kills nothing


@pytest.mark.slow
async def test_measure_skips_fails_and_keeps_going(tmp_path: Path) -> None:
    tasks = {
        "broken": {**HOLDER, "command": [PY, "-c", "import sys; sys.exit(3)"]},
        "no-probe": {"family": "x", "command": [PY, "-c", "print('{}')"]},
        "unsampled": {**HOLDER, "footprint": False},
        "image-gen": HOLDER,
    }
    cfg = write_config(tmp_path, tasks)
    proc = await run_measure(
        tmp_path,
        "-c",
        str(cfg),
        *fake_args(tmp_path),
        "--footprints",
        str(tmp_path / "elsewhere.json"),
    )
    err = proc.stderr.decode()
    assert proc.returncode == 1, err
    assert "[fleet-trio measure] broken: failed (broken failed: exit status 3)" in err
    assert "[fleet-trio measure] no-probe: skipped (no probe configured)" in err
    assert "] unsampled: skipped (footprint: false or absent, never sampled)" in err
    order = [line.split(":")[0].split("] ")[1] for line in err.splitlines() if "] " in line]
    assert order.index("broken") < order.index("no-probe") < order.index("image-gen")
    # the failure did not stop the task declared after it; --footprints chose the store
    assert [e["vram_peak_gb"] for e in json.loads(proc.stdout)] == [2.4]
    assert (tmp_path / "elsewhere.json").exists() and not (tmp_path / "fp.json").exists()


@pytest.mark.slow
async def test_measure_task_selection(tmp_path: Path) -> None:
    tasks = {"broken": {**HOLDER, "command": [PY, "-c", "import sys; sys.exit(3)"]}, "ok": HOLDER}
    cfg = write_config(tmp_path, tasks)
    proc = await run_measure(tmp_path, "-c", str(cfg), *fake_args(tmp_path), "--task", "ok")
    assert proc.returncode == 0, proc.stderr.decode()
    assert "broken" not in proc.stderr.decode()
    assert [e["task_type"] for e in json.loads(proc.stdout)] == ["ok"]
    proc = await run_measure(tmp_path, "-c", str(cfg), *fake_args(tmp_path), "--task", "nope")
    assert proc.returncode == 2
    assert "--task nope: not a configured task (configured: broken, ok)" in proc.stderr.decode()


async def test_measure_nothing_to_probe_prints_the_store(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, {"stt": {"command": [PY, "-c", "print('{}')"]}})
    proc = await run_measure(tmp_path, "-c", str(cfg), *fake_args(tmp_path))
    assert proc.returncode == 0
    assert json.loads(proc.stdout) == []
    assert "stt: skipped (no probe configured)" in proc.stderr.decode()


@pytest.mark.slow
async def test_measure_refuses_without_a_gpu(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, {"image-gen": HOLDER})
    # nvidia-smi cannot be found on an empty PATH: the probe fails, nothing runs.
    empty = tmp_path / "empty-path"
    empty.mkdir()
    proc = await run_measure(tmp_path, "-c", str(cfg), "--gpu", "smi", env={"PATH": str(empty)})
    err = proc.stderr.decode()
    assert proc.returncode == 1 and "error: GPU probe failed" in err, err
    assert proc.stdout == b"" and "started" not in err
    assert "stopping" not in err, err  # nothing was stopped: nothing ran
    # --gpu fake with a fake GPU directory that cannot be created is refused too (without
    # one, the directory is created under the state directory: tests/gpu/test_fake_cli.py)
    env = {k: v for k, v in os.environ.items() if k != "FLEET_TRIO_FAKE_GPU_DIR"}
    (tmp_path / "a-file").write_text("")
    argv = [sys.executable, "-m", "fleet_trio", "measure", "-c", str(cfg), "--gpu", "fake"]
    argv += ["--fake-gpu-dir", str(tmp_path / "a-file" / "gpu")]
    with trio.fail_after(30):
        proc = await trio.run_process(argv, env=env, capture_stderr=True, check=False)
    assert proc.returncode == 1 and "error: cannot create the fake GPU" in proc.stderr.decode()
    assert not (tmp_path / "fp.json").exists()


# Multi-GPU: the probe holds 2 GiB on the device it was pinned to and 3 GiB on the other one;
# only its own device counts.
HOLD_ON_BOTH = (
    "import os, subprocess, sys; "
    "fake = [sys.executable, '-m', 'fleet_trio.gpu.fake', 'hold']; "
    "other = os.path.join(os.environ['FLEET_TRIO_FAKE_GPU_DIR'], 'gpu1'); "
    "a = subprocess.Popen(fake + ['2G', '--for', '0.8']); "
    "b = subprocess.Popen(fake + ['3G', '--for', '0.8', '--dir', other]); "
    "assert a.wait() == 0 and b.wait() == 0; "
    "print('{\"pinned\": \"' + os.environ['CUDA_VISIBLE_DEVICES'] + '\"}')"
)


@pytest.mark.slow
async def test_measure_with_fake_gpus_measures_the_pinned_device(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, {"image-gen": {**HOLDER, "command": [PY, "-c", HOLD_ON_BOTH]}})
    root = tmp_path / "multi"
    proc = await run_measure(
        tmp_path,
        "-c",
        str(cfg),
        "--gpu",
        "fake",
        "--fake-gpu-dir",
        str(root),
        "--fake-gpus",
        "2",
        env={"FLEET_TRIO_FAKE_GPU_DIR": str(root)},
    )
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    assert (root / "gpu0" / "device.json").exists() and (root / "gpu1" / "device.json").exists()
    assert json.loads(proc.stdout) == [
        {"model_family": "sdxl", "quant": "bf16", "task_type": "image-gen", "vram_peak_gb": 2.4}
    ]


async def test_gpu_check_refuses_a_driver_that_never_answers(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Issue 13 item 6: a hung GPU query is refused within the check's timeout."""
    from fleet_trio.gpu.sampler import GlobalSampler
    from fleet_trio.node.measure import check_gpu
    from fleet_trio.node.server import GpuServices, NodeStartError

    class Hung:
        name = "hung"

        async def snapshot(self) -> None:
            await trio.sleep_forever()

    start = trio.current_time()
    gpu = GpuServices(sampler=GlobalSampler(Hung()), footprints=object(), source=Hung())  # type: ignore[arg-type]
    with trio.fail_after(60), pytest.raises(NodeStartError, match="no answer within 10s"):
        await check_gpu(gpu)
    assert trio.current_time() - start == pytest.approx(10.0)


async def test_measure_serves_signals_from_its_task_tree(tmp_path: Path) -> None:
    """Issue 13 item 1: measure runs in a task tree that serves SIGTERM: the running probe's
    process group is killed (its TERM-ignoring child too, after the kill grace), the probe
    is reported interrupted, the next one is not run, and nothing is recorded."""
    marker = tmp_path / "probe-started"
    stubborn = (
        "import os, signal, subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', "
        "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)']); "
        f"open({str(marker)!r}, 'w').close(); time.sleep(60)"
    )
    slow = {**HOLDER, "command": [PY, "-c", stubborn]}
    cfg = write_config(tmp_path, {"a-slow": slow, "b-next": HOLDER})
    init_device(str(tmp_path / "gpu"))
    env = {**os.environ, "FLEET_TRIO_FAKE_GPU_DIR": str(tmp_path / "gpu")}
    argv = [sys.executable, "-m", "fleet_trio", "measure", "-c", str(cfg), *fake_args(tmp_path)]
    with trio.fail_after(30):
        proc = await trio.lowlevel.open_process(
            argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        try:
            await wait_until(lambda: bool(marker.exists()))
            proc.send_signal(signal.SIGTERM)
            start = trio.current_time()
            assert proc.stderr is not None
            err = b""
            while chunk := await proc.stderr.receive_some():
                err += chunk
            await proc.wait()
            took = trio.current_time() - start
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    text = err.decode()
    assert "stopping (the running probe, a-slow, is killed)" in text, text
    assert "a-slow: interrupted" in text and "b-next: interrupted (not run)" in text, text
    assert took < 1.0 + 5.0, took  # kill grace 1 s + the tree's slack
    assert not (tmp_path / "fp.json").exists() or "sdxl" not in (tmp_path / "fp.json").read_text()


async def test_a_stop_as_a_probe_ends_starts_no_other_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shutdown request that lands as a probe's process has exited (its work dir is being
    removed) lets that probe finish, and the next one is ``not run``: it must not start."""
    import contextlib

    import fleet_trio.node.measure as measure_module
    from fleet_trio.node.config import config_from_mapping
    from fleet_trio.node.tasks import TaskRunner

    def task(family: str) -> dict[str, Any]:
        probe = [PY, "-c", "print('{}')"]
        return {"family": family, "footprint": {"family": family}, "command": probe,
                "gpu": True, "probe": {}}  # fmt: skip

    init_device(str(tmp_path / "gpu"))
    cfg = config_from_mapping(
        {
            "node": {"footprints": {"path": str(tmp_path / "fp.json")}},
            "tasks": {"a": task("fa"), "b": task("fb")},
        },
        path=str(tmp_path / "n.yaml"),
        base_dir=str(tmp_path),
    )
    trees: list[Any] = []
    open_tree = measure_module.open_task_tree

    @contextlib.asynccontextmanager
    async def capture(**kw: Any) -> Any:
        async with open_tree(**kw) as tree:
            trees.append(tree)
            yield tree

    run = TaskRunner._run

    async def run_then_stop(self: TaskRunner, job: Any, tee: Any = None) -> Any:
        outcome = await run(self, job, tee)
        if job.task.name == "a":  # the process has exited; a SIGTERM's handler does this
            trees[0].request_shutdown("SIGTERM")
        return outcome

    monkeypatch.setattr(measure_module, "open_task_tree", capture)
    monkeypatch.setattr(TaskRunner, "_run", run_then_stop)
    lines: list[str] = []
    options = measure_module.MeasureOptions(gpu="fake", fake_gpu_dir=str(tmp_path / "gpu"))
    with trio.fail_after(30):
        report = await measure_module.measure(
            cfg, options, say=lines.append, work_root=str(tmp_path)
        )
    assert [(r.task, r.status, r.detail) for r in report.results][1:] == [
        ("b", "interrupted", "not run")
    ], lines
    assert not any(line.startswith("b: started") for line in lines), lines
