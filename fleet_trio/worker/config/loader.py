"""Reading the ``fleet-trio worker`` configuration: the rc ``/etc/rc/worker.yaml``, unchanged.

(Over 500 lines: the yaml.v3 typing and the keyed loader are one unit, the typed tree is read
only here.)

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

Each key is structured by cattrs as its model field's type (``FILE_TYPE`` where the file spells
it differently); only ``devices`` and ``tail_allow_origins`` have a shape of their own. Errors
are :class:`ConfigError` naming the key (dotted, ``devices[1].max_runtime``) and the file.
"""

from __future__ import annotations

import logging
import os
import socket
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs
import cattrs
import httpx
import yaml
from cattrs.gen import make_dict_structure_fn, override

from fleet_trio.configfile import check_yaml_shape, read_config_bytes, text_problem
from fleet_trio.confighints import KeyedError as _KeyedError
from fleet_trio.confighints import structure as _structure
from fleet_trio.durations import SECOND, go_duration, parse_duration
from fleet_trio.errors import ConfigError, DurationError
from fleet_trio.inputs import first_control, printable, token_problem
from fleet_trio.memory import DEFAULT_BUDGET, check_budget, parse_size
from fleet_trio.proc.limits import check_cpu_weight, check_pids_max, parse_memory_max
from fleet_trio.worker.config.model import (
    CONTROLLER_MAX_POLL_WAIT,
    DEFAULT_CONFIG_PATH,
    DIR_KEYS,
    ENV_REQUIRE_MANUAL_CLEAR,
    ENV_TOKEN,
    FILE_TYPE,
    DeviceConfig,
    GoDuration,
    HooksConfig,
    Size,
    WorkerConfig,
    _safe_hostname,
    file_fields,
    parse_go_bool,
    tail_listen_problem,
)

log = logging.getLogger("fleet_trio.worker.config")
"""The package's name: what operators see in front of the config's warnings."""


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
        if (problem := text_problem(node.value)) is not None:
            raise _KeyedError(problem, where)
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
            line = key_node.start_mark.line + 1
            if not isinstance(key_node, yaml.ScalarNode):
                kind = "a list" if isinstance(key_node, yaml.SequenceNode) else "a mapping"
                raise _KeyedError(f"line {line}: a key must be a plain name, got {kind}", where)
            key = key_node.value
            if (problem := text_problem(key)) is not None:
                raise _KeyedError(problem, where)
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


def _structure_str(value: object, _: type) -> str:
    if value is None:
        return ""
    if isinstance(value, _Scalar):
        return value.text
    raise ValueError(f"expected a string, got {_describe(value)}")


def _structure_int(value: object, _: type) -> int:
    """A whole number written as one (fleet-trio's own keys: ``max_tails``)."""
    if isinstance(value, _Scalar) and value.kind == "int":
        digits = value.text.removeprefix("+")
        if digits.isascii() and digits.lstrip("-").isdigit():
            return int(digits)
    raise ValueError(f"expected a whole number, got {_describe(value)}")


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
    converter.register_structure_hook(int, _structure_int)
    converter.register_structure_hook(GoDuration, _structure_duration)
    converter.register_structure_hook(Size, lambda value, _: Size(_structure_str(value, str)))
    converter.register_structure_hook_func(lambda t: t == dict[str, str], _structure_labels)
    for cls in (HooksConfig, DeviceConfig):  # the mappings: each field as the file types it
        overrides: dict[str, Any] = {
            f.name: override(struct_hook=_as(converter, f.metadata[FILE_TYPE]))
            for f in attrs.fields(cls)
            if FILE_TYPE in f.metadata
        }
        hook: Any = make_dict_structure_fn(
            cls, converter, _cattrs_forbid_extra_keys=False, **overrides
        )
        converter.register_structure_hook(cls, hook)


def _as(converter: cattrs.Converter, file_type: Any) -> Callable[[object, Any], Any]:
    return lambda value, _: converter.structure(value, file_type)


def file_type(cls: type, name: str) -> Any:
    """The type key ``name`` of ``cls`` has in the file: its ``FILE_TYPE``, else the field's."""
    field = attrs.fields_dict(cls)[name]
    return field.metadata.get(FILE_TYPE) or typing.get_type_hints(cls)[name]


def make_converter() -> cattrs.Converter:
    converter = cattrs.Converter(forbid_extra_keys=False)
    register_hooks(converter)
    return converter


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


def _key_hint(key: str) -> str:
    """The closest known key at the same level, or where an exact name belongs instead."""
    from fleet_trio.confighints import did_you_mean

    where, _, leaf = key.rpartition(".")
    levels = {
        "": file_fields(WorkerConfig),
        "hooks": file_fields(HooksConfig),
        "devices[]": file_fields(DeviceConfig),
    }
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


def _mapping(
    converter: cattrs.Converter, raw: object, cls: type, key: str, ignored: list[str]
) -> Any:
    """A mapping read as ``cls``: its unknown keys go to ``ignored``, the others are
    structured."""
    if not isinstance(raw, dict):
        raise _KeyedError(f"expected a mapping, got {_describe(raw)}", key)
    fields = file_fields(cls)
    ignored.extend(_unknown(raw, fields, key))
    return _structure(converter, {k: v for k, v in raw.items() if k in fields}, cls, key)


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
            device = _mapping(converter, item, DeviceConfig, key, ignored)
        else:
            raise _KeyedError(
                f"expected a device name or a mapping with name:, got {_describe(item)}", key
            )
        _check_device(device, key)
        out.append(device)
    return tuple(out)


def _origins(raw: object) -> tuple[str, ...]:
    """``tail_allow_origins``: a list of ``scheme://host[:port]`` (docs/security.md)."""
    from fleet_trio.edge import OriginError, check_allowed_origin  # the tail listener's rule

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
    # fleet-trio's own limits (docs/containment.md, "Limits")
    checks: tuple[tuple[str, Callable[[Any], object]], ...] = (
        ("memory_max", parse_memory_max),
        ("pids_max", check_pids_max),
        ("cpu_weight", check_cpu_weight),
    )
    for name, check in checks:
        limit = getattr(device, name)
        if limit is not None and limit != "":
            try:
                check(limit)
            except ValueError as exc:
                raise _KeyedError(f"device {q}: {exc}", f"{key}.{name}") from None


def _refuse_controls(values: Mapping[str, Any], token: str, host: str) -> None:
    """Names and tokens reach HTTP headers, device ids, the controller's records and the
    hooks' environment: a NUL, a newline or another control character in one is refused
    (Go's HTTP client would refuse the header on every request instead)."""
    token_key = "token" if values.get("token", "").strip() else f"token (from ${ENV_TOKEN})"
    texts = [
        ("controller_url", values.get("controller_url", "")),
        (token_key, token),
        ("tail_token", values.get("tail_token", "")),
        ("host", host),
    ]
    texts += [(f"devices[{i}].name", d.name) for i, d in enumerate(values["devices"])]
    for key, text in texts:
        found = first_control(text)
        if found:
            raise _KeyedError(f"must not contain a control character (found {found})", key)
    for key, text in texts[1:3]:  # the tokens: sent in a header, compared with one
        if problem := token_problem(text):
            raise _KeyedError(problem, key)


def _rebased(value: str, base_dir: str, *, hook: bool = False) -> str:
    """``value`` joined to ``base_dir`` when relative; a hook without a ``/`` is left as it
    is (the worker looks it up on ``PATH``, as rc does)."""
    if not value or os.path.isabs(value) or (hook and "/" not in value):
        return value
    return os.path.join(base_dir, value)


def _rebase(values: dict[str, Any], base_dir: str) -> dict[str, Any]:
    """The directories and hook paths of ``values``, relative ones taken from ``base_dir``."""
    out = {k: _rebased(v, base_dir) if k in DIR_KEYS else v for k, v in values.items()}
    out["devices"] = tuple(
        attrs.evolve(
            d,
            on_acquire=_rebased(d.on_acquire, base_dir, hook=True),
            on_release=_rebased(d.on_release, base_dir, hook=True),
        )
        for d in values["devices"]
    )
    return out


def _build(
    data: object,
    *,
    path: str,
    environ: Mapping[str, str],
    hostname: Callable[[], str],
    base_dir: str | os.PathLike[str] | None = None,
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
    keys = file_fields(WorkerConfig)
    ignored = _unknown(data, keys, "")
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key not in keys:
            continue
        if key == "devices":
            values[key] = _devices(converter, value, ignored)
        elif key == "tail_allow_origins":
            values[key] = _origins(value)
        elif attrs.has(kind := file_type(WorkerConfig, key)):  # hooks:
            values[key] = _mapping(converter, {} if value is None else value, kind, key, ignored)
        elif kind is int and value is None:  # max_tails: (empty): the default, as yaml.v3
            continue
        else:
            values[key] = _structure(converter, value, kind, key)

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
    for key in ("max_tails", "max_tails_per_job"):
        if key in values and values[key] < 1:
            raise _KeyedError(f"must be >= 1, got {values[key]}", key)
    containment = values.get("containment", "auto").strip() or "auto"
    if containment not in ("auto", "cgroup", "marker"):
        raise _KeyedError(
            f"unknown containment {containment!r} (one of auto, cgroup, marker)", "containment"
        )
    values["containment"] = containment
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

    _refuse_controls(values, token, host)
    if problem := controller_url_problem(values["controller_url"]):
        raise _KeyedError(problem, "controller_url")
    for key in ignored:  # a typo must not pass silently (rc worker ignores them too)
        log.warning("%s: unknown key %s ignored%s", path or "config", key, _key_hint(key))
    names = [d.name for d in values["devices"]]
    for name in sorted({n for n in names if names.count(n) > 1}):
        log.warning("%s: device %r is declared more than once", path or "config", name)

    if base_dir is not None:
        values = _rebase(values, os.fspath(base_dir))
    cfg = WorkerConfig(
        **{**values, "token": token, "host": host, "require_manual_clear": require_manual_clear},
        path=path,
        ignored_keys=tuple(ignored),
        set_keys=tuple(k for k in data if k in keys),
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


URL_EXAMPLE = "e.g. http://controller:8080"


def controller_url_problem(url: str) -> str | None:
    """Why ``url`` cannot be the controller's base URL (``None``: it can), checked with the
    parser the worker's HTTP client uses: an absolute ``http`` or ``https`` URL with a host
    and a port in range, no user or password, no space, no query or fragment (the worker
    appends ``/v1/...``)."""
    shown = printable(url, limit=120)
    if any(c.isspace() for c in url):
        return f"must not contain a space: {shown!r} ({URL_EXAMPLE})"
    try:
        parsed = httpx.URL(url)
        port = parsed.port
    except (httpx.InvalidURL, ValueError, TypeError) as exc:
        return f"not a valid URL: {shown!r} ({printable(str(exc), limit=120)}; {URL_EXAMPLE})"
    if parsed.scheme not in ("http", "https"):
        return f"must start with http:// or https://, got {shown!r} ({URL_EXAMPLE})"
    if not parsed.host:
        return f"names no host: {shown!r} ({URL_EXAMPLE})"
    if parsed.userinfo:
        return (
            "must not hold a user or password (user@host): the worker authenticates with its "
            "token, and the HTTP client would send Basic credentials in its place"
        )
    if port is not None and not 1 <= port <= 65535:
        return f"port {port} out of range (1 to 65535): {shown!r}"
    if parsed.query or parsed.fragment or "?" in url or "#" in url:
        return (
            f"must not hold a query (?) or fragment (#): the worker appends /v1/... to it, "
            f"got {shown!r}"
        )
    return None


def config_from_mapping(
    data: object,
    *,
    path: str = "",
    environ: Mapping[str, str] = os.environ,
    hostname: Callable[[], str] = socket.gethostname,
    base_dir: str | os.PathLike[str] | None = None,
) -> WorkerConfig:
    """Build a :class:`WorkerConfig` from parsed YAML (or plain Python data).

    Plain Python scalars are typed as yaml.v3 would type their YAML spelling (``30`` is a
    number, so not a duration). ``base_dir``: as :func:`load_worker_config`'s. Raises
    :class:`ConfigError` naming the key and ``path``.
    """
    try:
        return _build(
            _from_python(data), path=path, environ=environ, hostname=hostname, base_dir=base_dir
        )
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
    base_dir: str | os.PathLike[str] | None = None,
) -> WorkerConfig:
    """Read and validate an rc ``worker.yaml``; apply ``RC_TOKEN`` / ``RC_REQUIRE_MANUAL_CLEAR``.

    Relative ``probe_dir`` / ``verify_dir`` / ``sheet_dir`` and hook paths are kept as
    written (the worker opens them from its working directory, as rc worker does) unless
    ``base_dir`` is given: then they are joined to it (a hook only when it holds a ``/``;
    a bare name is looked up on ``PATH``). The test harness passes the file's folder.

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
        return _build(tree, path=path, environ=environ, hostname=hostname, base_dir=base_dir)
    except _KeyedError as exc:
        raise ConfigError(str(exc), key=exc.key or None, path=path) from None


__all__ = [
    "config_from_mapping",
    "controller_url_problem",
    "file_type",
    "load_worker_config",
    "make_converter",
    "register_hooks",
]
