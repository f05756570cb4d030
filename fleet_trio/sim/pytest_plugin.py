"""pytest fixtures for testing task configs, hooks and verify scripts (docs/sim.md).

Registered through the ``pytest11`` entry point ``fleet_trio``, so installing fleet-trio makes
these fixtures available to every test session: ``fake_gpu``, ``rc_controller``,
``fleet_node``, ``fleet_worker`` and ``dispatcher`` (each described below), configured by
fixtures a test overrides (conftest, module, class, or ``@pytest.mark.parametrize``):
``fake_gpus``, ``fleet_node_config``, ``fleet_worker_config``.

The instance fixtures are ``async`` and need pytest-trio (``trio_mode = true`` or
``@pytest.mark.trio``). This module imports nothing but pytest at import time, so it costs
nothing in test sessions that do not use it.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from fleet_trio.sim.controller import SimController
    from fleet_trio.sim.dispatcher import SimDispatcher
    from fleet_trio.sim.harness import FakeGpuDir, NodeHandle, WorkerHandle


def _resolve(config: Any, request: pytest.FixtureRequest) -> Any:
    """A relative path is taken relative to the requesting test file's folder."""
    if isinstance(config, str | os.PathLike):
        path = Path(config)
        if not path.is_absolute():
            path = Path(request.path).parent / path
        return path
    return config


@pytest.fixture
def fleet_node_config() -> Any:
    """What ``fleet_node`` is configured from: a node YAML path (relative to the test file's
    folder), the parsed YAML as a mapping, a ``NodeConfig``, or ``None`` for the built-in
    ``echo`` task. Override it to test your own config."""
    return None


@pytest.fixture
def fleet_worker_config() -> Any:
    """What ``fleet_worker`` is configured from: a ``worker.yaml`` path (relative to the test
    file's folder), a mapping, a ``WorkerConfig``, or ``None`` for host ``sim-host`` with
    devices ``gpu0`` and ``gpu1``. ``controller_url`` and ``token`` are replaced."""
    return None


@pytest.fixture
def fake_gpus() -> int:
    """How many devices ``fake_gpu`` presents (default 1); override it (or parametrize it) to
    test a multi-GPU node."""
    return 1


@pytest.fixture
async def fake_gpu(tmp_path: Path, fake_gpus: int) -> AsyncIterator[FakeGpuDir]:
    """A fake GPU of ``fake_gpus`` devices of 80 GiB each in ``tmp_path/fake-gpu/gpu0`` …"""
    from fleet_trio.sim.harness import open_fake_gpu

    async with open_fake_gpu(tmp_path / "fake-gpu", devices=fake_gpus) as gpu:
        yield gpu


@pytest.fixture
async def rc_controller() -> AsyncIterator[SimController]:
    """A simulated rc controller serving on 127.0.0.1 (``.base_url``), worker token ``wtok``."""
    from fleet_trio.sim.harness import open_controller

    async with open_controller() as ctrl:
        yield ctrl


@pytest.fixture
async def fleet_node(
    fleet_node_config: Any, fake_gpu: FakeGpuDir, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[NodeHandle]:
    """A running node (``.url``, ``.client``, ``.dispatch``, ``.wait``, ``.run``, …)."""
    from fleet_trio.sim.harness import open_node

    config = _resolve(fleet_node_config, request)
    async with open_node(config, fake_gpu=fake_gpu, workdir=tmp_path / "fleet-node") as node:
        yield node


@pytest.fixture
async def fleet_worker(
    fleet_worker_config: Any,
    rc_controller: SimController,
    fake_gpu: FakeGpuDir,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> AsyncIterator[WorkerHandle]:
    """A running worker registered with ``rc_controller`` (``.submit``, ``.wait``, ``.run``,
    ``.logs``, ``.controller``, ``.worker``)."""
    from fleet_trio.sim.harness import open_worker

    config = _resolve(fleet_worker_config, request)
    async with open_worker(
        config, rc_controller, fake_gpu=fake_gpu, workdir=tmp_path / "fleet-worker"
    ) as worker:
        yield worker


@pytest.fixture
async def dispatcher(fleet_node: NodeHandle) -> AsyncIterator[SimDispatcher]:
    """A simulated Fleet Dispatcher over ``fleet_node`` (first health round done)."""
    from fleet_trio.sim.harness import open_dispatcher

    async with open_dispatcher([fleet_node.url], health_interval=0.2, poll_interval=0.05) as disp:
        yield disp
