"""``fleet-trio worker --check``: the paths a config names, checked before they fail at run time.

Hooks (``on_acquire``/``on_release``, per device after the host ``hooks:`` defaults) must be
executable files: a missing or non-executable hook is an **error** (the job would fail, or
the device be quarantined, at the first acquire). Entries of ``probe_dir`` and ``verify_dir``
that are not executable are **warnings** (the worker skips them; for ``verify_dir`` that means
the check they make is off). A missing ``probe_dir``/``verify_dir`` is a warning too (no
probes, no verify scripts), an unreadable one an error (verify fails closed).
"""

from __future__ import annotations

import os
import stat

import attrs

from fleet_trio.worker.config import WorkerConfig


@attrs.frozen
class Problem:
    key: str
    message: str
    error: bool = True


def _executable(path: str) -> str | None:
    """Why ``path`` is not an executable file, or ``None``."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    if not stat.S_ISREG(st.st_mode):
        return f"{path}: not a regular file"
    if not os.access(path, os.X_OK):
        return f"{path}: not executable (chmod +x)"
    return None


def check_paths(config: WorkerConfig) -> list[Problem]:
    """Every problem with the paths ``config`` names (blocking: file system reads)."""
    problems: list[Problem] = []
    seen: set[tuple[str, str]] = set()
    for i, dev in enumerate(config.devices):
        for hook in ("on_acquire", "on_release"):
            path = getattr(dev, hook)
            if not path or (hook, path) in seen:
                continue
            seen.add((hook, path))
            why = _executable(path)
            if why is not None:
                problems.append(Problem(f"devices[{i}].{hook} ({dev.name})", why))
    for key, directory in (("probe_dir", config.probe_dir), ("verify_dir", config.verify_dir)):
        try:
            names = sorted(os.listdir(directory))
        except FileNotFoundError:
            if os.path.isabs(directory):
                why = f"{directory}: does not exist (none run)"
            else:  # name the folder it was looked up in: the working directory
                why = (
                    f"{directory} ({os.path.abspath(directory)}): does not exist "
                    "(none run; a relative path is taken from the working directory)"
                )
            problems.append(Problem(key, why, error=False))
            continue
        except OSError as exc:
            problems.append(Problem(key, f"{directory}: {exc.strerror or exc}"))
            continue
        for name in names:  # as the worker lists them: dotfiles included, directories not
            path = os.path.join(directory, name)
            if os.path.isdir(path) and not os.path.islink(path):
                continue
            why = _executable(path)
            if why is not None:
                problems.append(Problem(key, f"{why}; skipped", error=False))
    return problems


_WITHOUT = {
    "probe_dir": "no drop-in probe runs",
    "verify_dir": "verify is off: no script checks a device after its jobs",
    "sheet_dir": "no usage sheet is sent",
}


def missing_dirs(config: WorkerConfig) -> list[str]:
    """One line per directory the file sets (``probe_dir``, ``verify_dir``, ``sheet_dir``)
    that does not exist, naming the file, the key and the path (a relative one with the
    folder it was looked up in, the working directory), and what is off without it. A
    default directory is not named: a host without verify scripts is normal (blocking:
    file system reads)."""
    lines: list[str] = []
    for key, without in _WITHOUT.items():
        value = getattr(config, key)
        if key not in config.set_keys or os.path.isdir(value):
            continue
        shown = value if os.path.isabs(value) else f"{value} ({os.path.abspath(value)})"
        lines.append(f"{config.path or 'config'}: {key} {shown} does not exist: {without}")
    return lines


__all__ = ["Problem", "check_paths", "missing_dirs"]
