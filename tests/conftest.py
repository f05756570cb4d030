"""Fixtures for the whole suite (``is_root``). Shared helpers live in ``tests/helpers.py``
(docs/testing.md); every real child process is guarded by ``trio.fail_after``."""

from __future__ import annotations

import os
import signal
import sys

import pytest
from hypothesis import settings

PY = sys.executable

# Hypothesis fails a test whose example takes over 200 ms by default ("Unreliable test
# timings"): on a loaded 2-core machine one stalled example is load, not a defect. Examples
# are bounded by their own size; a test that needs a time bound says so itself.
settings.register_profile("fleet-trio", deadline=None)
settings.load_profile("fleet-trio")


def pytest_configure(config: pytest.Config) -> None:
    """The suite sends SIGINT and SIGTERM to the processes it starts and expects their default
    actions. A run started in the background of a script (``.ci/run &``, or
    ``scripts/suite-under-load`` from a job) inherits SIGINT ignored, and an ignored signal
    stays ignored through exec: the test processes, and through them their children, get the
    default dispositions back."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGTERM) == signal.SIG_IGN:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


WORKERS_PER_CPU = 1.5
"""``-n auto`` starts this many test processes per CPU (at least 2): most of the suite waits
on real processes, sockets and signals rather than computing, so one process per CPU left
about 40% of two CPUs idle (docs/testing.md, "How long it takes")."""


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """The number of workers ``-n auto`` starts (pytest-xdist's hook)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(2, round((cpus or 1) * WORKERS_PER_CPU))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests marked ``slow`` run first (the order is otherwise kept): the workers take
    them at the start and the many short tests fill in around them, instead of one long test
    starting last and running on alone at the end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture
def is_root() -> bool:
    return os.geteuid() == 0


from tests.cgroups import (  # noqa: E402
    cgroup_parent,  # noqa: F401  (a fixture)
    cgroup_session_root,  # noqa: F401  (a fixture)
    dead_exec_cgroups,
)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """No cgroup is left behind by the suite: ``fleet-trio exec`` (the cgroup backend, where
    one can be had) makes its job's cgroup in our own and must always remove it."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return  # checked once, by the controlling process
    left = dead_exec_cgroups()
    if left:
        print(f"\ncgroups left behind by the suite: {left}", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
