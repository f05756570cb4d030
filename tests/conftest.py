"""Fixtures for the whole suite (``is_root``). Shared helpers live in ``tests/helpers.py``
(docs/testing.md); every real child process is guarded by ``trio.fail_after``."""

from __future__ import annotations

import os
import signal
import sys

import pytest

PY = sys.executable


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


@pytest.fixture
def is_root() -> bool:
    return os.geteuid() == 0
