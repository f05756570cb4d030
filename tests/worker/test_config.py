"""fleet_trio.worker.config: the rc worker.yaml, every key, default and error (§12)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import attrs
import pytest

from fleet_trio.durations import HOUR, MILLISECOND, MINUTE, SECOND
from fleet_trio.errors import ConfigError
from fleet_trio.worker.config import (
    DEFAULT_HOOK_TIMEOUT,
    DEFAULT_RELEASE_LINGER,
    REDACTED,
    DeviceConfig,
    HooksConfig,
    WorkerConfig,
    config_from_mapping,
    cuda_device_index,
    file_fields,
    load_worker_config,
    parse_go_bool,
)

BASE = "controller_url: http://ctl:8080\ndevices: [gpu0]\n"


def _load(
    tmp_path: Path,
    text: str,
    env: dict[str, str] | None = None,
    hostname: str = "gpubox",
) -> WorkerConfig:
    path = tmp_path / "worker.yaml"
    path.write_text(text)
    return load_worker_config(path, environ=env or {}, hostname=lambda: hostname)


def _error(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, text, env)
    err = info.value
    message = str(err)
    assert "\n" not in message
    assert message.startswith(str(tmp_path / "worker.yaml") + ": ")
    if err.key:
        assert f": {err.key}: " in message
    return err


def _refuses(tmp_path: Path, text: str, key: str | None, says: str) -> None:
    """Loading ``text`` fails naming ``key`` (``None``: no key) with a message that says
    ``says``."""
    err = _error(tmp_path, text)
    assert err.key == key
    assert says in str(err)


# --- defaults ---------------------------------------------------------------------------------


def test_minimal_file_gets_every_default(tmp_path: Path) -> None:
    cfg = _load(tmp_path, BASE)
    assert cfg.controller_url == "http://ctl:8080"
    assert cfg.token == ""
    assert cfg.host == "gpubox"
    assert cfg.heartbeat_interval == 10 * SECOND
    assert cfg.poll_wait == 30 * SECOND
    assert cfg.hooks == HooksConfig(timeout=60 * SECOND, release_linger=30 * SECOND)
    assert cfg.probe_dir == "/etc/rc/probe.d"
    assert cfg.probe_interval == 5 * MINUTE
    assert cfg.probe_timeout == 5 * SECOND
    assert cfg.verify_dir == "/etc/rc/verify.d"
    assert cfg.verify_timeout == 30 * SECOND
    assert cfg.verify_pass_budget == 2 * MINUTE
    assert cfg.sheet_dir == "/etc/rc"
    assert cfg.require_manual_clear is False
    assert cfg.path == str(tmp_path / "worker.yaml")
    assert cfg.ignored_keys == ()
    (dev,) = cfg.devices
    assert dev == DeviceConfig(
        name="gpu0", timeout=60 * SECOND, release_linger=30 * SECOND, labels={}
    )
    assert dev.max_runtime == 0 and dev.max_runtime_seconds == 0
    assert not dev.has_hooks


def test_every_key_is_read(tmp_path: Path) -> None:
    cfg = _load(
        tmp_path,
        """
controller_url: http://ctl:8080
token: file-token
host: box7
heartbeat_interval: 3s
poll_wait: 45s
hooks: {timeout: 90s, release_linger: 45s}
probe_dir: /p.d
probe_interval: 1m
probe_timeout: 2s
verify_dir: /v.d
verify_timeout: 10s
verify_pass_budget: 1m30s
sheet_dir: /s
require_manual_clear: true
devices:
  - name: gpu3
    max_runtime: 6h
    on_acquire: /hooks/acquire.sh
    on_release: /hooks/release.sh
    timeout: 20s
    release_linger: 1.5s
    labels: {rack: r3, tier: 3, fast: yes, ratio: 1.50}
""",
    )
    assert cfg.token == "file-token"
    assert cfg.host == "box7"
    assert cfg.heartbeat_interval == 3 * SECOND
    assert cfg.poll_wait == 45 * SECOND
    assert cfg.hooks == HooksConfig(90 * SECOND, 45 * SECOND)
    assert (cfg.probe_dir, cfg.verify_dir, cfg.sheet_dir) == ("/p.d", "/v.d", "/s")
    assert cfg.probe_interval == MINUTE
    assert cfg.probe_timeout == 2 * SECOND
    assert cfg.verify_timeout == 10 * SECOND
    assert cfg.verify_pass_budget == 90 * SECOND
    assert cfg.require_manual_clear is True
    (dev,) = cfg.devices
    assert dev.name == "gpu3"
    assert dev.max_runtime == 6 * HOUR and dev.max_runtime_seconds == 21600
    assert dev.on_acquire == "/hooks/acquire.sh" and dev.on_release == "/hooks/release.sh"
    assert dev.timeout == 20 * SECOND and dev.release_linger == 1500 * MILLISECOND
    # label values are the scalar's literal text, as yaml.v3 decodes into a string
    assert dev.labels == {"rack": "r3", "tier": "3", "fast": "yes", "ratio": "1.50"}
    assert cfg.device_ids == ("box7:gpu3",)


@pytest.mark.parametrize(
    "key",
    [
        "heartbeat_interval",
        "poll_wait",
        "probe_interval",
        "probe_timeout",
        "verify_timeout",
        "verify_pass_budget",
    ],
)
@pytest.mark.parametrize("value", ['"0"', "0s", "-5s", "~", ""])
def test_zero_negative_or_null_duration_means_default(tmp_path: Path, key: str, value: str) -> None:
    default = getattr(_load(tmp_path, BASE), key)
    assert getattr(_load(tmp_path, f"{BASE}{key}: {value}\n"), key) == default


@pytest.mark.parametrize("key", ["probe_dir", "verify_dir", "sheet_dir"])
def test_empty_dir_means_default(tmp_path: Path, key: str) -> None:
    default = getattr(_load(tmp_path, BASE), key)
    assert getattr(_load(tmp_path, f'{BASE}{key}: ""\n'), key) == default


def test_zero_or_negative_hook_values_mean_default(tmp_path: Path) -> None:
    cfg = _load(
        tmp_path,
        BASE.replace("[gpu0]", "[{name: gpu0, timeout: -1s, release_linger: 0s}]")
        + "hooks: {timeout: 0s, release_linger: -2s}\n",
    )
    assert cfg.hooks == HooksConfig(DEFAULT_HOOK_TIMEOUT, DEFAULT_RELEASE_LINGER)
    assert cfg.devices[0].timeout == DEFAULT_HOOK_TIMEOUT
    assert cfg.devices[0].release_linger == DEFAULT_RELEASE_LINGER


def test_empty_hooks_section(tmp_path: Path) -> None:
    assert _load(tmp_path, BASE + "hooks:\n").hooks == HooksConfig()
    assert _load(tmp_path, BASE + "hooks: {}\n").hooks == HooksConfig()


# --- host -------------------------------------------------------------------------------------


def test_host_defaults_to_the_hostname(tmp_path: Path) -> None:
    assert _load(tmp_path, BASE, hostname="node-17").host == "node-17"
    assert _load(tmp_path, BASE + "host: ''\n", hostname="node-17").host == "node-17"
    assert _load(tmp_path, BASE + "host: mine\n", hostname="node-17").host == "mine"
    assert _load(tmp_path, BASE + "host: 123\n").host == "123"


def test_host_unresolvable_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "worker.yaml"
    path.write_text(BASE)

    def broken() -> str:
        raise OSError("no name")

    with pytest.raises(ConfigError) as info:
        load_worker_config(path, environ={}, hostname=broken)
    assert info.value.key == "host"
    assert str(path) in str(info.value)


def test_device_id_is_host_colon_name(tmp_path: Path) -> None:
    cfg = _load(tmp_path, "controller_url: http://c\ndevices: [gpu0, gpu1]\n")
    assert cfg.device_ids == ("gpubox:gpu0", "gpubox:gpu1")
    assert cfg.device_id("gpu1") == "gpubox:gpu1"
    assert cfg.device_by_id("gpubox:gpu1") is cfg.devices[1]
    assert cfg.device_by_id("other:gpu1") is None


# --- controller_url ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("written", "resolved"),
    [
        ("http://ctl:8080", "http://ctl:8080"),
        ("http://ctl:8080/", "http://ctl:8080"),
        ("http://ctl:8080//", "http://ctl:8080"),
        ("http://ctl:8080/rc/", "http://ctl:8080/rc"),
    ],
)
def test_trailing_slash_is_tolerated(tmp_path: Path, written: str, resolved: str) -> None:
    cfg = _load(tmp_path, f"controller_url: {written}\ndevices: [gpu0]\n")
    assert cfg.controller_url == resolved
    assert WorkerConfig(controller_url=written, host="h").controller_url == resolved


@pytest.mark.parametrize(
    "text",
    [
        "devices: [gpu0]\n",
        "controller_url: ''\ndevices: [g]\n",
        "controller_url:\ndevices: [g]\n",
        "controller_url: '  '\ndevices: [g]\n",
    ],
)
def test_controller_url_required(tmp_path: Path, text: str) -> None:
    _refuses(tmp_path, text, "controller_url", "required")


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://[::1", "not a valid URL"),  # was an internal error (httpx.InvalidURL)
        ("ftp://x", "must start with http:// or https://"),  # was retried forever
        ("127.0.0.1:18930", "must start with http:// or https://"),  # no scheme
        ("localhost:8080", "must start with http:// or https://"),
        ("http://", "names no host"),
        ("http:///rc", "names no host"),
        ("http://ctl:99999", "port 99999 out of range"),
        ("http://ctl:8080/?x=1", "must not hold a query (?) or fragment (#)"),
        ("http://ctl:8080#top", "must not hold a query (?) or fragment (#)"),
        ("http://ctl 8080", "must not contain a space"),
        ("http://u:secret@ctl/rc", "must not hold a user or password"),  # Basic, not Bearer
    ],
)
def test_controller_url_must_be_an_http_url(tmp_path: Path, url: str, says: str) -> None:
    _refuses(
        tmp_path, f"controller_url: {json.dumps(url)}\ndevices: [gpu0]\n", "controller_url", says
    )


@pytest.mark.parametrize(
    "url", ["https://ctl", "HTTP://CTL:8080/", "http://[::1]:8080", "http://10.0.0.7:18930/rc/"]
)
def test_controller_url_forms_that_load(tmp_path: Path, url: str) -> None:
    cfg = _load(tmp_path, f"controller_url: {json.dumps(url)}\ndevices: [gpu0]\n")
    assert cfg.controller_url == url.rstrip("/")


# --- devices ----------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "devices: []\n", "devices:\n"])
def test_at_least_one_device_required(tmp_path: Path, text: str) -> None:
    _refuses(
        tmp_path, "controller_url: http://c\n" + text, "devices", "at least one device required"
    )


def test_bare_and_object_devices_mix(tmp_path: Path) -> None:
    cfg = _load(
        tmp_path,
        "controller_url: http://c\ndevices:\n  - gpu0\n  - name: gpu1\n    max_runtime: 4h\n"
        "  - 7\n",
    )
    assert [d.name for d in cfg.devices] == ["gpu0", "gpu1", "7"]
    assert [d.max_runtime for d in cfg.devices] == [0, 4 * HOUR, 0]


@pytest.mark.parametrize("entry", ["{max_runtime: 4h}", "{name: ''}", "{name: ~}", "''", "~"])
def test_device_without_a_name(tmp_path: Path, entry: str) -> None:
    unnamed = f"controller_url: http://c\ndevices:\n  - gpu0\n  - {entry}\n"
    _refuses(tmp_path, unnamed, "devices[1].name", "device entry needs a name")


def test_sub_second_max_runtime_rejected(tmp_path: Path) -> None:
    err = _error(
        tmp_path, "controller_url: http://c\ndevices:\n  - {name: gpu1, max_runtime: 999ms}\n"
    )
    assert err.key == "devices[0].max_runtime"
    assert (
        'device "gpu1": max_runtime 999ms is below the one-second granularity runtime '
        "ceilings are enforced at" in str(err)
    )


def test_max_runtime_boundaries(tmp_path: Path) -> None:
    cfg = _load(
        tmp_path,
        "controller_url: http://c\ndevices:\n  - {name: a, max_runtime: 1s}\n"
        "  - {name: b, max_runtime: 0s}\n  - {name: c, max_runtime: 1.9s}\n",
    )
    assert [d.max_runtime_seconds for d in cfg.devices] == [1, 0, 1]  # truncated


def test_negative_max_runtime_rejected(tmp_path: Path) -> None:
    negative = "controller_url: http://c\ndevices:\n  - {name: g, max_runtime: -1h}\n"
    _refuses(tmp_path, negative, "devices[0].max_runtime", "negative")


@pytest.mark.parametrize("hook", ["on_acquire", "on_release"])
@pytest.mark.parametrize("value", ["' '", '"\\t \\n"'])
def test_blank_hook_path_rejected(tmp_path: Path, hook: str, value: str) -> None:
    err = _error(
        tmp_path, f"controller_url: http://c\ndevices:\n  - {{name: g2, {hook}: {value}}}\n"
    )
    assert err.key == f"devices[0].{hook}"
    assert f'device "g2": {hook} must not be blank' in str(err)


def test_devices_must_be_a_list(tmp_path: Path) -> None:
    err = _error(tmp_path, "controller_url: http://c\ndevices: {gpu0: {}}\n")
    assert err.key == "devices"
    err = _error(tmp_path, "controller_url: http://c\ndevices: [[gpu0]]\n")
    assert err.key == "devices[0]"


def test_labels_must_be_string_values(tmp_path: Path) -> None:
    a_list = "controller_url: http://c\ndevices:\n  - {name: g, labels: {a: [1]}}\n"
    _refuses(tmp_path, a_list, "devices[0].labels", "'a'")
    err = _error(tmp_path, "controller_url: http://c\ndevices:\n  - {name: g, labels: [a]}\n")
    assert err.key == "devices[0].labels"


def test_null_label_value_is_empty_string(tmp_path: Path) -> None:
    cfg = _load(tmp_path, "controller_url: http://c\ndevices:\n  - {name: g, labels: {a: ~}}\n")
    assert cfg.devices[0].labels == {"a": ""}


# --- durations and scalars --------------------------------------------------------------------


@pytest.mark.parametrize("value", ["30", "0", "1.5", "true"])
def test_unquoted_non_duration_rejected(tmp_path: Path, value: str) -> None:
    err = _error(tmp_path, f"{BASE}heartbeat_interval: {value}\n")
    assert err.key == "heartbeat_interval"


@pytest.mark.parametrize("value", ['"30"', "30x", "1d", "fast"])
def test_bad_duration_string_rejected(tmp_path: Path, value: str) -> None:
    _refuses(tmp_path, f"{BASE}poll_wait: {value}\n", "poll_wait", "invalid duration")


def test_bare_number_message_says_what_to_write(tmp_path: Path) -> None:
    err = _error(tmp_path, f"{BASE}probe_interval: 30\n")
    assert "no unit" in str(err) and "30s" in str(err)


@pytest.mark.parametrize(
    ("where", "key"),
    [
        ("hooks: {timeout: 90}\n", "hooks.timeout"),
        ("hooks: {release_linger: soon}\n", "hooks.release_linger"),
        ("hooks: 5s\n", "hooks"),
    ],
)
def test_hooks_errors_name_the_key(tmp_path: Path, where: str, key: str) -> None:
    assert _error(tmp_path, BASE + where).key == key


@pytest.mark.parametrize("field", ["timeout", "release_linger", "max_runtime"])
def test_device_duration_errors_name_the_key(tmp_path: Path, field: str) -> None:
    err = _error(
        tmp_path, f"controller_url: http://c\ndevices:\n  - gpu0\n  - {{name: g, {field}: 5}}\n"
    )
    assert err.key == f"devices[1].{field}"


def test_go_duration_syntax(tmp_path: Path) -> None:
    cfg = _load(
        tmp_path, f"{BASE}probe_interval: 1m30s\nprobe_timeout: 250ms\nverify_pass_budget: 1.5h\n"
    )
    assert cfg.probe_interval == 90 * SECOND
    assert cfg.probe_timeout == 250 * MILLISECOND
    assert cfg.verify_pass_budget == 90 * MINUTE


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("true", True),
        ("True", True),
        ("TRUE", True),
        ("yes", True),
        ("Y", True),
        ("on", True),
        ("ON", True),
        ("false", False),
        ("no", False),
        ("off", False),
        ("N", False),
        ("~", False),
        ("", False),
    ],
)
def test_require_manual_clear_bool_spellings(tmp_path: Path, value: str, expected: bool) -> None:
    assert (
        _load(tmp_path, f"{BASE}require_manual_clear: {value}\n").require_manual_clear is expected
    )


@pytest.mark.parametrize("value", ["1", "maybe", "'true'", "[true]"])
def test_require_manual_clear_non_bool_rejected(tmp_path: Path, value: str) -> None:
    err = _error(tmp_path, f"{BASE}require_manual_clear: {value}\n")
    assert err.key == "require_manual_clear"


def test_string_fields_take_literal_text(tmp_path: Path) -> None:
    cfg = _load(tmp_path, "controller_url: http://c\ndevices: [gpu0]\ntoken: yes\nhost: 0x1F\n")
    assert cfg.token == "yes"
    assert cfg.host == "0x1F"


def test_string_field_given_a_mapping(tmp_path: Path) -> None:
    _refuses(
        tmp_path, "controller_url: {a: b}\ndevices: [g]\n", "controller_url", "expected a string"
    )


# --- unknown keys, YAML features --------------------------------------------------------------


def test_unknown_keys_are_ignored_and_listed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="fleet_trio.worker.config")
    cfg = _load(
        tmp_path,
        "controller_url: http://c\nmetrics_listen: 127.0.0.1:9\ndevices:\n"
        "  - {name: g, colour: red}\nhooks: {timeout: 9s, retries: 3}\n",
    )
    assert cfg.ignored_keys == ("metrics_listen", "devices[0].colour", "hooks.retries")
    assert cfg.hooks.timeout == 9 * SECOND
    assert "metrics_listen" in caplog.text


def test_the_keys_of_the_file_are_the_fields_of_the_classes(tmp_path: Path) -> None:
    """Unknown keys are computed from the attrs classes: every field is read (none listed as
    ignored), and the two that are not file keys (``path``, ``ignored_keys``) are unknown."""
    not_keys = ("path", "ignored_keys", "set_keys")
    tops = [f.name for f in attrs.fields(WorkerConfig) if f.name not in not_keys]
    assert set(file_fields(WorkerConfig)) == set(tops)
    devices = {f.name: None for f in attrs.fields(DeviceConfig)} | {"name": "g"}
    hooks = {f.name: None for f in attrs.fields(HooksConfig)}
    given = {k: None for k in tops} | {"controller_url": "http://c", "devices": [devices]}
    cfg = config_from_mapping({**given, "hooks": hooks}, hostname=lambda: "box")
    assert cfg.ignored_keys == ()
    cfg = config_from_mapping({**given, "path": "/x", "ignored_keys": ["y"]}, hostname=lambda: "h")
    assert cfg.ignored_keys == ("path", "ignored_keys")
    assert cfg.path == ""


def test_a_key_given_twice_is_an_error(tmp_path: Path) -> None:
    twice = "controller_url: http://a\ndevices: [g]\ncontroller_url: http://b\n"
    _refuses(tmp_path, twice, "controller_url", "lines 1 and 3")


def test_anchors_and_merge_keys(tmp_path: Path) -> None:
    cfg = _load(
        tmp_path,
        "controller_url: http://c\n"
        "x-common: &common {on_release: /r.sh, timeout: 7s}\n"
        "devices:\n  - {<<: *common, name: gpu0}\n  - {<<: *common, name: gpu1, timeout: 9s}\n",
    )
    assert [(d.on_release, d.timeout) for d in cfg.devices] == [
        ("/r.sh", 7 * SECOND),
        ("/r.sh", 9 * SECOND),
    ]
    assert cfg.ignored_keys == ("x-common",)


def test_only_the_first_document_is_read(tmp_path: Path) -> None:
    cfg = _load(tmp_path, BASE + "---\ncontroller_url: http://other\n")
    assert cfg.controller_url == "http://ctl:8080"


def test_yaml_syntax_error_is_one_line_naming_the_file(tmp_path: Path) -> None:
    err = _error(tmp_path, "controller_url: http://c\ndevices: [gpu0\n")
    assert err.key is None
    assert "invalid YAML at line" in str(err)
    err = _error(tmp_path, "a: b\n c: d: e\n")
    assert "line 2, column 3" in str(err)


def test_file_must_be_a_mapping(tmp_path: Path) -> None:
    err = _error(tmp_path, "- gpu0\n")
    assert "mapping" in str(err)


def test_unreadable_file(tmp_path: Path) -> None:
    missing = tmp_path / "absent.yaml"
    with pytest.raises(ConfigError) as info:
        load_worker_config(missing, environ={}, hostname=lambda: "h")
    assert str(info.value).startswith(f"{missing}: cannot read")


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "worker.yaml"
    path.write_bytes(b"controller_url: http://c\xff\n")
    with pytest.raises(ConfigError) as info:
        load_worker_config(path, environ={}, hostname=lambda: "h")
    assert str(path) in str(info.value)


# --- environment ------------------------------------------------------------------------------


def test_rc_token_used_when_file_has_none(tmp_path: Path) -> None:
    assert _load(tmp_path, BASE, {"RC_TOKEN": "  env-tok \n"}).token == "env-tok"
    assert _load(tmp_path, BASE + "token: ''\n", {"RC_TOKEN": "env-tok"}).token == "env-tok"


def test_file_token_beats_rc_token(tmp_path: Path) -> None:
    assert _load(tmp_path, BASE + "token: f\n", {"RC_TOKEN": "e"}).token == "f"


def test_blank_rc_token_is_unset(tmp_path: Path) -> None:
    assert _load(tmp_path, BASE, {"RC_TOKEN": " \t "}).token == ""


@pytest.mark.parametrize(
    ("file_value", "env_value", "expected"),
    [
        ("false", None, False),
        ("true", None, True),
        ("false", "true", True),
        ("false", "1", True),
        ("false", "T", True),
        ("false", " true ", True),
        ("true", "false", True),
        ("true", "0", True),
        ("false", "false", False),
        ("false", "F", False),
        ("false", "", False),
        ("false", "  ", False),
        ("false", "yes please", True),
        ("false", "yes", True),  # not Go's ParseBool set: non-boolean → true
    ],
)
def test_rc_require_manual_clear_is_or_ed_in(
    tmp_path: Path, file_value: str, env_value: str | None, expected: bool
) -> None:
    env = {} if env_value is None else {"RC_REQUIRE_MANUAL_CLEAR": env_value}
    cfg = _load(tmp_path, f"{BASE}require_manual_clear: {file_value}\n", env)
    assert cfg.require_manual_clear is expected


def test_non_boolean_rc_require_manual_clear_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="fleet_trio.worker.config")
    _load(tmp_path, BASE, {"RC_REQUIRE_MANUAL_CLEAR": "yes please"})
    assert any(
        r.levelno == logging.WARNING and "RC_REQUIRE_MANUAL_CLEAR" in r.getMessage()
        for r in caplog.records
    )


def test_poll_wait_above_controller_cap_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="fleet_trio.worker.config")
    cfg = _load(tmp_path, BASE + "poll_wait: 2m\n")
    assert cfg.poll_wait == 2 * MINUTE  # sent as written; the controller substitutes 30s
    assert "poll_wait 2m0s" in caplog.text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1", True),
        ("t", True),
        ("T", True),
        ("TRUE", True),
        ("true", True),
        ("True", True),
        ("0", False),
        ("f", False),
        ("F", False),
        ("FALSE", False),
        ("false", False),
        ("False", False),
        ("yes", None),
        ("tRUE", None),
        ("", None),
        (" true", None),
        ("2", None),
    ],
)
def test_parse_go_bool(text: str, expected: bool | None) -> None:
    assert parse_go_bool(text) is expected


# --- built in code ----------------------------------------------------------------------------


def test_config_built_in_code_resolves_defaults() -> None:
    cfg = WorkerConfig(
        controller_url="http://c/",
        host="h",
        devices=[DeviceConfig("gpu0", on_acquire="/a.sh"), DeviceConfig("gpu1", timeout=5)],
        heartbeat_interval=0,
        verify_dir="",
    )
    assert cfg.controller_url == "http://c"
    assert isinstance(cfg.devices, tuple)
    assert cfg.devices[0].timeout == 60 * SECOND
    assert cfg.devices[0].release_linger == 30 * SECOND
    assert cfg.devices[1].timeout == 5
    assert cfg.heartbeat_interval == 10 * SECOND
    assert cfg.verify_dir == "/etc/rc/verify.d"
    assert cfg.devices[0].has_hooks and not cfg.devices[1].has_hooks


def test_config_built_in_code_gets_a_host() -> None:
    assert WorkerConfig(controller_url="http://c").host != ""


def test_config_from_mapping_types_python_values_like_yaml() -> None:
    cfg = config_from_mapping(
        {
            "controller_url": "http://c",
            "devices": ["gpu0", {"name": "gpu1", "max_runtime": "2h", "labels": {"n": 3}}],
            "require_manual_clear": True,
        },
        path="/etc/rc/worker.yaml",
        environ={},
        hostname=lambda: "hb",
    )
    assert cfg.host == "hb"
    assert cfg.devices[1].max_runtime == 2 * HOUR
    assert cfg.devices[1].labels == {"n": "3"}
    assert cfg.require_manual_clear
    with pytest.raises(ConfigError) as info:
        config_from_mapping(
            {"controller_url": "http://c", "devices": ["g"], "poll_wait": 30},
            path="/etc/rc/worker.yaml",
            environ={},
            hostname=lambda: "hb",
        )
    assert str(info.value).startswith("/etc/rc/worker.yaml: poll_wait: ")


# --- summary ----------------------------------------------------------------------------------


def test_summary_redacts_the_token_and_renders_durations(tmp_path: Path) -> None:
    cfg = _load(
        tmp_path,
        "controller_url: http://c\ntoken: s3cret\ndevices:\n"
        "  - {name: gpu1, max_runtime: 4h, on_release: /r.sh}\n  - mydevice\n",
    )
    summary = cfg.to_summary()
    text = json.dumps(summary)
    assert "s3cret" not in text
    assert summary["token"] == REDACTED
    assert summary["heartbeat_interval"] == "10s"
    assert summary["verify_pass_budget"] == "2m0s"
    assert summary["hooks"] == {"timeout": "1m0s", "release_linger": "30s"}
    gpu1, mine = summary["devices"]
    assert gpu1["id"] == "gpubox:gpu1"
    assert gpu1["max_runtime"] == "4h0m0s"
    assert gpu1["on_release"] == "/r.sh" and gpu1["on_acquire"] is None
    assert gpu1["cuda_visible_devices"] == "1"
    assert mine["max_runtime"] is None and mine["cuda_visible_devices"] is None
    assert _load(tmp_path, BASE).to_summary()["token"] == ""


# --- CUDA_VISIBLE_DEVICES ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("device_id", "expected"),
    [
        ("gpubox:gpu1", "1"),
        ("gpubox:gpu01", "01"),
        ("gpubox:gpu12", "12"),
        ("gpubox:7", "7"),
        ("gpubox:mydevice", None),
        ("gpubox:", None),
        ("gpu1", None),
        ("a:b:gpu3", "3"),
        ("gpubox:gpu" + "9" * 30, None),
        ("gpubox:gpu٣", None),  # non-ASCII digit
    ],
)
def test_cuda_device_index(device_id: str, expected: str | None) -> None:
    assert cuda_device_index(device_id) == expected


# --- text that would reach a header, an id or an environment -------------------------------


@pytest.mark.parametrize(
    ("text", "key"),
    [
        # the short form's string is the name; a NUL is refused where it stands in the file
        ('controller_url: http://ctl:8080\ndevices: ["gpu\\0"]\n', "devices[0]"),
        ('controller_url: http://ctl:8080\ndevices: [{name: "a\\nb"}]\n', "devices[0].name"),
        (BASE + 'token: "ab\\0cd"\n', "token"),
        (BASE + 'token: "ab\\r\\nX-Injected: 1"\n', "token"),
        (BASE + 'tail_token: "t\\x7fu"\n', "tail_token"),
        (BASE + 'host: "h\\0x"\n', "host"),
        ('controller_url: "http://ctl:8080/\\n"\ndevices: [gpu0]\n', "controller_url"),
    ],
)
def test_a_control_character_in_a_name_or_a_token_is_refused(
    tmp_path: Path, text: str, key: str
) -> None:
    """A NUL or a newline in a token would reach an HTTP header (header injection, or a
    request that fails forever); in a host or device name, the device id, the controller's
    records and the hooks' environment. The file is refused, naming the key."""
    _refuses(tmp_path, text, key, "control character")


@pytest.mark.parametrize(
    ("key", "value"), [("token", "t\u00f6k\u00e9n"), ("tail_token", "x\u2028y")]
)
def test_a_token_outside_ascii_is_refused(tmp_path: Path, key: str, value: str) -> None:
    """HTTP header values travel as ASCII here: such a token could never be sent (the worker
    crashed on its first request) or never match."""
    _refuses(tmp_path, BASE + f'{key}: "{value}"\n', key, "must be ASCII (found U+")


def test_a_control_character_in_the_environment_token_is_refused(tmp_path: Path) -> None:
    err = _error(tmp_path, BASE, env={"RC_TOKEN": "ab\ncd"})
    assert "RC_TOKEN" in str(err)
    assert "control character" in str(err)


@pytest.mark.parametrize("key", ["[a, b]", "{x: 1}"])
def test_a_key_that_is_not_a_scalar_is_refused(tmp_path: Path, key: str) -> None:
    """yaml.v3 cannot decode a list or a mapping as a field name and refuses the file; the
    loader says so, with the line, instead of printing a parser node as an unknown key."""
    err = _error(tmp_path, BASE + f"? {key}\n: 1\n")
    assert "line 3" in str(err)
    assert "key must be" in str(err)
