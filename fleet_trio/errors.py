"""The typed error hierarchy shared by every part of fleet-trio."""

from __future__ import annotations

import os


class FleetTrioError(Exception):
    """Base class of every error fleet-trio raises on purpose."""


class ConfigError(FleetTrioError):
    """Invalid configuration: the message names the key and, where known, the file."""

    def __init__(self, message: str, *, key: str | None = None, path: str | None = None) -> None:
        self.key = key
        self.path = path
        where = ""
        if path and key:
            where = f"{path}: {key}: "
        elif path:
            where = f"{path}: "
        elif key:
            where = f"{key}: "
        super().__init__(f"{where}{message}")


class DurationError(ConfigError):
    """A duration string that is not a Go-style duration."""


class NodeStartError(FleetTrioError):
    """The node refused to start (GPU probe, listen guard, bind); the CLI exits 1."""


class WireError(FleetTrioError):
    """Invalid input from the network; carries the status code the spec gives it."""

    def __init__(self, message: str, *, status: int = 400) -> None:
        self.status = status
        super().__init__(message)


def errno_text(err: int | None) -> str:
    """Go's lower-case errno text, e.g. ``permission denied``."""
    if err is None:
        return "unknown error"
    text = os.strerror(err)
    return text[:1].lower() + text[1:] if text else f"errno {err}"


def go_os_error(op: str, path: str, exc: OSError) -> str:
    """Format an OS error the way Go does: ``<op> <path>: <errno text>``."""
    if exc.errno is None:
        return f"{op} {path}: {exc}"
    return f"{op} {path}: {errno_text(exc.errno)}"


__all__ = [
    "ConfigError",
    "DurationError",
    "FleetTrioError",
    "NodeStartError",
    "WireError",
    "errno_text",
    "go_os_error",
]
