"""Real cgroups for tests (docs/testing.md, "Cgroups").

Every test that makes cgroups makes them under its own parent (the ``cgroup_parent``
fixture), itself under one parent per test session, ``fleet-trio-tests-<pid>`` in our own
cgroup v2. A test's parent is emptied (its processes killed) and removed after the test, and
the test fails if the code under test left a job cgroup behind; the session's parent is
checked empty and removed at the session's end (:func:`session_root`). Where no writable
cgroup v2 can be had, the fixture skips the test and says why.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from collections.abc import Iterator

import pytest

from fleet_trio.proc.containment import (
    AGENT_LEAF,
    JOBS_DIR,
    ContainmentError,
    check_writable,
    own_cgroup_dir,
)

SESSION_PREFIX = "fleet-trio-tests-"


def cgroup_dirs(root: str) -> list[str]:
    """Every cgroup below ``root``, deepest first."""
    found = []
    for directory, subdirs, _files in os.walk(root):
        found.extend(os.path.join(directory, d) for d in subdirs)
    return sorted(found, key=lambda p: p.count("/"), reverse=True)


def empty_and_remove(root: str) -> None:
    """Kill everything in ``root``'s subtree and remove its cgroups (bounded: 10 s)."""
    deadline = time.monotonic() + 10
    for directory in [*cgroup_dirs(root), root]:
        while True:
            try:
                with open(os.path.join(directory, "cgroup.procs")) as f:
                    pids = [int(x) for x in f.read().split()]
            except FileNotFoundError:
                break
            if not pids:
                try:
                    os.rmdir(directory)
                except FileNotFoundError:
                    pass
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.01)
                    continue
                break
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                raise RuntimeError(f"cgroup {directory} cannot be emptied: {pids}")
            time.sleep(0.01)


def leftovers(parent: str) -> list[str]:
    """The job cgroups under ``parent`` (the ``jobs/`` and ``agent/`` dirs of an agent whose
    delegated cgroup is ``parent`` itself, or a directory below it, are not leftovers)."""
    return [
        d
        for d in cgroup_dirs(parent)
        if os.path.basename(d) not in (JOBS_DIR, AGENT_LEAF)
        and not os.path.exists(os.path.join(d, JOBS_DIR))
    ]


@pytest.fixture(scope="session")
def cgroup_session_root() -> Iterator[str | None]:
    """The session's parent cgroup (``None``: no writable cgroup v2 here, with the reason in
    ``pytest`` skips). At the session's end it must be empty: a cgroup left there fails."""
    try:
        own = own_cgroup_dir()
        check_writable(own)
    except ContainmentError as exc:
        os.environ["FLEET_TRIO_TEST_NO_CGROUP"] = str(exc)
        yield None
        return
    root = os.path.join(own, f"{SESSION_PREFIX}{os.getpid()}")
    os.mkdir(root)
    try:
        yield root
    finally:
        left = cgroup_dirs(root)
        empty_and_remove(root)
        assert not left, f"cgroups left behind by the suite: {left}"


_NAME = re.compile(r"[^A-Za-z0-9_.-]")


@pytest.fixture
def cgroup_parent(cgroup_session_root: str | None, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh cgroup for this test alone; skips where no cgroup can be had. The test fails
    if the code under test left a job cgroup in it."""
    if cgroup_session_root is None:
        pytest.skip(f"no writable cgroup v2: {os.environ.get('FLEET_TRIO_TEST_NO_CGROUP')}")
    path = os.path.join(cgroup_session_root, _NAME.sub("_", request.node.name)[:80])
    os.mkdir(path)
    try:
        yield path
        left = leftovers(path)
        assert not left, f"job cgroups left behind: {left}"
    finally:
        empty_and_remove(path)


def dead_exec_cgroups() -> list[str]:
    """``fleet-trio exec`` cgroups in our own cgroup whose exec process is gone: left behind."""
    try:
        own = own_cgroup_dir()
        names = os.listdir(own)
    except (ContainmentError, OSError):
        return []
    left = []
    for name in names:
        m = re.match(r"fleet-trio-exec-(\d+)-", name)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            left.append(os.path.join(own, name))
    return left
