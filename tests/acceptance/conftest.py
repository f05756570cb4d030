"""Fixtures of the acceptance items that run the real worker against the simulated controller
through the ``fleet_worker`` fixture (fleet_trio.sim.pytest_plugin)."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from fleet_trio.sim.harness import WorkerHandle
from tests.helpers import GPUBOX, dev, started


@pytest.fixture
def fleet_worker_config() -> dict[str, Any]:
    """``fleet_worker`` is the two-device ``gpubox`` (a test parametrizes it to change that)."""
    return GPUBOX


@pytest.fixture
async def sleeping_job(fleet_worker: WorkerHandle) -> str:
    """A ``sleep 30`` job that ``fleet_worker``'s worker has reported running on gpu0; its id."""
    with trio.fail_after(20):
        return await started(fleet_worker.controller, dev("gpu0"), ["sleep", "30"])
