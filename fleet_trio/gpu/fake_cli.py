"""The fake GPU from the command line: ``--gpu fake`` with no other flag, and
``fleet-trio fake-gpu VERB …`` (the documented helper; ``python -m fleet_trio.gpu.fake``
is the same program).

Where the fake GPU lives: ``--fake-gpu-dir``, else ``$FLEET_TRIO_FAKE_GPU_DIR``, else
``fake-gpu`` under fleet-trio's state directory (``$XDG_STATE_HOME/fleet-trio``, see
:mod:`fleet_trio.statedir`). A directory that does not exist, or has no ``device.json``, is
created and initialised (80 GiB, one device) by :func:`prepare_fake_gpu`, which says so in
one line.
"""

from __future__ import annotations

import argparse
import os

from fleet_trio.errors import ConfigError
from fleet_trio.statedir import state_dir

VERBS = ("init", "hold", "alloc", "free", "fail", "recover")


def default_dir() -> str:
    """``$FLEET_TRIO_FAKE_GPU_DIR``, else ``fake-gpu`` under the state directory."""
    from fleet_trio.gpu.fake import ENV_DIR

    return os.environ.get(ENV_DIR) or os.path.join(state_dir(), "fake-gpu")


def prepare_fake_gpu(directory: str | None, count: int = 1) -> tuple[str, str | None]:
    """The fake GPU's directory (absolute), its ``count`` devices created and initialised when
    they have no ``device.json`` yet (``count > 1``: ``DIR/gpu0`` …, the multi-GPU layout), and
    the one line that says so (``None`` when they were all there). Raises
    :class:`ConfigError` when it cannot be created."""
    from fleet_trio.gpu.fake import (
        DEFAULT_NAME,
        DEFAULT_TOTAL_GIB,
        DEVICE_FILE,
        device_dirs,
        init_device,
    )

    path = os.path.abspath(os.path.expanduser(directory or default_dir()))
    dirs = [path] if count <= 1 else device_dirs(path, count)
    missing = [d for d in dirs if not os.path.isfile(os.path.join(d, DEVICE_FILE))]
    if not missing:
        return path, None
    try:
        for d in missing:
            init_device(d)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ConfigError(f"cannot create the fake GPU in {path}: {reason}") from None
    devices = "one device" if count <= 1 else f"{count} devices"
    note = (
        f"fake GPU initialised in {path} ({DEFAULT_NAME}, {DEFAULT_TOTAL_GIB:g} GiB, {devices}; "
        "`fleet-trio fake-gpu` changes it)"
    )
    return path, note


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "fake-gpu",
        help="drive the fake GPU (--gpu fake): init, hold, alloc, free, fail, recover",
        description=(
            "Drive the fake GPU that `--gpu fake` reads (no driver needed). Its directory: "
            "--dir, else $FLEET_TRIO_FAKE_GPU_DIR (set for every job of a --gpu fake node), "
            "else fake-gpu under the state directory ($XDG_STATE_HOME/fleet-trio). "
            "`fleet-trio fake-gpu VERB --help` shows a verb's options."
        ),
        epilog=(
            "Examples: fleet-trio fake-gpu init --total-gib 24; fleet-trio fake-gpu hold 2.5G "
            "--for 10; fleet-trio fake-gpu fail 'ECC error'; fleet-trio fake-gpu recover. "
            "See docs/gpu.md."
        ),
    )
    p.add_argument("verb", choices=VERBS, help="what to do (see docs/gpu.md)")
    p.add_argument("rest", nargs=argparse.REMAINDER, metavar="ARG", help="the verb's arguments")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from fleet_trio.gpu.fake import ENV_DIR, main

    os.environ.setdefault(ENV_DIR, default_dir())
    try:
        return main([args.verb, *args.rest], prog="fleet-trio fake-gpu")
    except SystemExit as exc:  # argparse: usage errors (2) and --help (0)
        return exc.code if isinstance(exc.code, int) else 2


__all__ = ["VERBS", "add_parser", "default_dir", "prepare_fake_gpu", "run"]
