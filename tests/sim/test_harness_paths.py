"""Relative directories in a harness test's worker config (issue 28 §3).

``fleet-trio worker`` takes ``probe_dir`` / ``verify_dir`` / ``sheet_dir`` and hook paths as
written, so a relative one is relative to its working directory, as rc worker does. The
harness resolves them against the YAML file's folder (a mapping: ``base_dir``, else the
working directory), as node ``command:`` paths are; a configured directory that does not
exist is one WARNING naming the key, the path and the file.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import trio

from fleet_trio.sim.harness import open_controller, open_worker
from fleet_trio.worker.config import config_from_mapping, load_worker_config

FAILING_VERIFY = "#!/bin/sh\necho dirty >&2\nexit 1\n"


def _config_folder(root: Path) -> Path:
    """A folder holding worker.yaml with ``verify_dir: verify.d`` beside a failing script."""
    folder = root / "cfg"
    (folder / "verify.d").mkdir(parents=True)
    script = folder / "verify.d" / "10-always-dirty"
    script.write_text(FAILING_VERIFY)
    script.chmod(0o755)
    (folder / "worker.yaml").write_text(
        "controller_url: http://replaced\nhost: paths-box\ndevices: [gpu0]\nverify_dir: verify.d\n"
    )
    return folder


async def _quarantined_after_a_job(config: object, **options: object) -> list[str]:
    async with open_controller() as ctrl, open_worker(config, ctrl, **options) as worker:  # type: ignore[arg-type]
        with trio.fail_after(30):
            job = await worker.run("gpu0", ["true"])
        assert job.state in ("succeeded", "failed")
        return ctrl.faults("paths-box:gpu0")


@pytest.mark.trio
async def test_a_relative_verify_dir_resolves_against_the_yaml_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _config_folder(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # pytest's working directory is rarely the config's folder
    faults = await _quarantined_after_a_job(folder / "worker.yaml", workdir=tmp_path / "w")
    assert len(faults) == 1, faults
    assert faults[0].startswith("verify failed: ")


@pytest.mark.trio
async def test_a_mapping_resolves_against_base_dir(tmp_path: Path) -> None:
    folder = _config_folder(tmp_path)
    mapping = {"host": "paths-box", "devices": ["gpu0"], "verify_dir": "verify.d"}
    faults = await _quarantined_after_a_job(mapping, workdir=tmp_path / "w", base_dir=folder)
    assert len(faults) == 1, faults


@pytest.mark.trio
async def test_a_missing_configured_directory_is_warned_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "cfg"
    folder.mkdir()
    path = folder / "worker.yaml"
    path.write_text(
        "controller_url: http://replaced\nhost: paths-box\ndevices: [gpu0]\nverify_dir: verify.d\n"
    )
    caplog.set_level(logging.WARNING)
    async with open_controller() as ctrl, open_worker(path, ctrl, workdir=tmp_path / "w"):
        pass
    lines = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "verify_dir" in r.getMessage()
    ]
    assert len(lines) == 1, lines
    assert str(path) in lines[0]
    assert str(folder / "verify.d") in lines[0]
    assert "does not exist" in lines[0]
    # the harness's own scratch directories (not in the file) are not warned about
    assert not [r for r in caplog.records if "probe_dir" in r.getMessage()]


def test_fleet_trio_worker_keeps_relative_paths_as_rc_does(tmp_path: Path) -> None:
    """The worker's own loader does not rebase: rc worker opens a relative verify_dir from
    its working directory (systemd starts it in /)."""
    folder = _config_folder(tmp_path)
    cfg = load_worker_config(folder / "worker.yaml", environ={})
    assert cfg.verify_dir == "verify.d"
    rebased = load_worker_config(folder / "worker.yaml", environ={}, base_dir=folder)
    assert rebased.verify_dir == str(folder / "verify.d")


def test_base_dir_rebases_dirs_and_hook_paths_with_a_slash(tmp_path: Path) -> None:
    cfg = config_from_mapping(
        {
            "controller_url": "http://c:1",
            "devices": [
                {"name": "gpu0", "on_acquire": "hooks/acq.sh", "on_release": "/abs/rel.sh"},
                {"name": "gpu1", "on_acquire": "on-path-hook"},
            ],
            "probe_dir": "probe.d",
            "sheet_dir": "/etc/rc",
        },
        environ={},
        base_dir=tmp_path,
    )
    assert cfg.probe_dir == os.path.join(tmp_path, "probe.d")
    assert cfg.sheet_dir == "/etc/rc"
    assert cfg.devices[0].on_acquire == os.path.join(tmp_path, "hooks/acq.sh")
    assert cfg.devices[0].on_release == "/abs/rel.sh"
    # no slash: looked up on PATH by the worker, as rc does; left alone
    assert cfg.devices[1].on_acquire == "on-path-hook"
    assert cfg.verify_dir == "/etc/rc/verify.d"  # a default is absolute already
