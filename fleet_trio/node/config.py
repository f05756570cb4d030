"""Node configuration (node.md §6.6, §7): the YAML file, identity and the listen guard.

(Over 500 lines: the typed config, its cattrs hooks and its checks are one edge; every error names
the key and the file the same way.)

The YAML has two top-level keys, ``node:`` and ``tasks:``. Every timing is a Go duration
(``500ms``, ``30s``, ``1h``). Errors are :class:`~fleet_trio.errors.ConfigError` naming the
key and the file. One cattrs converter for this edge, configured by :func:`register_hooks`.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable, Mapping
from typing import Any, NewType

import attrs
import cattrs
import yaml

from fleet_trio.configfile import check_yaml_shape, find_bad_value, read_config_bytes
from fleet_trio.confighints import KeyedError as _KeyedError
from fleet_trio.confighints import did_you_mean
from fleet_trio.confighints import structure as _structure
from fleet_trio.durations import parse_duration_seconds
from fleet_trio.edge import is_loopback_host, split_host_port
from fleet_trio.errors import ConfigError, DurationError
from fleet_trio.inputs import first_control, id_problem, printable
from fleet_trio.logbus.fanout import DEFAULT_MAX_TAILS, DEFAULT_MAX_TAILS_PER_JOB
from fleet_trio.memory import DEFAULT_BUDGET, check_budget, parse_size
from fleet_trio.node.wire import go_quote
from fleet_trio.proc.limits import JobLimits, check_cpu_weight, check_pids_max, parse_memory_max

DEFAULT_LISTEN = "127.0.0.1:18811"
FALLBACK_NODE_ID = "fleet-node"
SAMPLER_MODES = ("auto", "nvml", "global", "pdh")
FIELD_TYPES = ("string", "integer", "number", "boolean", "object", "array", "any")

Duration = NewType("Duration", float)
"""Float seconds, written in YAML as a Go duration string."""
MemorySize = NewType("MemorySize", int)
LimitSize = NewType("LimitSize", str)
"""A task's ``memory_max`` as written (a size, checked by :func:`parse_memory_max`)."""
"""Bytes, written in YAML as a size string (``1GiB``, ``512MiB``) or a whole number of bytes."""


@attrs.frozen
class GpuSettings:
    vendor: str = "nvidia"
    arch: str = "auto"
    """``auto`` = the product-name mapping of §7.2, or a literal such as ``ampere``."""
    index: int = 0
    """Legacy single-device choice: a non-zero index with no ``devices`` means ``[index]``."""
    devices: tuple[int | str, ...] = ()
    """Multi-GPU: the devices this node uses, by index or UUID; empty = every device."""
    primary_gpu_uuid: str = ""
    """Multi-GPU: the device whose VRAM health's headline reports ("": the largest)."""


@attrs.frozen
class FootprintSettings:
    path: str = "~/.local-offload/footprints.json"
    margin: float = 1.2
    """1.2 = CONTRACT v2; 1.0 = v2.1 raw peaks."""


@attrs.frozen
class Timings:
    health_sample_interval: Duration = Duration(2.0)
    max_snapshot_age: Duration = Duration(30.0)
    render_sample_interval: Duration = Duration(0.5)
    job_ttl: Duration = Duration(3600.0)
    janitor_interval: Duration = Duration(300.0)
    drain_timeout: Duration = Duration(30.0)
    kill_grace: Duration = Duration(5.0)
    smi_timeout: Duration = Duration(5.0)
    poll_linger: Duration = Duration(5.0)
    """After the drain, how long polls (only) keep being answered (0 = none); the linger ends
    earlier once every job that ended in the shutdown has been polled."""
    ack_deadline: Duration = Duration(2.0)
    """A dispatch whose ack would be committed later than this after the request arrived is
    answered 503 ``ack deadline passed``, never acked late (keep it under the dispatcher's
    client timeout; docs/node.md "Delivery-checked acks")."""


JOURNAL_SYNC_MODES = ("normal", "full")


@attrs.frozen
class JournalSettings:
    """The job journal (docs/node.md "Job journal")."""

    enabled: bool = True
    path: str = ""
    """Empty: ``journal-<node_id>.sqlite`` in the node's state directory (the folder of the
    footprint store)."""
    sync: str = "normal"
    """``normal``: a commit survives a crash of the process; ``full``: also a power cut."""
    inline_max: int = 64 * 1024
    """Results larger than this (bytes) live in files beside the journal, not in RAM."""


@attrs.frozen
class NodeSettings:
    listen: str = ""
    """Empty: the built-in default (``127.0.0.1:18811``) unless ``--listen`` is given."""
    node_id: str = ""
    gpu: GpuSettings = attrs.Factory(GpuSettings)
    sampler: str = "auto"
    footprints: FootprintSettings = attrs.Factory(FootprintSettings)
    gpu_lock_path: str = ""
    timings: Timings = attrs.Factory(Timings)
    allow_origins: list[str] = attrs.Factory(list)
    """Browser origins served besides the node's own (``--allow-origin`` adds more;
    docs/security.md). Each is ``scheme://host[:port]``."""
    memory_budget: MemorySize = MemorySize(DEFAULT_BUDGET)
    """Results and log histories of all jobs together (``fleet_trio.memory``)."""
    journal: JournalSettings = attrs.Factory(JournalSettings)
    max_tails: int = DEFAULT_MAX_TAILS
    """Live log tails open at once, all jobs (docs/tail.md); beyond it: 503 too many tails."""
    max_tails_per_job: int = DEFAULT_MAX_TAILS_PER_JOB
    """Live log tails of one job open at once."""
    containment: str = "auto"
    """How jobs are contained: ``auto``, ``cgroup`` or ``marker`` (docs/containment.md)."""
    cgroup_base: str = ""
    """The delegated cgroup v2 directory to use (default: our own; docs/containment.md)."""


@attrs.frozen
class FieldSpec:
    """One declared payload member (§6.6 validation vocabulary)."""

    type: str = "any"
    required: bool = False
    non_empty: bool = False
    hint: str = ""


@attrs.frozen
class FamilyRule:
    """``family: {from_payload: kind, map: {music: acestep}, default: chatterbox}`` or
    ``family: {from_payload: model_family, allowed: [sdxl, flux-dev], default: comfy-graph}``.

    The source value is the payload member ``from_payload`` (a non-empty string) or, without
    ``from_payload``, the task's own ``family``; it goes through ``map`` when ``map`` is given
    (unmapped values take ``default``). No usable source value: ``default``. So
    ``{default: sdxl}`` reads "the task's family, or ``sdxl`` when it is empty" (§5.3).

    Payload text never reaches a command line, the environment or the footprint file as it is:
    a rule with ``from_payload`` must name a closed set, ``allowed`` (a payload value outside it
    is a 400 at ack time) or ``map`` (unmapped values take ``default``), and every value of the
    set is an id (:mod:`fleet_trio.inputs`). :func:`config_from_mapping` refuses anything else.
    """

    from_payload: str = ""
    map: dict[str, str] = attrs.Factory(dict)
    default: str = ""
    allowed: tuple[str, ...] = ()


@attrs.frozen
class QuantRule:
    """``quant: {source: [family], starts_with: {hidream-o1: bf16}}``, or
    ``quant: {source: [env.VIDEOGEN_UNET_HIGH, env.VIDEOGEN_UNET_LOW], contains: {Q8_0: q8_0}}``.

    Derives the footprint quant from the node's bindings (§5.3), never from the payload.
    ``source`` names the texts looked at, in order: ``family`` (the job's footprint family)
    or ``env.NAME`` (the task's ``env:`` value, else the node's environment). The first text
    that starts with a ``starts_with`` key (case-sensitive), or contains a ``contains`` key
    (case-insensitive), gives that key's value; nothing matches: ``default``.
    """

    source: tuple[str, ...]
    starts_with: dict[str, str] = attrs.Factory(dict)
    contains: dict[str, str] = attrs.Factory(dict)
    default: str = ""


@attrs.frozen
class FootprintSpec:
    family: str | FamilyRule = ""
    quant: str | QuantRule = ""


@attrs.frozen
class TaskDef:
    """One task type declared in YAML: a command fed the payload on stdin."""

    name: str
    command: tuple[str, ...]
    family: str = ""
    footprint: FootprintSpec | None = None
    env: dict[str, str] = attrs.Factory(dict)
    cwd: str = ""
    timeout: Duration = Duration(0.0)
    """0 = no limit."""
    gpu: bool = False
    gpus: int = 0
    """Multi-GPU: how many devices a job takes (0: one when ``gpu: true``, else none)."""
    expect_file: str = ""
    payload: dict[str, FieldSpec] = attrs.Factory(dict)
    materialize: dict[str, str] = attrs.Factory(dict)
    probe: dict[str, Any] | None = None
    enabled: bool = True
    memory_max: LimitSize | None = None
    """fleet-trio only: the job cgroup's ``memory.max`` (docs/containment.md, "Limits")."""
    pids_max: int | None = None
    """fleet-trio only: the job cgroup's ``pids.max``."""
    cpu_weight: int | None = None
    """fleet-trio only: the job cgroup's ``cpu.weight`` (1..10000)."""


@attrs.frozen
class NodeConfig:
    node: NodeSettings = attrs.Factory(NodeSettings)
    tasks: tuple[TaskDef, ...] = ()
    path: str = ""
    """The file it came from ("" when built in code)."""
    base_dir: str = ""
    """Where relative paths in ``command`` and ``cwd`` resolve (the YAML file's folder)."""


def task_limits(task: TaskDef) -> JobLimits:
    """The job cgroup limits of ``task`` (checked at load)."""
    memory = parse_memory_max(task.memory_max) if task.memory_max is not None else None
    return JobLimits(
        memory_max=memory[0] if memory else None,
        memory_max_text=memory[1] if memory else "",
        pids_max=task.pids_max,
        cpu_weight=task.cpu_weight,
    )


def task_gpus(task: TaskDef) -> int:
    """How many devices a job of ``task`` takes: ``gpus``, else 1 for ``gpu: true``, else 0."""
    return task.gpus if task.gpus > 0 else (1 if task.gpu else 0)


# --------------------------------------------------------------------------------------------
# The converter
# --------------------------------------------------------------------------------------------


def _structure_duration(value: object, _: type) -> Duration:
    if isinstance(value, bool) or not isinstance(value, str):
        raise ValueError(f"expected a Go duration such as 10s or 500ms, got {value!r}")
    try:
        seconds = parse_duration_seconds(value)
    except DurationError as exc:
        raise ValueError(str(exc)) from None
    if seconds < 0:
        raise ValueError(f"duration must not be negative, got {value!r}")
    return Duration(seconds)


def _structure_size(value: object, _: type) -> MemorySize:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ValueError(f"expected a size such as 1GiB or 512MiB, got {value!r}")
    try:
        return MemorySize(check_budget(parse_size(str(value))))
    except ValueError as exc:
        raise ValueError(str(exc)) from None


def _structure_limit_size(value: object, _: type) -> LimitSize:
    return LimitSize(parse_memory_max(value)[1])


_STRICT: dict[type, tuple[type | tuple[type, ...], str]] = {
    str: (str, "a string"),
    bool: (bool, "true or false"),
    int: (int, "an integer"),
    float: ((int, float), "a number"),
}
"""The scalar types taken as they are, never coerced: what each accepts and its name."""


def _strict(kind: type) -> Callable[[object, type], object]:
    accepted, name = _STRICT[kind]

    def hook(value: object, _: type) -> object:
        if (isinstance(value, bool) and kind is not bool) or not isinstance(value, accepted):
            raise ValueError(f"expected {name}, got {value!r}")
        return kind(value)

    return hook


def _name_or_rule(
    converter: cattrs.Converter, rule: type[FamilyRule | QuantRule], what: str
) -> None:
    """Register the hook for ``str | rule``: a plain name, or a mapping structured as the rule."""

    def hook(value: object, _: type) -> object:
        if isinstance(value, str):
            return value
        if isinstance(value, Mapping):
            return converter.structure(value, rule)
        raise ValueError(f"expected {what}, got {value!r}")

    converter.register_structure_hook_func(lambda t: t == (str | rule), hook)


def register_hooks(converter: cattrs.Converter) -> None:
    """The YAML config edge: Go durations, strict scalars, ``footprint: false``, families."""
    converter.register_structure_hook(Duration, _structure_duration)
    converter.register_structure_hook(MemorySize, _structure_size)
    converter.register_structure_hook(LimitSize, _structure_limit_size)
    for kind in _STRICT:
        converter.register_structure_hook(kind, _strict(kind))

    _name_or_rule(converter, FamilyRule, "a family name or a from_payload rule")
    _name_or_rule(converter, QuantRule, "a quant or a source rule")

    def footprint(value: object, _: type) -> FootprintSpec | None:
        if value is None or value is False:
            return None
        if value is True:
            return FootprintSpec()
        if isinstance(value, Mapping):
            return converter.structure(value, FootprintSpec)
        raise ValueError(f"expected false or a mapping, got {value!r}")

    converter.register_structure_hook_func(lambda t: t == (FootprintSpec | None), footprint)

    def command(value: object, _: type) -> tuple[str, ...]:
        if isinstance(value, str):
            raise ValueError("expected a list of strings (argv), got a string")
        if not isinstance(value, list) or not value:
            raise ValueError("expected a non-empty list of strings")
        if not all(isinstance(a, str) for a in value):
            raise ValueError("every element must be a string")
        return tuple(value)

    converter.register_structure_hook_func(lambda t: t == tuple[str, ...], command)

    def devices(value: object, _: type) -> tuple[int | str, ...]:
        if not isinstance(value, list):
            raise ValueError("expected a list of device indexes or UUIDs")
        out: list[int | str] = []
        for item in value:
            if isinstance(item, bool) or not isinstance(item, int | str):
                raise ValueError(f"expected a device index or UUID, got {item!r}")
            if isinstance(item, int) and item < 0:
                raise ValueError(f"a device index must be >= 0, got {item}")
            if isinstance(item, str) and not item.strip():
                raise ValueError("a device UUID must not be empty")
            out.append(item.strip() if isinstance(item, str) else item)
        return tuple(out)

    converter.register_structure_hook_func(lambda t: t == tuple[int | str, ...], devices)


def make_converter() -> cattrs.Converter:
    converter = cattrs.Converter(forbid_extra_keys=True)
    register_hooks(converter)
    return converter


def _check_family_rule(rule: FamilyRule, key: str) -> None:
    """A payload-sourced family must come from a closed set of ids (issue: injection)."""
    key = f"{key}.footprint.family"
    if rule.from_payload and not rule.allowed and not rule.map:
        raise _KeyedError(
            "from_payload needs a closed set of values: allowed: [a, b] (other values are "
            "refused with a 400) or map: {value: family} (other values take default); payload "
            "text never reaches the command, the environment or the footprint file",
            key,
        )
    for value in rule.allowed:
        _check_id(value, f"{key}.allowed")
    for source, value in rule.map.items():
        _check_id(value, f"{key}.map.{printable(source)}")
    if rule.default:
        _check_id(rule.default, f"{key}.default")


def _check_id(value: str, where: str) -> None:
    """Families reach {family}, FLEET_FAMILY, health and the footprint file: ids only."""
    problem = id_problem(value)
    if problem is not None:
        raise _KeyedError(f"{printable(value, limit=64)!r} {problem}", where)


def _check_task(task: TaskDef, key: str) -> None:
    family = task.footprint.family if task.footprint is not None else ""
    if isinstance(family, FamilyRule):
        _check_family_rule(family, key)
    for value, where in ((task.family, f"{key}.family"), (family, f"{key}.footprint.family")):
        if isinstance(value, str) and value:
            _check_id(value, where)
    for member, spec in task.payload.items():
        if spec.type not in FIELD_TYPES:
            raise _KeyedError(
                f"unknown type {spec.type!r} (one of {', '.join(FIELD_TYPES)})",
                f"{key}.payload.{member}.type",
            )
    quant = task.footprint.quant if task.footprint is not None else ""
    if isinstance(quant, QuantRule):
        for source in quant.source:
            if source != "family" and not (source.startswith("env.") and len(source) > 4):
                raise _KeyedError(
                    f"unknown source {source!r} (family or env.NAME)", f"{key}.footprint.quant"
                )
    if task.gpus < 0:
        raise _KeyedError(f"must be >= 0, got {task.gpus}", f"{key}.gpus")
    for name, check in (("pids_max", check_pids_max), ("cpu_weight", check_cpu_weight)):
        if getattr(task, name) is not None:
            try:
                check(getattr(task, name))
            except ValueError as exc:
                raise _KeyedError(str(exc), f"{key}.{name}") from None
    for name in task.env:
        if not name or "=" in name:  # no process could get it: every job would fail to start
            raise _KeyedError(
                f"an environment name must be non-empty and without '=', got {name!r}",
                f"{key}.env",
            )
    for name, filename in task.materialize.items():
        if not filename or "/" in filename or filename in (".", ".."):
            raise _KeyedError(
                f"must be a plain file name, got {filename!r}", f"{key}.materialize.{name}"
            )


def _check_origins(raw: object, origins: list[str]) -> None:
    """``node.allow_origins``: a list of ``scheme://host[:port]`` (docs/security.md)."""
    from fleet_trio.edge import OriginError, check_allowed_origin

    if isinstance(raw, str):
        raise _KeyedError("expected a list of origins, got a string", "node.allow_origins")
    for i, origin in enumerate(origins):
        try:
            check_allowed_origin(origin)
        except OriginError as exc:
            raise _KeyedError(str(exc), f"node.allow_origins[{i}]") from None


TASK_KEYS = tuple(f.name for f in attrs.fields(TaskDef) if f.name != "name")


def _check_task_keys(body: Mapping[object, object], key: str) -> None:
    """An unknown key of a task, named with the closest known one (cattrs would name it
    too, but only after a misspelt ``command:`` was reported missing)."""
    extra = sorted(str(k) for k in body if k not in TASK_KEYS)
    if extra:
        hints = "".join(did_you_mean(k, TASK_KEYS) for k in extra)
        raise _KeyedError(f"extra fields found ({', '.join(extra)}){hints}", key)


def config_from_mapping(raw: object, *, path: str = "", base_dir: str = "") -> NodeConfig:
    """Build a :class:`NodeConfig` from parsed YAML. Raises :class:`ConfigError`."""
    converter = make_converter()
    try:
        if raw is None:
            raw = {}
        if not isinstance(raw, Mapping):
            raise _KeyedError("the file must hold a mapping with node: and tasks:", "")
        bad = find_bad_value(raw)
        if bad is not None:
            raise _KeyedError(bad[1], bad[0])
        extra = sorted(set(raw) - {"node", "tasks"})
        if extra:
            hint = did_you_mean(str(extra[0]), ("node", "tasks"))
            raise _KeyedError(
                f"unknown top-level key (expected node: and tasks:){hint}", str(extra[0])
            )
        node = _structure(converter, raw.get("node") or {}, NodeSettings, "node")
        if node.sampler not in SAMPLER_MODES:
            raise _KeyedError(
                f"unknown sampler {node.sampler!r} (one of auto, nvml, global)", "node.sampler"
            )
        if not node.footprints.margin > 0:
            raise _KeyedError("must be > 0", "node.footprints.margin")
        if node.timings.kill_grace <= 0:
            raise _KeyedError("must be > 0", "node.timings.kill_grace")
        if node.timings.ack_deadline <= 0:
            raise _KeyedError("must be > 0", "node.timings.ack_deadline")
        _check_origins((raw.get("node") or {}).get("allow_origins"), node.allow_origins)
        if found := first_control(node.node_id):
            raise _KeyedError(
                f"must not contain a control character (found {found})", "node.node_id"
            )
        if node.journal.sync not in JOURNAL_SYNC_MODES:
            raise _KeyedError(
                f"unknown sync {node.journal.sync!r} (normal or full)", "node.journal.sync"
            )
        if node.containment not in ("auto", "cgroup", "marker"):
            raise _KeyedError(
                f"unknown containment {node.containment!r} (one of auto, cgroup, marker)",
                "node.containment",
            )
        if node.journal.inline_max < 0:
            raise _KeyedError("must be >= 0", "node.journal.inline_max")
        for key in ("max_tails", "max_tails_per_job"):
            if getattr(node, key) < 1:
                raise _KeyedError("must be >= 1", f"node.{key}")
        raw_tasks = raw.get("tasks") or {}
        if not isinstance(raw_tasks, Mapping):
            raise _KeyedError("expected a mapping of task type -> definition", "tasks")
        tasks: list[TaskDef] = []
        for name, body in raw_tasks.items():
            key = f"tasks.{name}"
            if not isinstance(name, str) or not name:
                raise _KeyedError("a task type must be a non-empty string", key)
            problem = id_problem(name)
            if problem is not None:  # dispatch checks task types against the same set
                raise _KeyedError(f"a task type {problem}", f"tasks.{printable(name)}")
            if not isinstance(body, Mapping):
                raise _KeyedError("expected a mapping", key)
            if "name" in body:
                raise _KeyedError("extra fields found (name)", key)
            _check_task_keys(body, key)  # a misspelt command: named before it is missed
            if "command" not in body:
                raise _KeyedError("required field missing", f"{key}.command")
            task = _structure(converter, {**body, "name": name}, TaskDef, key)
            _check_task(task, key)
            tasks.append(task)
    except _KeyedError as exc:
        raise ConfigError(str(exc), key=exc.key or None, path=path or None) from None
    return NodeConfig(node=node, tasks=tuple(tasks), path=path, base_dir=base_dir)


def load_config(path: str | os.PathLike[str]) -> NodeConfig:
    """Read and validate a node YAML file. Raises :class:`ConfigError` naming key and file.

    The file is outside input (:mod:`fleet_trio.configfile`): a regular file of at most 1 MiB,
    nesting and alias expansion bounded before a tree is built, numbers finite and in range.
    """
    path = os.fspath(path)
    data = read_config_bytes(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text (byte {exc.start})", path=path) from None
    check_yaml_shape(text, path=path)
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid YAML: {' '.join(str(exc).split())}", path=path) from None
    except (ValueError, RecursionError) as exc:  # e.g. an integer of 5000 digits
        problem = printable(str(exc), limit=200)
        raise ConfigError(f"invalid YAML: {problem}", path=path) from None
    base_dir = os.path.dirname(os.path.abspath(path))
    return config_from_mapping(raw, path=path, base_dir=base_dir)


# --------------------------------------------------------------------------------------------
# Identity (§7.1) and the listen guard (§7.3)
# --------------------------------------------------------------------------------------------


def os_hostname() -> str:
    return socket.gethostname()


def resolve_node_id(
    flag: str | None, configured: str, hostname: Callable[[], str] = os_hostname
) -> str:
    """``--node-id`` > config ``node_id`` > the OS hostname > ``"fleet-node"``."""
    if flag or configured:
        return flag or configured
    try:
        name = hostname()
    except Exception:
        name = ""
    return name.strip() if name and name.strip() else FALLBACK_NODE_ID


def resolve_listen(flag: str | None, configured: str) -> str:
    """``--listen`` > config ``listen`` > ``127.0.0.1:18811``."""
    return flag or configured or DEFAULT_LISTEN


class ListenRefused(ConfigError):
    """The listen guard refused the address."""


def check_listen(addr: str, allow_non_local: bool) -> None:
    """The guard (§7.3), before any socket exists. The override skips even the parse."""
    if allow_non_local:
        return
    try:
        host, _port = split_host_port(addr)
    except ValueError as exc:
        raise ListenRefused(
            f"cannot parse --listen {go_quote(addr)}: address {addr}: {exc}"
        ) from None
    if not is_loopback_host(host):
        raise ListenRefused(
            f"refusing to bind --listen {go_quote(addr)}: the fleet endpoints have no "
            "authentication; use a loopback address (127.0.0.1, ::1, localhost) or pass "
            "--listen-trusted-network to bind a trusted network such as a tailnet address"
        )


TRUSTED_NETWORK_WARNING = (
    "WARNING: --listen-trusted-network: binding {addr} with no authentication on the fleet "
    "endpoints; any host that can reach this port can start jobs on this GPU"
)


def journal_path(configured: str, node_id: str, footprints_path: str, base_dir: str = "") -> str:
    """The journal's file: the configured path, else ``journal-<node_id>.sqlite`` in the
    node's state directory (the folder of the footprint store)."""
    if configured:
        return expand_path(configured, base_dir)
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", node_id)[:100] or "node"
    folder = os.path.dirname(os.path.abspath(expand_path(footprints_path, base_dir)))
    return os.path.join(folder, f"journal-{safe}.sqlite")


def expand_path(path: str, base_dir: str) -> str:
    """``~`` and ``${XDG_STATE_HOME}`` expanded (fleet_trio.statedir); a relative path resolved
    against ``base_dir`` (if given)."""
    from fleet_trio.statedir import expand_vars

    path = os.path.expanduser(expand_vars(path))
    if base_dir and not os.path.isabs(path):
        path = os.path.join(base_dir, path)
    return path


__all__ = [
    "DEFAULT_LISTEN",
    "FALLBACK_NODE_ID",
    "FIELD_TYPES",
    "SAMPLER_MODES",
    "TRUSTED_NETWORK_WARNING",
    "Duration",
    "FamilyRule",
    "FieldSpec",
    "FootprintSettings",
    "FootprintSpec",
    "GpuSettings",
    "JournalSettings",
    "ListenRefused",
    "MemorySize",
    "NodeConfig",
    "NodeSettings",
    "QuantRule",
    "TaskDef",
    "Timings",
    "check_listen",
    "config_from_mapping",
    "expand_path",
    "is_loopback_host",
    "journal_path",
    "load_config",
    "make_converter",
    "os_hostname",
    "register_hooks",
    "resolve_listen",
    "resolve_node_id",
    "split_host_port",
    "task_gpus",
]
