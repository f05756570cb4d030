"""worker-protocol.md §15.1 items 1–20 (configuration) and worker-process.md §11 items 36, 37
and 127, at the config level (fleet_trio.worker.config)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from fleet_trio.durations import HOUR, SECOND
from fleet_trio.errors import ConfigError
from fleet_trio.worker.config import (
    DeviceConfig,
    HooksConfig,
    WorkerConfig,
    config_from_mapping,
    load_worker_config,
)

URL = "controller_url: http://127.0.0.1:18080\n"


def _load(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> WorkerConfig:
    path = tmp_path / "worker.yaml"
    path.write_text(text)
    return load_worker_config(path, environ=env or {}, hostname=lambda: "gpubox")


def _fails(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, text)
    message = str(info.value)
    assert str(tmp_path / "worker.yaml") in message
    return message


def test_protocol_001_bare_string_devices_have_no_ceiling(tmp_path: Path) -> None:
    cfg = _load(tmp_path, URL + "devices:\n  - gpu0\n  - gpu1\n")
    assert [d.name for d in cfg.devices] == ["gpu0", "gpu1"]
    assert all(d.max_runtime == 0 and d.max_runtime_seconds == 0 for d in cfg.devices)


def test_protocol_002_object_devices_max_runtime(tmp_path: Path) -> None:
    cfg = _load(tmp_path, URL + "devices:\n  - name: gpu0\n    max_runtime: 4h\n  - name: gpu1\n")
    assert cfg.devices[0].max_runtime == 4 * HOUR
    assert cfg.devices[1].max_runtime == 0


def test_protocol_003_object_device_without_name_fails(tmp_path: Path) -> None:
    message = _fails(tmp_path, URL + "devices:\n  - max_runtime: 4h\n")
    assert "name" in message


def test_protocol_004_sub_second_max_runtime_fails(tmp_path: Path) -> None:
    message = _fails(tmp_path, URL + "devices:\n  - name: gpu0\n    max_runtime: 500ms\n")
    assert '"gpu0"' in message
    assert "one-second granularity" in message


def test_protocol_005_host_hooks_reach_a_device_that_sets_neither(tmp_path: Path) -> None:
    cfg = _load(
        tmp_path,
        URL + "hooks:\n  timeout: 90s\n  release_linger: 45s\n"
        "devices:\n  - name: gpu0\n    on_acquire: /etc/rc/acquire.sh\n",
    )
    assert cfg.devices[0].timeout == 90 * SECOND
    assert cfg.devices[0].release_linger == 45 * SECOND


def test_protocol_006_no_hooks_section_defaults_60s_30s(tmp_path: Path) -> None:
    cfg = _load(
        tmp_path,
        URL + "devices:\n  - name: gpu0\n    on_release: /r.sh\n  - name: gpu1\n"
        "    on_acquire: /a.sh\n",
    )
    assert [(d.timeout, d.release_linger) for d in cfg.devices] == [
        (60 * SECOND, 30 * SECOND),
        (60 * SECOND, 30 * SECOND),
    ]


def test_protocol_007_device_override_is_for_that_device_only(tmp_path: Path) -> None:
    cfg = _load(
        tmp_path,
        URL + "hooks: {timeout: 90s, release_linger: 45s}\ndevices:\n"
        "  - {name: gpu0, on_acquire: /a.sh, timeout: 5s, release_linger: 2s}\n"
        "  - {name: gpu1, on_acquire: /a.sh}\n",
    )
    gpu0, gpu1 = cfg.devices
    assert (gpu0.timeout, gpu0.release_linger) == (5 * SECOND, 2 * SECOND)
    assert (gpu1.timeout, gpu1.release_linger) == (90 * SECOND, 45 * SECOND)


def test_protocol_008_only_one_hook_may_be_declared(tmp_path: Path) -> None:
    cfg = _load(
        tmp_path,
        URL
        + "devices:\n  - {name: gpu0, on_acquire: /a.sh}\n  - {name: gpu1, on_release: /r.sh}\n",
    )
    gpu0, gpu1 = cfg.devices
    assert (gpu0.on_acquire, gpu0.on_release) == ("/a.sh", "")
    assert (gpu1.on_acquire, gpu1.on_release) == ("", "/r.sh")
    assert gpu0.has_hooks and gpu1.has_hooks


def test_protocol_009_bare_name_device_resolves_default_timeouts(tmp_path: Path) -> None:
    (dev,) = _load(tmp_path, URL + "devices: [gpu0]\n").devices
    assert (dev.on_acquire, dev.on_release, dev.has_hooks) == ("", "", False)
    assert (dev.timeout, dev.release_linger) == (60 * SECOND, 30 * SECOND)


def test_protocol_010_whitespace_on_acquire_rejected(tmp_path: Path) -> None:
    message = _fails(tmp_path, URL + "devices:\n  - name: gpu0\n    on_acquire: '   '\n")
    assert '"gpu0"' in message
    assert "on_acquire" in message


def test_protocol_011_missing_hook_file_accepted_at_load(tmp_path: Path) -> None:
    absent = tmp_path / "no-such-hook.sh"
    cfg = _load(tmp_path, URL + f"devices:\n  - name: gpu0\n    on_acquire: {absent}\n")
    assert cfg.devices[0].on_acquire == str(absent)
    assert not absent.exists()


def test_protocol_012_rc_token_used_without_file_token(tmp_path: Path) -> None:
    cfg = _load(tmp_path, URL + "devices: [gpu0]\n", {"RC_TOKEN": "from-env"})
    assert cfg.token == "from-env"


def test_protocol_013_file_token_beats_rc_token(tmp_path: Path) -> None:
    cfg = _load(tmp_path, URL + "token: from-file\ndevices: [gpu0]\n", {"RC_TOKEN": "from-env"})
    assert cfg.token == "from-file"


def test_protocol_014_whitespace_rc_token_is_unset(tmp_path: Path) -> None:
    cfg = _load(tmp_path, URL + "devices: [gpu0]\n", {"RC_TOKEN": "   "})
    assert cfg.token == ""


def test_protocol_015_require_manual_clear_in_file(tmp_path: Path) -> None:
    cfg = _load(tmp_path, URL + "devices: [gpu0]\nrequire_manual_clear: true\n")
    assert cfg.require_manual_clear is True


def test_protocol_016_env_true_turns_it_on(tmp_path: Path) -> None:
    cfg = _load(tmp_path, URL + "devices: [gpu0]\n", {"RC_REQUIRE_MANUAL_CLEAR": "true"})
    assert cfg.require_manual_clear is True


def test_protocol_017_env_false_cannot_turn_off_file_true(tmp_path: Path) -> None:
    cfg = _load(
        tmp_path,
        URL + "devices: [gpu0]\nrequire_manual_clear: true\n",
        {"RC_REQUIRE_MANUAL_CLEAR": "false"},
    )
    assert cfg.require_manual_clear is True


def test_protocol_018_non_boolean_env_turns_it_on(tmp_path: Path) -> None:
    cfg = _load(tmp_path, URL + "devices: [gpu0]\n", {"RC_REQUIRE_MANUAL_CLEAR": "yes please"})
    assert cfg.require_manual_clear is True


def test_protocol_019_whitespace_env_leaves_it_off(tmp_path: Path) -> None:
    cfg = _load(tmp_path, URL + "devices: [gpu0]\n", {"RC_REQUIRE_MANUAL_CLEAR": "  \t"})
    assert cfg.require_manual_clear is False


def test_protocol_020_config_built_in_code_gets_every_default() -> None:
    cfg = WorkerConfig(
        controller_url="http://127.0.0.1:18080",
        host="gpubox",
        devices=(DeviceConfig(name="gpu0", on_acquire="/a.sh", on_release="/r.sh"),),
    )
    assert cfg.devices[0].timeout == 60 * SECOND  # no hook ever runs without a timeout
    assert cfg.devices[0].release_linger == 30 * SECOND
    assert cfg.heartbeat_interval == 10 * SECOND
    assert cfg.poll_wait == 30 * SECOND
    assert cfg.probe_interval > 0 and cfg.probe_timeout > 0
    assert cfg.verify_timeout > 0 and cfg.verify_pass_budget > 0
    assert cfg.probe_dir and cfg.verify_dir and cfg.sheet_dir
    # the same through config_from_mapping (no YAML file involved)
    built = config_from_mapping(
        {"controller_url": "http://c", "devices": [{"name": "gpu0", "on_acquire": "/a.sh"}]},
        environ={},
        hostname=lambda: "gpubox",
    )
    assert built.devices[0].timeout == 60 * SECOND


def test_process_036_code_built_hooks_without_timeouts_resolve_defaults() -> None:
    # Config half of TestNewAppliesHookDefaults; the whole-worker half (Worker.__init__
    # resolving them too) belongs with the worker itself.
    cfg = WorkerConfig(
        controller_url="http://c",
        host="gpubox",
        devices=[DeviceConfig("gpu0", on_acquire="/a.sh", on_release="/r.sh")],
        hooks=HooksConfig(timeout=0, release_linger=0),
        heartbeat_interval=0,
        poll_wait=0,
    )
    assert cfg.devices[0].timeout == 60 * SECOND
    assert cfg.devices[0].release_linger == 30 * SECOND
    assert cfg.heartbeat_interval == 10 * SECOND
    assert cfg.poll_wait == 30 * SECOND


def test_process_037_code_built_host_hooks_reach_devices() -> None:
    cfg = WorkerConfig(
        controller_url="http://c",
        host="gpubox",
        devices=[DeviceConfig("gpu0", on_acquire="/a.sh"), DeviceConfig("gpu1", timeout=SECOND)],
        hooks=HooksConfig(timeout=7 * SECOND, release_linger=3 * SECOND),
    )
    gpu0, gpu1 = cfg.devices
    assert (gpu0.timeout, gpu0.release_linger) == (7 * SECOND, 3 * SECOND)
    assert (gpu1.timeout, gpu1.release_linger) == (SECOND, 3 * SECOND)


def test_process_127_rc_require_manual_clear_yes_please_and_false(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="fleet_trio.worker.config")
    cfg = _load(tmp_path, URL + "devices: [gpu0]\n", {"RC_REQUIRE_MANUAL_CLEAR": "yes please"})
    assert cfg.require_manual_clear is True
    assert "RC_REQUIRE_MANUAL_CLEAR" in caplog.text
    cfg = _load(
        tmp_path,
        URL + "devices: [gpu0]\nrequire_manual_clear: true\n",
        {"RC_REQUIRE_MANUAL_CLEAR": "false"},
    )
    assert cfg.require_manual_clear is True
