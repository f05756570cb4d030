"""Where fleet-trio writes its own state when nothing else is configured.

``state_dir()``: ``$STATE_DIRECTORY`` (systemd's ``StateDirectory=``, e.g.
``/var/lib/fleet-trio`` for the shipped units), else ``$XDG_STATE_HOME/fleet-trio``, else
``~/.local/state/fleet-trio`` (the XDG default). Config paths may say
``${XDG_STATE_HOME}``: :func:`expand_vars` gives it the XDG default when it is unset, so the
shipped examples never write into ``$HOME`` itself.
"""

from __future__ import annotations

import os
import re
import stat

APP = "fleet-trio"
XDG_STATE_DEFAULT = "~/.local/state"

_VAR = re.compile(r"\$(?:\{(XDG_STATE_HOME|STATE_DIRECTORY)\}|(XDG_STATE_HOME|STATE_DIRECTORY)\b)")


def xdg_state_home() -> str:
    """``$XDG_STATE_HOME`` when set to an absolute path, else ``~/.local/state`` (expanded)."""
    value = os.environ.get("XDG_STATE_HOME", "")
    if not os.path.isabs(value):  # the XDG spec: a relative value is invalid, ignore it
        value = XDG_STATE_DEFAULT
    return os.path.expanduser(value)


def state_dir() -> str:
    """fleet-trio's state directory (see the module docstring); not created here."""
    systemd = os.environ.get("STATE_DIRECTORY", "").split(":")[0]
    if os.path.isabs(systemd):
        return systemd
    return os.path.join(xdg_state_home(), APP)


def expand_vars(path: str) -> str:
    """``$XDG_STATE_HOME`` / ``${XDG_STATE_HOME}`` (with its XDG default) and
    ``$STATE_DIRECTORY`` (fleet-trio's :func:`state_dir`) in ``path``; nothing else."""

    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        return xdg_state_home() if name == "XDG_STATE_HOME" else state_dir()

    return _VAR.sub(one, path)


def symlink_problem(path: str) -> str | None:
    """The one-line reason when ``path`` itself (its last component) is a symbolic link;
    ``None`` otherwise (a missing path included: it will be created, not followed).

    fleet-trio never follows a link where it keeps its own files and folders (the journal,
    its results folder, the footprint store, work roots): it changes their mode and removes
    files in them, and a link would turn that onto whatever it points at
    (docs/security.md). The folders above may be links (``/var/lib`` on another disk).
    ``~`` is expanded and a relative path made absolute (as the stores do)."""
    path = os.path.abspath(os.path.expanduser(path))
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISLNK(st.st_mode):
        return None
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    return (
        f"{path} is a symbolic link (to {target}); fleet-trio does not follow links for its "
        "own files and folders: give the real path"
    )


__all__ = ["APP", "expand_vars", "state_dir", "symlink_problem", "xdg_state_home"]
