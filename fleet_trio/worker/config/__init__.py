"""The ``fleet-trio worker`` configuration: the rc ``/etc/rc/worker.yaml``, read unchanged.

- :mod:`~fleet_trio.worker.config.model`: the settings (attrs classes, defaults, the listen
  guard, ``CUDA_VISIBLE_DEVICES`` and the hook environment);
- :mod:`~fleet_trio.worker.config.loader`: the YAML, typed as Go's yaml.v3 types it, and the
  keyed errors.
"""

from fleet_trio.worker.config.loader import (
    config_from_mapping,
    load_worker_config,
    make_converter,
    register_hooks,
)
from fleet_trio.worker.config.model import (
    CONTROLLER_MAX_POLL_WAIT,
    DEFAULT_CONFIG_PATH,
    DEFAULT_HEARTBEAT_INTERVAL,
    DEFAULT_HOOK_TIMEOUT,
    DEFAULT_POLL_WAIT,
    DEFAULT_PROBE_DIR,
    DEFAULT_PROBE_INTERVAL,
    DEFAULT_PROBE_TIMEOUT,
    DEFAULT_RELEASE_LINGER,
    DEFAULT_SHEET_DIR,
    DEFAULT_VERIFY_DIR,
    DEFAULT_VERIFY_PASS_BUDGET,
    DEFAULT_VERIFY_TIMEOUT,
    ENV_REQUIRE_MANUAL_CLEAR,
    ENV_TOKEN,
    REDACTED,
    DeviceConfig,
    GoDuration,
    HooksConfig,
    WorkerConfig,
    check_tail_listen,
    cuda_device_index,
    hook_env,
    parse_go_bool,
    tail_listen_problem,
)

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
