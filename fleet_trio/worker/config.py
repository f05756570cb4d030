"""The ``fleet-trio worker`` configuration: the rc ``/etc/rc/worker.yaml``, read unchanged.

Spec: worker-protocol.md §12 (keys, defaults, errors), §10.5 (``require_manual_clear`` /
``RC_REQUIRE_MANUAL_CLEAR``), §13; worker-process.md §4.1 (hooks), §4.3 (``CUDA_VISIBLE_DEVICES``).

The reference decodes the file with Go's yaml.v3 into typed fields, and this module reproduces
that typing rather than PyYAML's YAML 1.1 one:

* a string field takes the scalar's literal text (``host: 123`` is ``"123"``, a label
  ``tier: 3`` is ``"3"``, ``token: yes`` is ``"yes"``); ``~`` / empty is ``""``;
* a bool field takes ``true/True/TRUE/false/False/FALSE`` and the YAML 1.1 words
  ``y/yes/on/n/no/off`` (in their three spellings); anything else is an error;
* a duration field takes a Go duration string (``30s``, ``1m30s``, ``"0"`` quoted); an
  unquoted number (``30``, even ``0``) is an error, as it is for yaml.v3;
* unknown keys are ignored (yaml.v3 non-strict decoding), and listed in
  :attr:`WorkerConfig.ignored_keys`; a key given twice in one mapping is an error.

Durations are integer nanoseconds (``fleet_trio.durations``). Zero or negative means "the
default" for every duration except a device's ``max_runtime`` (zero = no ceiling, negative =
rejected). Defaults are applied when a config is *constructed*, so a config built in code gets
them too (a hook never runs without a timeout). Errors are :class:`ConfigError` naming the key
(dotted, ``devices[1].max_runtime``) and the file.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NewType

import attrs
import cattrs
import yaml
from cattrs.gen import make_dict_structure_fn, override

from fleet_trio.configfile import check_yaml_shape, read_config_bytes
from fleet_trio.durations import MINUTE, SECOND, go_duration, parse_duration
from fleet_trio.edge import is_loopback_host, split_host_port
from fleet_trio.errors import ConfigError, DurationError
from fleet_trio.memory import DEFAULT_BUDGET, check_budget, format_size, parse_size

log = logging.getLogger(__name__)

DEFAULT_CONFIG_PATH = "/etc/rc/worker.yaml"

DEFAULT_HEARTBEAT_INTERVAL = 10 * SECOND
DEFAULT_POLL_WAIT = 30 * SECOND
CONTROLLER_MAX_POLL_WAIT = 1 * MINUTE
"""The controller answers a longer ``?wait=`` with its own 30 s default (§13, §17.14)."""
DEFAULT_HOOK_TIMEOUT = 60 * SECOND
DEFAULT_RELEASE_LINGER = 30 * SECOND
DEFAULT_PROBE_DIR = "/etc/rc/probe.d"
DEFAULT_PROBE_INTERVAL = 5 * MINUTE
DEFAULT_PROBE_TIMEOUT = 5 * SECOND
DEFAULT_VERIFY_DIR = "/etc/rc/verify.d"
DEFAULT_VERIFY_TIMEOUT = 30 * SECOND
DEFAULT_VERIFY_PASS_BUDGET = 2 * MINUTE
DEFAULT_SHEET_DIR = "/etc/rc"

ENV_TOKEN = "RC_TOKEN"
ENV_REQUIRE_MANUAL_CLEAR = "RC_REQUIRE_MANUAL_CLEAR"

REDACTED = "(redacted)"

GoDuration = NewType("GoDuration", int)
"""Integer nanoseconds, written in YAML as a Go duration string (top-level keys)."""


# --------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------


def _fill_defaults(obj: object, defaults: Mapping[str, object]) -> None:
    """Replace a zero/negative duration or an empty string by its default (frozen-safe)."""
    for name, default in defaults.items():
        value = getattr(obj, name)
        if (isinstance(value, str) and not value) or (isinstance(value, int) and value <= 0):
            object.__setattr__(obj, name, default)


@attrs.frozen
class HooksConfig:
    """Host-level hook defaults (``hooks:``). Zero or negative means the built-in default."""

    timeout: int = DEFAULT_HOOK_TIMEOUT
    """Per-hook timeout, ns (default 60 s)."""
    release_linger: int = DEFAULT_RELEASE_LINGER
    """How long a device stays held after a job before ``on_release`` runs, ns (30 s)."""

    def __attrs_post_init__(self) -> None:
        _fill_defaults(
            self, {"timeout": DEFAULT_HOOK_TIMEOUT, "release_linger": DEFAULT_RELEASE_LINGER}
        )


@attrs.frozen
class DeviceConfig:
    """One device this host offers: ``- gpu0`` or a mapping with ``name:``.

    ``timeout`` / ``release_linger`` of 0 mean "not overridden"; :class:`WorkerConfig`
    resolves them to the host ``hooks:`` values when it is constructed.
    """

    name: str = ""
    max_runtime: int = 0
    """Runtime ceiling, ns; 0 = none. Registered as whole seconds (truncated)."""
    on_acquire: str = ""
    on_release: str = ""
    timeout: int = 0
    """Per-device hook timeout, ns; 0 = the host ``hooks.timeout``."""
    release_linger: int = 0
    """Per-device linger, ns; 0 = the host ``hooks.release_linger``."""
    labels: dict[str, str] = attrs.Factory(dict)
    """Declared labels, sent as this device's ``declared_labels``."""

    def __attrs_post_init__(self) -> None:
        for name in ("timeout", "release_linger"):
            if getattr(self, name) < 0:
                object.__setattr__(self, name, 0)

    @property
    def max_runtime_seconds(self) -> int:
        """The ceiling as registered: whole seconds, truncated; 0 = none."""
        return max(self.max_runtime, 0) // SECOND

    @property
    def has_hooks(self) -> bool:
        """A device with neither hook gets no hook state at all (worker-process.md §4.1)."""
        return bool(self.on_acquire or self.on_release)


def _strip_trailing_slash(url: str) -> str:
    """The reference concatenates ``controller_url`` + path verbatim; ``/`` at the end would
    give ``//v1/...`` (worker-protocol.md §1.2, §17.15), so it is dropped."""
    return url.rstrip("/") if url.strip("/") else url


def _to_devices(devices: Iterable[DeviceConfig]) -> tuple[DeviceConfig, ...]:
    return tuple(devices)


@attrs.frozen
class WorkerConfig:
    """The resolved worker settings. Every default is applied at construction."""

    controller_url: str = attrs.field(default="", converter=_strip_trailing_slash)
    token: str = ""
    host: str = ""
    """Empty: the machine's host name, resolved at construction."""
    devices: tuple[DeviceConfig, ...] = attrs.field(default=(), converter=_to_devices)
    heartbeat_interval: int = DEFAULT_HEARTBEAT_INTERVAL
    poll_wait: int = DEFAULT_POLL_WAIT
    hooks: HooksConfig = attrs.Factory(HooksConfig)
    probe_dir: str = DEFAULT_PROBE_DIR
    probe_interval: int = DEFAULT_PROBE_INTERVAL
    probe_timeout: int = DEFAULT_PROBE_TIMEOUT
    verify_dir: str = DEFAULT_VERIFY_DIR
    verify_timeout: int = DEFAULT_VERIFY_TIMEOUT
    verify_pass_budget: int = DEFAULT_VERIFY_PASS_BUDGET
    sheet_dir: str = DEFAULT_SHEET_DIR
    require_manual_clear: bool = False
    tail_listen: str = ""
    """fleet-trio only: ``HOST:PORT`` of the live log tail websocket; empty = off."""
    tail_token: str = ""
    """fleet-trio only: bearer token the tail listener requires; empty = none."""
    tail_allow_origins: tuple[str, ...] = ()
    """fleet-trio only: browser origins the tail listener serves besides its own
    (``scheme://host[:port]``, docs/security.md)."""
    memory_budget: int = DEFAULT_BUDGET
    """fleet-trio only: bytes of job log history kept across jobs (``fleet_trio.memory``)."""
    path: str = ""
    """The file it came from ("" when built in code)."""
    ignored_keys: tuple[str, ...] = ()
    """Keys in the file the worker does not read (dotted), in file order."""

    def __attrs_post_init__(self) -> None:
        _fill_defaults(
            self,
            {
                "heartbeat_interval": DEFAULT_HEARTBEAT_INTERVAL,
                "poll_wait": DEFAULT_POLL_WAIT,
                "probe_dir": DEFAULT_PROBE_DIR,
                "probe_interval": DEFAULT_PROBE_INTERVAL,
                "probe_timeout": DEFAULT_PROBE_TIMEOUT,
                "verify_dir": DEFAULT_VERIFY_DIR,
                "verify_timeout": DEFAULT_VERIFY_TIMEOUT,
                "verify_pass_budget": DEFAULT_VERIFY_PASS_BUDGET,
                "sheet_dir": DEFAULT_SHEET_DIR,
            },
        )
        if not self.host:
            object.__setattr__(self, "host", _safe_hostname(socket.gethostname))
        resolved = tuple(
            attrs.evolve(
                d,
                timeout=d.timeout if d.timeout > 0 else self.hooks.timeout,
                release_linger=d.release_linger
                if d.release_linger > 0
                else self.hooks.release_linger,
            )
            for d in self.devices
        )
        object.__setattr__(self, "devices", resolved)

    def device_id(self, name: str) -> str:
        """The controller's id for a device of this host: ``host:name``."""
        return f"{self.host}:{name}"

    @property
    def device_ids(self) -> tuple[str, ...]:
        return tuple(self.device_id(d.name) for d in self.devices)

    def device_by_id(self, device_id: str) -> DeviceConfig | None:
        """The configured device with this full id, or ``None`` (not declared here)."""
        for d in self.devices:
            if self.device_id(d.name) == device_id:
                return d
        return None

    def to_summary(self) -> dict[str, Any]:
        """The resolved settings as plain JSON-able data (``fleet-trio worker --check``).

        Durations are rendered as Go renders them (``30s``, ``2m0s``); the token is redacted.
        """
        return {
            "path": self.path,
            "controller_url": self.controller_url,
            "token": REDACTED if self.token else "",
            "host": self.host,
            "devices": [
                {
                    "id": self.device_id(d.name),
                    "name": d.name,
                    "max_runtime": go_duration(d.max_runtime) if d.max_runtime else None,
                    "on_acquire": d.on_acquire or None,
                    "on_release": d.on_release or None,
                    "timeout": go_duration(d.timeout),
                    "release_linger": go_duration(d.release_linger),
                    "labels": dict(d.labels),
                    "cuda_visible_devices": cuda_device_index(self.device_id(d.name)),
                }
                for d in self.devices
            ],
            "heartbeat_interval": go_duration(self.heartbeat_interval),
            "poll_wait": go_duration(self.poll_wait),
            "hooks": {
                "timeout": go_duration(self.hooks.timeout),
                "release_linger": go_duration(self.hooks.release_linger),
            },
            "probe_dir": self.probe_dir,
            "probe_interval": go_duration(self.probe_interval),
            "probe_timeout": go_duration(self.probe_timeout),
            "verify_dir": self.verify_dir,
            "verify_timeout": go_duration(self.verify_timeout),
            "verify_pass_budget": go_duration(self.verify_pass_budget),
            "sheet_dir": self.sheet_dir,
            "require_manual_clear": self.require_manual_clear,
            "tail_listen": self.tail_listen or None,
            "tail_token": REDACTED if self.tail_token else "",
            "tail_allow_origins": list(self.tail_allow_origins),
            "memory_budget": format_size(self.memory_budget),
            "ignored_keys": list(self.ignored_keys),
        }


# --------------------------------------------------------------------------------------------
# Small pure helpers
# --------------------------------------------------------------------------------------------

_GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_GO_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})
_MAX_INT64 = (1 << 63) - 1


def parse_go_bool(text: str) -> bool | None:
    """Go's ``strconv.ParseBool``: the value, or ``None`` for anything it rejects."""
    if text in _GO_TRUE:
        return True
    if text in _GO_FALSE:
        return False
    return None


def cuda_device_index(device_id: str) -> str | None:
    """``CUDA_VISIBLE_DEVICES`` for a device id (worker-process.md §4.3).

    The name after the first ``:`` must be non-empty; its trailing ASCII digits are used
    verbatim (``gpubox:gpu1`` → ``1``, ``gpu01`` → ``01``); no digits, or a number that does not
    fit an int64, → ``None`` (leave the variable unset).
    """
    _, sep, name = device_id.partition(":")
    if not sep or not name:
        return None
    i = len(name)
    while i > 0 and "0" <= name[i - 1] <= "9":
        i -= 1
    digits = name[i:]
    if not digits or int(digits) > _MAX_INT64:
        return None
    return digits


def hook_env(event: str, device_id: str, job_id: str, submitter: str) -> dict[str, str]:
    """§4.3: ``RC_EVENT``, ``RC_DEVICE``, ``RC_JOB_ID``, ``RC_SUBMITTER`` (set, possibly empty)
    and the derived ``CUDA_VISIBLE_DEVICES`` on top of the worker's environment. Hooks do not
    get the job's own env; job id and submitter are only ever environment values."""
    env = {
        "RC_EVENT": event,
        "RC_DEVICE": device_id,
        "RC_JOB_ID": job_id,
        "RC_SUBMITTER": submitter,
    }
    index = cuda_device_index(device_id)
    if index is not None:
        env["CUDA_VISIBLE_DEVICES"] = index
    return env


def tail_listen_problem(addr: str) -> str | None:
    """Why ``addr`` is not a usable ``HOST:PORT`` for ``tail_listen``, or ``None``."""
    try:
        _host, port = split_host_port(addr)
    except ValueError as exc:
        return f"expected HOST:PORT (e.g. 127.0.0.1:18812), got {addr!r}: {exc}"
    if not port.isascii() or not port.isdigit() or int(port) > 65535:
        return f"expected HOST:PORT with a port from 0 to 65535, got {addr!r}"
    return None


def check_tail_listen(cfg: WorkerConfig, trusted_network: bool) -> None:
    """The listen guard for ``tail_listen`` (the node's ``--listen`` rule): a non-loopback
    address needs ``--listen-trusted-network``. Raises :class:`ConfigError` naming the key."""
    addr = cfg.tail_listen
    if not addr or trusted_network:
        return
    problem = tail_listen_problem(addr)
    if problem:
        raise ConfigError(problem, key="tail_listen", path=cfg.path or None)
    host, _port = split_host_port(addr)
    if not is_loopback_host(host):
        raise ConfigError(
            f"refusing to bind {addr!r}: use a loopback address (127.0.0.1, ::1, localhost) "
            "or start the worker with --listen-trusted-network to bind a trusted network "
            "such as a tailnet address",
            key="tail_listen",
            path=cfg.path or None,
        )


def _safe_hostname(hostname: Callable[[], str]) -> str:
    try:
        return (hostname() or "").strip()
    except Exception:
        return ""


# --------------------------------------------------------------------------------------------
# YAML, typed the way yaml.v3 types it
# --------------------------------------------------------------------------------------------

_TAG = "tag:yaml.org,2002:"
_NULLS = frozenset({"", "~", "null", "Null", "NULL"})
_BOOLS = {
    **dict.fromkeys(("true", "True", "TRUE"), True),
    **dict.fromkeys(("false", "False", "FALSE"), False),
}
_YAML11_BOOLS = {
    **dict.fromkeys(("y", "Y", "yes", "Yes", "YES", "on", "On", "ON"), True),
    **dict.fromkeys(("n", "N", "no", "No", "NO", "off", "Off", "OFF"), False),
}


@attrs.frozen
class _Scalar:
    """A YAML scalar as yaml.v3 sees it: its literal text and its resolved kind."""

    text: str
    kind: str = "str"
    """``str``, ``int``, ``float`` or ``bool``."""


class _KeyedError(ValueError):
    def __init__(self, message: str, key: str) -> None:
        super().__init__(message)
        self.key = key


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _scalar_kind(node: yaml.ScalarNode) -> str | None:
    """YAML 1.2 core typing of a scalar node; ``None`` for null."""
    if node.style:  # quoted, literal or folded: always a string
        return "str"
    tag = node.tag.removeprefix(_TAG)
    if tag == "null":
        return None if node.value in _NULLS else "str"
    if tag == "bool":
        return "bool" if node.value in _BOOLS else "str"
    if tag in ("int", "float"):
        return tag
    return "str"  # str, timestamp, binary, ...: the literal text


def _from_node(node: yaml.Node, where: str, seen: tuple[int, ...] = ()) -> object:
    """Compose tree → dicts, lists, :class:`_Scalar` and ``None``."""
    if id(node) in seen:
        raise _KeyedError("recursive alias", where)
    seen = (*seen, id(node))
    if isinstance(node, yaml.ScalarNode):
        kind = _scalar_kind(node)
        return None if kind is None else _Scalar(node.value, kind)
    if isinstance(node, yaml.SequenceNode):
        return [_from_node(n, f"{where}[{i}]", seen) for i, n in enumerate(node.value)]
    if isinstance(node, yaml.MappingNode):
        merged: dict[str, object] = {}
        explicit: dict[str, object] = {}
        lines: dict[str, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _TAG + "merge":
                sources = (
                    value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
                )
                for src in sources:
                    data = _from_node(src, where, seen)
                    if not isinstance(data, dict):
                        raise _KeyedError("a merge key (<<) needs a mapping", where or "<<")
                    for k, v in data.items():
                        merged.setdefault(k, v)
                continue
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else str(key_node)
            line = key_node.start_mark.line + 1
            if key in explicit:
                raise _KeyedError(
                    f"key defined twice (lines {lines[key]} and {line})", _join(where, key)
                )
            lines[key] = line
            explicit[key] = _from_node(value_node, _join(where, key), seen)
        return {**merged, **explicit}
    raise _KeyedError(f"unsupported YAML node {node!r}", where)  # pragma: no cover


def _from_python(value: object) -> object:
    """Plain Python data (a dict built in code, or ``yaml.safe_load`` output) → the same
    shape as :func:`_from_node` produces."""
    if value is None or isinstance(value, _Scalar):
        return value
    if isinstance(value, bool):
        return _Scalar("true" if value else "false", "bool")
    if isinstance(value, int):
        return _Scalar(str(value), "int")
    if isinstance(value, float):
        return _Scalar(repr(value), "float")
    if isinstance(value, str):
        return _Scalar(value)
    if isinstance(value, Mapping):
        return {str(k): _from_python(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_from_python(v) for v in value]
    return _Scalar(str(value))


def _describe(value: object) -> str:
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, _Scalar):
        return repr(value.text)
    return repr(value)


# --------------------------------------------------------------------------------------------
# The converter
# --------------------------------------------------------------------------------------------

_DURATION_FIELDS: dict[type, tuple[str, ...]] = {
    HooksConfig: ("timeout", "release_linger"),
    DeviceConfig: ("max_runtime", "timeout", "release_linger"),
}


def _structure_str(value: object, _: type) -> str:
    if value is None:
        return ""
    if isinstance(value, _Scalar):
        return value.text
    raise ValueError(f"expected a string, got {_describe(value)}")


def _structure_bool(value: object, _: type) -> bool:
    if value is None:
        return False
    if isinstance(value, _Scalar):
        if value.kind == "bool":
            return _BOOLS[value.text]
        if value.kind == "str" and value.text in _YAML11_BOOLS:
            return _YAML11_BOOLS[value.text]
    raise ValueError(f"expected true or false, got {_describe(value)}")


def _structure_duration(value: object, _: type) -> GoDuration:
    if value is None:
        return GoDuration(0)
    if isinstance(value, _Scalar) and value.kind in ("int", "float"):
        raise ValueError(
            f"{value.text} has no unit: write a Go duration such as {value.text}s, 500ms "
            'or 1m30s (a quoted "0" is accepted)'
        )
    if not isinstance(value, _Scalar) or value.kind != "str":
        raise ValueError(f"expected a Go duration such as 30s or 1m30s, got {_describe(value)}")
    try:
        return GoDuration(parse_duration(value.text))
    except DurationError as exc:
        raise ValueError(str(exc)) from None


def _structure_labels(value: object, _: type) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"expected a mapping of label: value, got {_describe(value)}")
    out: dict[str, str] = {}
    for k, v in value.items():
        try:
            out[str(k)] = _structure_str(v, str)
        except ValueError as exc:
            raise ValueError(f"label {k!r}: {exc}") from None
    return out


def register_hooks(converter: cattrs.Converter) -> None:
    """yaml.v3 typing for the worker config: literal-text strings, Go bools and durations."""
    converter.register_structure_hook(str, _structure_str)
    converter.register_structure_hook(bool, _structure_bool)
    converter.register_structure_hook(GoDuration, _structure_duration)
    converter.register_structure_hook_func(lambda t: t == dict[str, str], _structure_labels)
    for cls, names in _DURATION_FIELDS.items():
        overrides: dict[str, Any] = {
            name: override(struct_hook=_structure_duration) for name in names
        }
        hook: Any = make_dict_structure_fn(
            cls, converter, _cattrs_forbid_extra_keys=False, **overrides
        )
        converter.register_structure_hook(cls, hook)


def make_converter() -> cattrs.Converter:
    converter = cattrs.Converter(forbid_extra_keys=False)
    register_hooks(converter)
    return converter


def _format_exception(exc: BaseException, type_: type | None) -> str:
    if isinstance(exc, ValueError) and str(exc):
        return str(exc)
    return cattrs.v.format_exception(exc, type_)


def _structure(converter: cattrs.Converter, value: object, cls: Any, key: str) -> Any:
    """``converter.structure`` with the first error turned into a keyed one."""
    try:
        return converter.structure(value, cls)
    except (cattrs.BaseValidationError, ValueError, TypeError) as exc:
        try:
            messages = cattrs.transform_error(exc, path="$", format_exception=_format_exception)
        except Exception:  # pragma: no cover - defensive
            messages = []
        if not messages:
            raise _KeyedError(str(exc), key) from None
        message, _, where = messages[0].rpartition(" @ ")
        if not message:
            message, where = messages[0], "$"
        sub = where.removeprefix("$").lstrip(".").replace("['", ".").replace("']", "")
        raise _KeyedError(message, ".".join(p for p in (key, sub.lstrip(".")) if p)) from None


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------

_TOP_KEYS: dict[str, Any] = {
    "controller_url": str,
    "token": str,
    "host": str,
    "devices": None,  # handled by _devices
    "heartbeat_interval": GoDuration,
    "poll_wait": GoDuration,
    "hooks": HooksConfig,
    "probe_dir": str,
    "probe_interval": GoDuration,
    "probe_timeout": GoDuration,
    "verify_dir": str,
    "verify_timeout": GoDuration,
    "verify_pass_budget": GoDuration,
    "sheet_dir": str,
    "require_manual_clear": bool,
    # fleet-trio only (unknown to the Go worker, which ignores them)
    "tail_listen": str,
    "tail_token": str,
    "tail_allow_origins": None,  # handled by _origins
    "memory_budget": str,
}
_HOOKS_KEYS = frozenset(f.name for f in attrs.fields(HooksConfig))
_DEVICE_KEYS = frozenset(f.name for f in attrs.fields(DeviceConfig))


def _key_hint(key: str) -> str:
    """The closest known key at the same level, or where an exact name belongs instead."""
    from fleet_trio.confighints import did_you_mean

    where, _, leaf = key.rpartition(".")
    levels = {"": _TOP_KEYS, "hooks": _HOOKS_KEYS, "devices[]": _DEVICE_KEYS}
    level = "devices[]" if where.startswith("devices[") else where
    hint = did_you_mean(leaf, levels.get(level, ()))
    if hint:
        return hint
    for other, known in levels.items():
        if other != level and leaf in known:
            return f" ({leaf} is a key of {other + ':' if other else 'the top level'})"
    return ""


def _unknown(data: Mapping[str, object], known: Iterable[str], where: str) -> list[str]:
    known = set(known)
    return [_join(where, k) for k in data if k not in known]


def _devices(
    converter: cattrs.Converter, raw: object, ignored: list[str]
) -> tuple[DeviceConfig, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise _KeyedError(
            f"expected a list of devices (bare names or mappings with name:), got {_describe(raw)}",
            "devices",
        )
    out: list[DeviceConfig] = []
    for i, item in enumerate(raw):
        key = f"devices[{i}]"
        if item is None:
            device = DeviceConfig()
        elif isinstance(item, _Scalar):
            device = DeviceConfig(name=item.text)
        elif isinstance(item, dict):
            ignored.extend(_unknown(item, _DEVICE_KEYS, key))
            known = {k: v for k, v in item.items() if k in _DEVICE_KEYS}
            device = _structure(converter, known, DeviceConfig, key)
        else:
            raise _KeyedError(
                f"expected a device name or a mapping with name:, got {_describe(item)}", key
            )
        _check_device(device, key)
        out.append(device)
    return tuple(out)


def _origins(raw: object) -> tuple[str, ...]:
    """``tail_allow_origins``: a list of ``scheme://host[:port]`` (docs/security.md)."""
    from fleet_trio.edge import OriginError, check_allowed_origin

    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise _KeyedError(f"expected a list of origins, got {_describe(raw)}", "tail_allow_origins")
    out: list[str] = []
    for i, item in enumerate(raw):
        key = f"tail_allow_origins[{i}]"
        if not isinstance(item, _Scalar) or item.kind != "str":
            raise _KeyedError(f"expected an origin string, got {_describe(item)}", key)
        try:
            check_allowed_origin(item.text)
        except OriginError as exc:
            raise _KeyedError(str(exc), key) from None
        out.append(item.text)
    return tuple(out)


def _check_device(device: DeviceConfig, key: str) -> None:
    if not device.name:
        raise _KeyedError("device entry needs a name", f"{key}.name")
    q = '"' + device.name.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if 0 < device.max_runtime < SECOND:
        raise _KeyedError(
            f"device {q}: max_runtime {go_duration(device.max_runtime)} is below the "
            "one-second granularity runtime ceilings are enforced at",
            f"{key}.max_runtime",
        )
    if device.max_runtime < 0:
        raise _KeyedError(
            f"device {q}: max_runtime {go_duration(device.max_runtime)} must not be negative "
            "(leave it out, or 0, for no ceiling)",
            f"{key}.max_runtime",
        )
    for hook in ("on_acquire", "on_release"):
        value: str = getattr(device, hook)
        if value and not value.strip():
            raise _KeyedError(f"device {q}: {hook} must not be blank", f"{key}.{hook}")


def _build(
    data: object,
    *,
    path: str,
    environ: Mapping[str, str],
    hostname: Callable[[], str],
) -> WorkerConfig:
    converter = make_converter()
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise _KeyedError(
            f"the file must hold a mapping of settings (controller_url:, devices:, ...), got "
            f"{_describe(data)}",
            "",
        )
    ignored = _unknown(data, _TOP_KEYS, "")
    values: dict[str, Any] = {}
    for key, value in data.items():
        cls = _TOP_KEYS.get(key)
        if key == "devices":
            values[key] = _devices(converter, value, ignored)
        elif key == "tail_allow_origins":
            values[key] = _origins(value)
        elif cls is HooksConfig:
            if value is None:
                value = {}
            if not isinstance(value, dict):
                raise _KeyedError(f"expected a mapping, got {_describe(value)}", key)
            ignored.extend(_unknown(value, _HOOKS_KEYS, key))
            known = {k: v for k, v in value.items() if k in _HOOKS_KEYS}
            values[key] = _structure(converter, known, HooksConfig, key)
        elif cls is not None:
            values[key] = _structure(converter, value, cls, key)

    if not values.get("controller_url", "").strip():
        raise _KeyedError(
            "required: the rc controller's base URL, e.g. http://controller:8080",
            "controller_url",
        )
    if not values.get("devices"):
        raise _KeyedError("at least one device required", "devices")

    token = values.get("token", "").strip()
    if not token:
        token = environ.get(ENV_TOKEN, "").strip()
        if token:
            log.debug("worker token taken from $%s", ENV_TOKEN)

    require_manual_clear = bool(values.get("require_manual_clear", False))
    env_text = environ.get(ENV_REQUIRE_MANUAL_CLEAR, "")
    if env_text.strip():
        parsed = parse_go_bool(env_text.strip())
        if parsed is None:
            log.warning(
                "%s=%r is not a boolean; treating it as true (it can only make the worker "
                "more cautious)",
                ENV_REQUIRE_MANUAL_CLEAR,
                env_text,
            )
            parsed = True
        if parsed and not require_manual_clear:
            log.info("require_manual_clear turned on by $%s", ENV_REQUIRE_MANUAL_CLEAR)
        require_manual_clear = require_manual_clear or parsed

    tail_listen = values.get("tail_listen", "").strip()
    if tail_listen:
        problem = tail_listen_problem(tail_listen)
        if problem:
            raise _KeyedError(problem, "tail_listen")
    values["tail_listen"] = tail_listen
    values["tail_token"] = values.get("tail_token", "").strip()
    budget = values.get("memory_budget", "").strip()
    try:
        values["memory_budget"] = check_budget(parse_size(budget)) if budget else DEFAULT_BUDGET
    except ValueError as exc:
        raise _KeyedError(str(exc), "memory_budget") from None

    host = values.get("host", "")
    if not host:
        host = _safe_hostname(hostname)
        if not host:
            raise _KeyedError(
                "not set, and the machine's host name could not be determined", "host"
            )

    for key in ignored:  # a typo must not pass silently (rc worker ignores them too)
        log.warning("%s: unknown key %s ignored%s", path or "config", key, _key_hint(key))
    names = [d.name for d in values["devices"]]
    for name in sorted({n for n in names if names.count(n) > 1}):
        log.warning("%s: device %r is declared more than once", path or "config", name)

    cfg = WorkerConfig(
        **{**values, "token": token, "host": host, "require_manual_clear": require_manual_clear},
        path=path,
        ignored_keys=tuple(ignored),
    )
    if cfg.poll_wait > CONTROLLER_MAX_POLL_WAIT:
        log.warning(
            "%s: poll_wait %s is above the controller's %s cap; the controller will answer "
            "with its 30s default instead",
            path or "config",
            go_duration(cfg.poll_wait),
            go_duration(CONTROLLER_MAX_POLL_WAIT),
        )
    return cfg


def config_from_mapping(
    data: object,
    *,
    path: str = "",
    environ: Mapping[str, str] = os.environ,
    hostname: Callable[[], str] = socket.gethostname,
) -> WorkerConfig:
    """Build a :class:`WorkerConfig` from parsed YAML (or plain Python data).

    Plain Python scalars are typed as yaml.v3 would type their YAML spelling (``30`` is a
    number, so not a duration). Raises :class:`ConfigError` naming the key and ``path``.
    """
    try:
        return _build(_from_python(data), path=path, environ=environ, hostname=hostname)
    except _KeyedError as exc:
        raise ConfigError(str(exc), key=exc.key or None, path=path or None) from None


def _yaml_error_text(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "syntax error"
        text = f"invalid YAML: {problem}"
        if mark is not None:
            text = f"invalid YAML at line {mark.line + 1}, column {mark.column + 1}: {problem}"
    else:
        text = f"invalid YAML: {exc}"
    return " ".join(text.split())


def load_worker_config(
    path: str | os.PathLike[str] = DEFAULT_CONFIG_PATH,
    *,
    environ: Mapping[str, str] = os.environ,
    hostname: Callable[[], str] = socket.gethostname,
) -> WorkerConfig:
    """Read and validate an rc ``worker.yaml``; apply ``RC_TOKEN`` / ``RC_REQUIRE_MANUAL_CLEAR``.

    Raises :class:`ConfigError` (one line) naming the key and the file.
    """
    path = os.fspath(path)
    raw = read_config_bytes(path)  # a regular file, at most 1 MiB (fleet_trio.configfile)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text (byte {exc.start})", path=path) from None
    try:
        # yaml.v3's Unmarshal reads the first document and ignores any later one.
        check_yaml_shape(text, path=path)  # nesting and alias expansion, before any tree
        node = next(iter(yaml.compose_all(text, Loader=yaml.SafeLoader)), None)
    except yaml.YAMLError as exc:
        raise ConfigError(_yaml_error_text(exc), path=path) from None
    except RecursionError:  # pragma: no cover - bounded by check_yaml_shape
        raise ConfigError("invalid YAML: nested too deep", path=path) from None
    try:
        tree = None if node is None else _from_node(node, "")
        return _build(tree, path=path, environ=environ, hostname=hostname)
    except _KeyedError as exc:
        raise ConfigError(str(exc), key=exc.key or None, path=path) from None


__all__ = [
    "CONTROLLER_MAX_POLL_WAIT",
    "DEFAULT_CONFIG_PATH",
    "DEFAULT_HEARTBEAT_INTERVAL",
    "DEFAULT_HOOK_TIMEOUT",
    "DEFAULT_POLL_WAIT",
    "DEFAULT_PROBE_DIR",
    "DEFAULT_PROBE_INTERVAL",
    "DEFAULT_PROBE_TIMEOUT",
    "DEFAULT_RELEASE_LINGER",
    "DEFAULT_SHEET_DIR",
    "DEFAULT_VERIFY_DIR",
    "DEFAULT_VERIFY_PASS_BUDGET",
    "DEFAULT_VERIFY_TIMEOUT",
    "ENV_REQUIRE_MANUAL_CLEAR",
    "ENV_TOKEN",
    "REDACTED",
    "DeviceConfig",
    "GoDuration",
    "HooksConfig",
    "WorkerConfig",
    "check_tail_listen",
    "config_from_mapping",
    "cuda_device_index",
    "hook_env",
    "load_worker_config",
    "make_converter",
    "parse_go_bool",
    "register_hooks",
    "tail_listen_problem",
]
