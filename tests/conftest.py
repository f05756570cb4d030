"""Fixtures for the whole suite (``is_root``). Shared helpers live in ``tests/helpers.py``
(docs/testing.md); every real child process is guarded by ``trio.fail_after``."""

from __future__ import annotations

import os
import sys

import pytest

PY = sys.executable


@pytest.fixture
def is_root() -> bool:
    return os.geteuid() == 0
