"""The ``fleet-trio worker`` settings (worker-protocol.md §12, §10.5, §13; worker-process.md
§4.1, §4.3). Durations are integer ns; zero or negative means "the default" (a device's
``max_runtime``: zero = no ceiling, negative = rejected), applied at construction, so a config
built in code gets them too. The file's keys are these classes' fields (:func:`file_fields`).
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable
from typing import Any, NewType

import attrs

from fleet_trio.durations import MINUTE, SECOND, go_duration
from fleet_trio.edge import is_loopback_host, split_host_port
from fleet_trio.errors import ConfigError
from fleet_trio.logbus.fanout import DEFAULT_MAX_TAILS, DEFAULT_MAX_TAILS_PER_JOB
from fleet_trio.memory import DEFAULT_BUDGET, format_size
from fleet_trio.proc.limits import JobLimits, parse_memory_max

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
DIR_KEYS = ("probe_dir", "verify_dir", "sheet_dir")
"""The directories the config names (relative ones: see ``rebase_paths``)."""

ENV_TOKEN = "RC_TOKEN"
ENV_REQUIRE_MANUAL_CLEAR = "RC_REQUIRE_MANUAL_CLEAR"

REDACTED = "(redacted)"

GoDuration = NewType("GoDuration", int)
"""Integer nanoseconds, written in YAML as a Go duration string."""
Size = NewType("Size", str)
"""Bytes, written in YAML as a size string (``512MiB``); checked by the loader."""

FILE_TYPE = "fleet_trio.file_type"
"""Field metadata: the type a key has in the file when it differs from the field's."""
NOT_IN_FILE = "fleet_trio.not_in_file"
"""Field metadata: not a key of the file (where the config came from, what it ignored)."""


def _duration(default: int) -> Any:
    """A duration field: integer ns, a Go duration string in the file."""
    return attrs.field(default=default, metadata={FILE_TYPE: GoDuration})


def file_fields(cls: type) -> dict[str, attrs.Attribute[Any]]:
    """The keys of the file that ``cls`` reads, by name (its fields, less the NOT_IN_FILE
    ones): what is not here is an unknown key."""
    return {f.name: f for f in attrs.fields(cls) if not f.metadata.get(NOT_IN_FILE)}


def _fill_defaults(obj: Any) -> None:
    """Replace a zero/negative duration or an empty string by the field's default, for the
    fields whose default is not itself empty (frozen-safe)."""
    for f in attrs.fields(type(obj)):
        value = getattr(obj, f.name)
        duration = f.metadata.get(FILE_TYPE) is GoDuration
        if f.default and ((isinstance(value, str) and not value) or (duration and value <= 0)):
            object.__setattr__(obj, f.name, f.default)


@attrs.frozen
class HooksConfig:
    """Host-level hook defaults (``hooks:``). Zero or negative means the built-in default."""

    timeout: int = _duration(DEFAULT_HOOK_TIMEOUT)
    """Per-hook timeout, ns (default 60 s)."""
    release_linger: int = _duration(DEFAULT_RELEASE_LINGER)
    """How long a device stays held after a job before ``on_release`` runs, ns (30 s)."""

    def __attrs_post_init__(self) -> None:
        _fill_defaults(self)


@attrs.frozen
class DeviceConfig:
    """One device this host offers: ``- gpu0`` or a mapping with ``name:``.

    ``timeout`` / ``release_linger`` of 0 mean "not overridden"; :class:`WorkerConfig`
    resolves them to the host ``hooks:`` values when it is constructed.
    """

    name: str = ""
    max_runtime: int = _duration(0)
    """Runtime ceiling, ns; 0 = none. Registered as whole seconds (truncated)."""
    on_acquire: str = ""
    on_release: str = ""
    timeout: int = _duration(0)
    """Per-device hook timeout, ns; 0 = the host ``hooks.timeout``."""
    release_linger: int = _duration(0)
    """Per-device linger, ns; 0 = the host ``hooks.release_linger``."""
    labels: dict[str, str] = attrs.Factory(dict)
    """Declared labels, sent as this device's ``declared_labels``."""
    memory_max: str = ""
    """fleet-trio only: the job cgroup's ``memory.max``, a size as written (checked by the
    loader; docs/containment.md, "Limits"); "" = none."""
    pids_max: int | None = None
    """fleet-trio only: the job cgroup's ``pids.max``."""
    cpu_weight: int | None = None
    """fleet-trio only: the job cgroup's ``cpu.weight`` (1..10000)."""

    def __attrs_post_init__(self) -> None:
        for name in ("timeout", "release_linger"):
            if getattr(self, name) < 0:
                object.__setattr__(self, name, 0)

    @property
    def max_runtime_seconds(self) -> int:
        """The ceiling as registered: whole seconds, truncated; 0 = none."""
        return max(self.max_runtime, 0) // SECOND

    @property
    def limits(self) -> JobLimits:
        """The limits of this device's job cgroups (checked at load)."""
        memory = parse_memory_max(self.memory_max) if self.memory_max else None
        return JobLimits(
            memory_max=memory[0] if memory else None,
            memory_max_text=memory[1] if memory else "",
            pids_max=self.pids_max,
            cpu_weight=self.cpu_weight,
        )

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
    heartbeat_interval: int = _duration(DEFAULT_HEARTBEAT_INTERVAL)
    poll_wait: int = _duration(DEFAULT_POLL_WAIT)
    hooks: HooksConfig = attrs.Factory(HooksConfig)
    probe_dir: str = DEFAULT_PROBE_DIR
    probe_interval: int = _duration(DEFAULT_PROBE_INTERVAL)
    probe_timeout: int = _duration(DEFAULT_PROBE_TIMEOUT)
    verify_dir: str = DEFAULT_VERIFY_DIR
    verify_timeout: int = _duration(DEFAULT_VERIFY_TIMEOUT)
    verify_pass_budget: int = _duration(DEFAULT_VERIFY_PASS_BUDGET)
    sheet_dir: str = DEFAULT_SHEET_DIR
    require_manual_clear: bool = False
    tail_listen: str = ""
    """fleet-trio only: ``HOST:PORT`` of the live log tail websocket; empty = off."""
    tail_token: str = ""
    """fleet-trio only: bearer token the tail listener requires; empty = none."""
    tail_allow_origins: tuple[str, ...] = ()
    """fleet-trio only: browser origins the tail listener serves besides its own
    (``scheme://host[:port]``, docs/security.md)."""
    max_tails: int = DEFAULT_MAX_TAILS
    """fleet-trio only: live tails the tail listener serves at once, all jobs (docs/tail.md)."""
    max_tails_per_job: int = DEFAULT_MAX_TAILS_PER_JOB
    """fleet-trio only: live tails of one job the tail listener serves at once."""
    memory_budget: int = attrs.field(default=DEFAULT_BUDGET, metadata={FILE_TYPE: Size})
    containment: str = "auto"
    """fleet-trio only: how jobs are contained: auto, cgroup or marker (docs/containment.md)."""
    cgroup_base: str = ""
    """fleet-trio only: the delegated cgroup v2 directory to use (default: our own)."""
    """fleet-trio only: bytes of job log history kept across jobs (``fleet_trio.memory``)."""
    path: str = attrs.field(default="", metadata={NOT_IN_FILE: True})
    """The file it came from ("" when built in code)."""
    ignored_keys: tuple[str, ...] = attrs.field(default=(), metadata={NOT_IN_FILE: True})
    """Keys in the file the worker does not read (dotted), in file order."""
    set_keys: tuple[str, ...] = attrs.field(default=(), metadata={NOT_IN_FILE: True})
    """The top-level keys the file sets (a configured directory that does not exist is
    warned about at start; a default one is not)."""

    def __attrs_post_init__(self) -> None:
        _fill_defaults(self)
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

        Durations are rendered as Go renders them (``30s``, ``2m0s``); the tokens are redacted.
        """
        out = {"path": self.path, **_plain(self)}
        del out["set_keys"]
        out.update(
            token=REDACTED if self.token else "",
            tail_token=REDACTED if self.tail_token else "",
            tail_listen=self.tail_listen or None,
            devices=[
                {
                    "id": self.device_id(d.name),
                    **_plain(d),
                    "max_runtime": go_duration(d.max_runtime) if d.max_runtime else None,
                    "on_acquire": d.on_acquire or None,
                    "on_release": d.on_release or None,
                    "cuda_visible_devices": cuda_device_index(self.device_id(d.name)),
                }
                for d in self.devices
            ],
        )
        return out


def _plain(obj: Any) -> dict[str, Any]:
    """``obj``'s fields as JSON-able data: durations and sizes as the file writes them."""
    out: dict[str, Any] = {}
    for f in attrs.fields(type(obj)):
        value = getattr(obj, f.name)
        kind = f.metadata.get(FILE_TYPE)
        if kind is not None:
            value = go_duration(value) if kind is GoDuration else format_size(value)
        elif attrs.has(type(value)):
            value = _plain(value)
        elif isinstance(value, tuple | dict):
            value = list(value) if isinstance(value, tuple) else dict(value)
        out[f.name] = value
    return out


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
    "FILE_TYPE",
    "NOT_IN_FILE",
    "REDACTED",
    "DeviceConfig",
    "GoDuration",
    "HooksConfig",
    "Size",
    "WorkerConfig",
    "check_tail_listen",
    "cuda_device_index",
    "file_fields",
    "hook_env",
    "parse_go_bool",
    "tail_listen_problem",
]
