"""worker-process.md §11, P — probes (items 67–99). Real drop-in scripts, fake ``nvidia-smi``.

Every Prober gets an explicit nvidia-smi search path (an empty tmp dir unless a test installs a
fake ``nvidia-smi`` there), so a real nvidia-smi on the test host never leaks in. Every pass is
guarded by ``trio.fail_after``.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from fleet_trio.durations import MILLISECOND, SECOND
from fleet_trio.worker.config import DeviceConfig, WorkerConfig
from fleet_trio.worker.probes import (
    CLEARING_PHRASE,
    Prober,
    ProbeResult,
    builtin_host_facts,
    nvidia_labels,
    parse_nvidia_smi,
)
from tests.helpers import new_dir, sh_script

LOGGER = "fleet_trio.worker.probes"
PHRASE = "cleared rather than preserved"
GUARD = 30
non_root = pytest.mark.skipif(os.geteuid() == 0, reason="root ignores permission bits")

assert PHRASE in CLEARING_PHRASE


def emit(obj: str) -> str:
    """A probe body printing ``obj`` verbatim."""
    return f"cat <<'EOF'\n{obj}\nEOF"


@pytest.fixture
def probe_dir(tmp_path: Path) -> Path:
    return new_dir(tmp_path / "probe.d")


@pytest.fixture
def bindir(tmp_path: Path) -> Path:
    return new_dir(tmp_path / "bin")


def make_prober(
    probe_dir: Path,
    bindir: Path,
    devices: tuple[str, ...] = ("gpu0", "gpu1"),
    *,
    timeout_ns: int = 5 * SECOND,
    budget: float = 30.0,
) -> Prober:
    config = WorkerConfig(
        host="h",
        devices=[DeviceConfig(name=d) for d in devices],
        probe_dir=str(probe_dir),
        probe_timeout=timeout_ns,
    )
    return Prober(config, pass_budget=budget, path=str(bindir))


@pytest.fixture
def prober(probe_dir: Path, bindir: Path) -> Prober:
    """A prober of ``probe_dir`` with devices gpu0 and gpu1."""
    return make_prober(probe_dir, bindir)


async def one_pass(prober: Prober) -> ProbeResult:
    with trio.fail_after(GUARD):
        return await prober.run_pass()


async def pass_with(prober: Prober, name: str, body: str) -> ProbeResult:
    """(Re)write the probe ``name`` in the prober's directory, then run one pass."""
    sh_script(Path(prober.probe_dir), name, body)
    return await one_pass(prober)


async def probed(probe_dir: Path, bindir: Path, output: str) -> ProbeResult:
    """One pass of a fresh prober whose only probe prints ``output``."""
    sh_script(probe_dir, "10-x", emit(output))
    return await one_pass(make_prober(probe_dir, bindir))


def fake_smi(bindir: Path, body: str) -> Path:
    return sh_script(bindir, "nvidia-smi", body)


def phrase_count(caplog: pytest.LogCaptureFixture) -> int:
    return sum(PHRASE in r.getMessage() for r in caplog.records)


async def warnings_after_flaky_fails(prober: Prober, caplog: pytest.LogCaptureFixture) -> int:
    """Fail the probe ``10-flaky`` in one pass; the clearing warnings logged so far."""
    await pass_with(prober, "10-flaky", "exit 1")
    return phrase_count(caplog)


@pytest.fixture
def probe_warnings(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """``caplog``, capturing the prober's warnings."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    return caplog


@pytest.fixture
def restore_modes(probe_dir: Path) -> Iterator[None]:
    yield
    if probe_dir.exists():
        probe_dir.chmod(0o755)


async def test_process_067_probe_output_becomes_host_labels(probe_dir: Path, bindir: Path) -> None:
    res = await probed(probe_dir, bindir, '{"vendor":"nvidia","cuda":"12.4"}')
    assert res.host["vendor"] == "nvidia"
    assert res.host["cuda"] == "12.4"


async def test_process_068_device_scoped_probe_keys(probe_dir: Path, bindir: Path) -> None:
    res = await probed(probe_dir, bindir, '{"gpu0.vram":"80G","gpu1.vram":"24G"}')
    assert res.device["gpu0"]["vram"] == "80G"
    assert res.device["gpu1"]["vram"] == "24G"
    assert "gpu0.vram" not in res.host


async def test_process_069_failing_probe_is_skipped_not_fatal(
    probe_dir: Path, bindir: Path
) -> None:
    sh_script(probe_dir, "10-fail", "echo oops >&2; exit 1")
    sh_script(probe_dir, "20-good", emit('{"vendor":"nvidia"}'))
    res = await one_pass(make_prober(probe_dir, bindir))
    assert res.host["vendor"] == "nvidia"


async def test_process_070_garbage_output_is_skipped(probe_dir: Path, bindir: Path) -> None:
    sh_script(probe_dir, "10-garbage", "echo 'not json at all'")
    sh_script(probe_dir, "20-good", emit('{"vendor":"nvidia"}'))
    res = await one_pass(make_prober(probe_dir, bindir))
    assert res.host["vendor"] == "nvidia"
    assert "not" not in res.host
    assert all("not" not in facts for facts in res.device.values())


async def test_process_071_hanging_probe_is_timed_out(probe_dir: Path, bindir: Path) -> None:
    sh_script(probe_dir, "10-hang", "sleep 30")
    sh_script(probe_dir, "20-good", emit('{"vendor":"nvidia"}'))
    prober = make_prober(probe_dir, bindir, timeout_ns=300 * MILLISECOND)
    start = time.monotonic()
    res = await one_pass(prober)
    assert time.monotonic() - start < 10
    assert res.host["vendor"] == "nvidia"


async def test_process_072_non_scalar_values_are_skipped(probe_dir: Path, bindir: Path) -> None:
    res = await probed(probe_dir, bindir, '{"ok":"yes","nested":{"a":1},"list":[1,2]}')
    assert res.host["ok"] == "yes"
    assert "nested" not in res.host
    assert "list" not in res.host


async def test_process_073_numbers_and_bools_become_strings(probe_dir: Path, bindir: Path) -> None:
    res = await probed(probe_dir, bindir, '{"cores":32,"ecc":true}')
    assert res.host["cores"] == "32"
    assert res.host["ecc"] == "true"


async def test_process_074_missing_probe_dir_is_not_an_error(tmp_path: Path, bindir: Path) -> None:
    res = await one_pass(make_prober(tmp_path / "does-not-exist", bindir))
    assert res.host  # the built-ins ran
    assert "cpus" in res.host
    assert res.unconfirmed == frozenset()


async def test_process_075_oversized_probe_output_is_skipped(probe_dir: Path, bindir: Path) -> None:
    sh_script(
        probe_dir,
        "10-big",
        "printf '{\"x\":\"'; head -c 200000 /dev/zero | tr '\\000' a; printf '\"}'",
    )
    sh_script(probe_dir, "20-good", emit('{"vendor":"nvidia"}'))
    res = await one_pass(make_prober(probe_dir, bindir))
    assert res.host["vendor"] == "nvidia"
    assert "x" not in res.host


async def test_process_076_unknown_device_scoped_key_is_dropped_not_host_fact(
    probe_dir: Path, bindir: Path
) -> None:
    res = await probed(probe_dir, bindir, '{"gpu2.model":"RTX 4090","vendor":"nvidia"}')
    assert res.host["vendor"] == "nvidia"
    assert "gpu2.model" not in res.host
    assert "model" not in res.host
    assert set(res.device) == {"gpu0", "gpu1"}
    assert all("model" not in facts and "gpu2.model" not in facts for facts in res.device.values())


async def test_process_077_malformed_dotted_keys_are_dropped(probe_dir: Path, bindir: Path) -> None:
    res = await probed(probe_dir, bindir, '{"":"e",".lead":"l","trail.":"t","vendor":"nvidia"}')
    assert res.host["vendor"] == "nvidia"
    for key in ("", ".lead", "trail.", "lead", "trail"):
        assert key not in res.host
    assert res.device == {"gpu0": {}, "gpu1": {}}


async def test_process_078_broken_probe_marks_only_the_devices_it_speaks_for(
    prober: Prober,
) -> None:
    first = await pass_with(prober, "10-gpu", emit('{"gpu0.vram":"80G"}'))
    assert first.unconfirmed == frozenset()
    second = await pass_with(prober, "10-gpu", "exit 1")
    assert second.unconfirmed == {"gpu0"}


async def test_process_079_probe_that_never_succeeded_speaks_for_no_device(
    probe_dir: Path, bindir: Path
) -> None:
    sh_script(probe_dir, "10-missing-tool", "exit 127")
    res = await one_pass(make_prober(probe_dir, bindir))
    assert "cpus" in res.host
    assert res.unconfirmed == frozenset()


async def test_process_080_preservation_lasts_as_long_as_the_outage(
    probe_dir: Path, prober: Prober
) -> None:
    await pass_with(prober, "10-gpu", emit('{"gpu0.vram":"80G"}'))
    sh_script(probe_dir, "10-gpu", "exit 1")
    for _ in range(2, 6):
        res = await one_pass(prober)
        assert res.unconfirmed == {"gpu0"}


async def test_process_081_host_only_probe_speaks_for_no_device_even_after_succeeding(
    prober: Prober,
) -> None:
    first = await pass_with(prober, "10-rack", emit('{"rack":"r3","disk_free_bytes":"1"}'))
    assert first.host["rack"] == "r3"
    assert first.unconfirmed == frozenset()
    second = await pass_with(prober, "10-rack", "exit 1")
    assert second.unconfirmed == frozenset()
    assert "rack" not in second.host


async def test_process_082_clearing_probe_warns_once_per_episode(
    prober: Prober, probe_warnings: pytest.LogCaptureFixture
) -> None:
    assert await warnings_after_flaky_fails(prober, probe_warnings) == 1
    record = next(r for r in probe_warnings.records if PHRASE in r.getMessage())
    message = record.getMessage()
    assert "10-flaky" in message and "gpu0" in message and "gpu1" in message
    for _ in range(3):
        await one_pass(prober)
    assert phrase_count(probe_warnings) == 1
    await pass_with(prober, "10-flaky", emit('{"vendor":"x"}'))
    assert phrase_count(probe_warnings) == 1
    assert await warnings_after_flaky_fails(prober, probe_warnings) == 2


async def test_process_083_returning_probe_warns_again_after_it_disappeared(
    probe_dir: Path, prober: Prober, probe_warnings: pytest.LogCaptureFixture
) -> None:
    path = sh_script(probe_dir, "10-flaky", "exit 1")
    await one_pass(prober)
    assert phrase_count(probe_warnings) == 1
    path.unlink()
    await one_pass(prober)
    assert phrase_count(probe_warnings) == 1
    assert await warnings_after_flaky_fails(prober, probe_warnings) == 2


async def test_process_084_broken_nvidia_smi_never_warns_about_clearing(
    probe_dir: Path, bindir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    fake_smi(
        bindir,
        "echo 'Failed to initialize NVML: Driver/library version mismatch' >&2; exit 1",
    )
    res = await one_pass(make_prober(probe_dir, bindir, ("a100-0",)))
    assert "nvidia-smi" in caplog.text
    assert res.unconfirmed == frozenset()
    assert PHRASE not in caplog.text


async def test_process_085_unstatable_probe_preserves_the_devices_it_speaks_for(
    probe_dir: Path, prober: Prober, tmp_path: Path
) -> None:
    target = sh_script(tmp_path, "real-probe.sh", emit('{"gpu0.vram":"80G"}'))
    (probe_dir / "10-link").symlink_to(target)
    first = await one_pass(prober)
    assert first.device["gpu0"]["vram"] == "80G"
    target.unlink()
    second = await one_pass(prober)
    assert second.unconfirmed == {"gpu0"}


async def test_process_086_probe_that_stops_naming_a_device_stops_speaking_for_it(
    prober: Prober,
) -> None:
    await pass_with(prober, "10-gpu", emit('{"gpu0.vram":"80G"}'))
    second = await pass_with(prober, "10-gpu", emit("{}"))
    assert second.unconfirmed == frozenset()
    third = await pass_with(prober, "10-gpu", "exit 1")
    assert third.unconfirmed == frozenset()


@non_root
@pytest.mark.usefixtures("restore_modes")
async def test_process_087_unreadable_probe_dir_preserves_the_devices_its_probes_speak_for(
    probe_dir: Path, prober: Prober
) -> None:
    await pass_with(prober, "10-gpu", emit('{"gpu0.vram":"80G"}'))
    probe_dir.chmod(0)
    res = await one_pass(prober)
    assert "cpus" in res.host
    assert res.unconfirmed == {"gpu0"}


async def test_unlistable_probe_dir_preserves_the_devices_its_probes_speak_for(
    probe_dir: Path, bindir: Path
) -> None:
    prober = make_prober(probe_dir, bindir)
    """Root-runnable variant of item 87: the dir becomes a regular file (ENOTDIR)."""
    await pass_with(prober, "10-gpu", emit('{"gpu0.vram":"80G"}'))
    shutil.rmtree(probe_dir)
    probe_dir.write_text("not a directory\n")
    res = await one_pass(prober)
    assert "cpus" in res.host
    assert res.unconfirmed == {"gpu0"}


ONE_ROW = "echo 'NVIDIA A100-SXM4-80GB, 81920, 80000, 550.54.15'"


async def _recloud_scenario(probe_dir: Path, bindir: Path, break_dir: object) -> None:
    fake_smi(bindir, ONE_ROW)
    prober = make_prober(probe_dir, bindir)
    first = await pass_with(prober, "10-gpu1", emit('{"gpu1.rack":"r3"}'))
    assert first.device["gpu1"]["rack"] == "r3"
    assert callable(break_dir)
    break_dir()
    res = await one_pass(prober)
    assert res.unconfirmed == {"gpu1"}
    assert res.device["gpu0"]["vram"] == "81920M"


@non_root
@pytest.mark.usefixtures("restore_modes")
async def test_process_088_unreadable_probe_dir_does_not_recloud_a_source_that_ran_fine(
    probe_dir: Path, bindir: Path
) -> None:
    await _recloud_scenario(probe_dir, bindir, lambda: probe_dir.chmod(0))


async def test_unlistable_probe_dir_does_not_recloud_a_source_that_ran_fine(
    probe_dir: Path, bindir: Path
) -> None:
    """Root-runnable variant of item 88: the dir becomes a regular file."""

    def replace() -> None:
        shutil.rmtree(probe_dir)
        probe_dir.write_text("x\n")

    await _recloud_scenario(probe_dir, bindir, replace)


async def test_process_089_absent_probe_dir_clears_normally(
    probe_dir: Path, prober: Prober
) -> None:
    await pass_with(prober, "10-gpu", emit('{"gpu0.vram":"80G"}'))
    shutil.rmtree(probe_dir)
    res = await one_pass(prober)
    assert "cpus" in res.host
    assert res.unconfirmed == frozenset()


async def test_process_090_broken_nvidia_smi_preserves_only_devices_it_could_ever_label(
    probe_dir: Path, bindir: Path
) -> None:
    fake_smi(bindir, "echo 'NVIDIA-SMI has failed' >&2; exit 1")
    res = await one_pass(make_prober(probe_dir, bindir, ("gpu0", "a100-0")))
    assert res.unconfirmed == {"gpu0"}


async def test_process_091_broken_nvidia_smi_prefers_the_devices_it_actually_reported(
    probe_dir: Path, bindir: Path, tmp_path: Path
) -> None:
    prober = make_prober(probe_dir, bindir)
    flag = tmp_path / "broken"
    fake_smi(bindir, f'if [ -e "{flag}" ]; then echo NVML error >&2; exit 1; fi\n{ONE_ROW}')
    first = await one_pass(prober)
    assert first.device["gpu0"]["vram"] == "81920M"
    assert first.device["gpu1"] == {}
    flag.touch()
    second = await one_pass(prober)
    assert second.unconfirmed == {"gpu0"}


async def test_process_092_stderr_warning_does_not_lose_stdout_labels(
    probe_dir: Path, bindir: Path
) -> None:
    sh_script(probe_dir, "10-x", "echo warning >&2\n" + emit('{"vendor":"nvidia"}'))
    res = await one_pass(make_prober(probe_dir, bindir))
    assert res.host["vendor"] == "nvidia"


async def test_process_093_probe_pass_is_bounded_as_a_whole(probe_dir: Path, bindir: Path) -> None:
    for i in range(5):
        sh_script(probe_dir, f"{i:02d}-hang", "sleep 30")
    prober = make_prober(probe_dir, bindir, timeout_ns=2 * SECOND, budget=0.3)
    start = time.monotonic()
    res = await one_pass(prober)
    assert time.monotonic() - start < 5
    assert "cpus" in res.host


async def test_process_094_probe_skipped_for_budget_preserves_the_devices_it_speaks_for(
    probe_dir: Path, prober: Prober, tmp_path: Path
) -> None:
    marker = tmp_path / "ran-once"
    sh_script(
        probe_dir,
        "05-slow.sh",
        f'if [ -e "{marker}" ]; then sleep 5; fi\ntouch "{marker}"\necho "{{}}"',
    )
    sh_script(probe_dir, "10-gpu.sh", emit('{"gpu0.vram":"80G"}'))
    first = await one_pass(prober)
    assert first.device["gpu0"]["vram"] == "80G"
    prober.pass_budget = 0.3
    second = await one_pass(prober)
    assert second.unconfirmed == {"gpu0"}


THREE_ROWS = (
    "cat <<'EOF'\n"
    "NVIDIA GeForce RTX 4090, 24576, 20000, 550.54.15\n"
    "NVIDIA A100-SXM4-80GB, 81920, 81000, 550.54.15\n"
    "Small Card, 9000, 500, 550.54.15\n"
    "EOF"
)


async def test_process_095_nvidia_labels_parses_present_driver(bindir: Path) -> None:
    fake_smi(bindir, THREE_ROWS)
    with trio.fail_after(GUARD):
        nv = await nvidia_labels(path=str(bindir))
    assert nv.found is True
    assert nv.broken is False
    assert nv.facts == {
        "gpu0.vendor": "nvidia",
        "gpu0.model": "NVIDIA GeForce RTX 4090",
        "gpu0.vram": "24576M",
        "gpu0.vram_free": "20000M",
        "gpu0.driver": "550.54.15",
        "gpu1.vendor": "nvidia",
        "gpu1.model": "NVIDIA A100-SXM4-80GB",
        "gpu1.vram": "81920M",
        "gpu1.vram_free": "81000M",
        "gpu1.driver": "550.54.15",
        "gpu2.vendor": "nvidia",
        "gpu2.model": "Small Card",
        "gpu2.vram": "9000M",
        "gpu2.vram_free": "500M",
        "gpu2.driver": "550.54.15",
    }
    assert len(nv.facts) == 15


async def test_process_096_nvidia_labels_absent_reports_not_found(bindir: Path) -> None:
    with trio.fail_after(GUARD):
        nv = await nvidia_labels(path=str(bindir))
    assert nv.facts is None
    assert nv.found is False
    assert nv.broken is False


async def test_process_097_nvidia_labels_present_but_broken_reports_found_and_broken(
    bindir: Path,
) -> None:
    fake_smi(bindir, "exit 1")
    with trio.fail_after(GUARD):
        nv = await nvidia_labels(path=str(bindir))
    assert nv.facts is None
    assert nv.found is True
    assert nv.broken is True


def test_process_098_probed_vram_compares_correctly_through_selector() -> None:
    # There is no selector module in fleet_trio (the controller's selector lives in rc), so only
    # the unit-conversion half of item 98 is asserted: MiB counts become K/M/G/T quantities
    # with an "M" suffix (never "MiB", which the selector's quantity parser would not accept).
    facts = parse_nvidia_smi("Big Card, 81920, 80000, 550\nSmall Card, 9000, 8000, 550\n")
    assert facts["gpu0.vram"] == "81920M"
    assert facts["gpu1.vram"] == "9000M"
    assert facts["gpu0.vram_free"] == "80000M"
    assert facts["gpu1.vram_free"] == "8000M"
    for key, value in facts.items():
        if key.endswith((".vram", ".vram_free")):
            assert re.fullmatch(r"[0-9]+[KMGT]", value), value


def test_process_099_builtin_host_facts() -> None:
    facts = builtin_host_facts()
    assert facts["cpus"] == str(len(os.sched_getaffinity(0)))
    with open("/proc/meminfo") as f:
        line = next(x for x in f if x.startswith("MemTotal:"))
    assert facts["mem_total_bytes"] == str(int(line.split()[1]) * 1024)
    with open("/proc/sys/kernel/osrelease") as f:
        assert facts["kernel"] == f.read().strip()
    assert re.fullmatch(r"[0-9]+", facts["disk_free_bytes"])
    assert "cuda" not in facts
