"""``examples/verify.d/10-gpu-memory-free`` against a fake ``nvidia-smi`` (worker-process.md §5)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import trio

from fleet_trio.worker.verify import run_verify

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "verify.d" / "10-gpu-memory-free"
TOOLS = ("expr", "head", "tr")


def fake_nvidia_smi(bindir: Path, *, used: str, status: int = 0) -> Path:
    """A fake that answers the memory.used query with ``used`` and logs its arguments."""
    calls = bindir / "calls"
    path = bindir / "nvidia-smi"
    path.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> "{calls}"\n'
        'case "$*" in\n'
        f"*--query-gpu=memory.used*) printf '%s\\n' '{used}'; exit {status} ;;\n"
        "*--query-compute-apps=*) echo '4242, python3, 71000 MiB' ;;\n"
        "esac\n"
    )
    path.chmod(0o755)
    return calls


@pytest.fixture
def bindir(tmp_path: Path) -> Path:
    """A PATH directory with only the tools the example needs (and no real nvidia-smi)."""
    d = tmp_path / "bin"
    d.mkdir()
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found is not None, tool
        (d / tool).symlink_to(found)
    return d


async def run_example(bindir: Path, **env: str) -> subprocess.CompletedProcess[bytes]:
    full = {"PATH": str(bindir), "RC_EVENT": "verify", **env}
    with trio.fail_after(10):
        return await trio.run_process(
            [str(EXAMPLE)], env=full, check=False, capture_stdout=True, capture_stderr=True
        )


def test_example_is_executable() -> None:
    assert os.access(EXAMPLE, os.X_OK)


async def test_held_memory_fails_naming_the_device(bindir: Path) -> None:
    calls = fake_nvidia_smi(bindir, used="72000")
    proc = await run_example(bindir, RC_DEVICE="box:gpu1")
    assert proc.returncode == 1
    err = proc.stderr.decode()
    last = err.strip().splitlines()[-1]
    assert "box:gpu1" in last
    assert "72000 MiB still used" in last
    assert "4242" in err  # the holding process is named too
    assert "-i 1" in calls.read_text()


async def test_free_memory_passes(bindir: Path) -> None:
    calls = fake_nvidia_smi(bindir, used="3")
    proc = await run_example(bindir, RC_DEVICE="box:gpu01")
    assert proc.returncode == 0, proc.stderr
    assert "-i 1" in calls.read_text()


async def test_threshold_is_configurable(bindir: Path) -> None:
    fake_nvidia_smi(bindir, used="600")
    assert (await run_example(bindir, RC_DEVICE="box:gpu0")).returncode == 1
    proc = await run_example(bindir, RC_DEVICE="box:gpu0", RC_VERIFY_MAX_USED_MIB="1024")
    assert proc.returncode == 0, proc.stderr


async def test_no_nvidia_smi_passes_with_a_note(bindir: Path) -> None:
    proc = await run_example(bindir, RC_DEVICE="box:gpu0")
    assert proc.returncode == 0
    assert b"nvidia-smi not found" in proc.stderr


async def test_broken_nvidia_smi_fails(bindir: Path) -> None:
    fake_nvidia_smi(
        bindir, used="Unable to determine the device handle for GPU1: Unknown Error", status=9
    )
    proc = await run_example(bindir, RC_DEVICE="box:gpu1")
    assert proc.returncode == 1
    assert b"cannot prove" in proc.stderr


async def test_device_without_an_index_fails_unless_overridden(bindir: Path) -> None:
    calls = fake_nvidia_smi(bindir, used="0")
    assert (await run_example(bindir, RC_DEVICE="box:mydevice")).returncode == 2
    proc = await run_example(bindir, RC_DEVICE="box:mydevice", RC_VERIFY_GPU_INDEX="3")
    assert proc.returncode == 0, proc.stderr
    assert "-i 3" in calls.read_text()


async def test_through_run_verify_the_reason_ends_with_the_complaint(
    tmp_path: Path, bindir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_nvidia_smi(bindir, used="72000")
    monkeypatch.setenv("PATH", str(bindir))
    d = tmp_path / "verify.d"
    d.mkdir()
    (d / EXAMPLE.name).symlink_to(EXAMPLE)
    with trio.fail_after(10):
        res = await run_verify(
            str(d), device_id="box:gpu1", job_id="j", submitter="s", timeout=5, pass_budget=10
        )
    assert res.ok is False
    assert res.reason.startswith("verify failed: 10-gpu-memory-free: exited 1: ")
    assert res.reason.endswith("box:gpu1 (GPU 1): 72000 MiB still used (limit 512 MiB)")
