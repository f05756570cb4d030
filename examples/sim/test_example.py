"""Testing your own fleet-trio configs with the pytest fixtures (docs/sim.md).

Needs pytest-trio; run with ``pytest examples/sim``.
"""

from pathlib import Path
from typing import Any

import pytest
import trio

pytestmark = pytest.mark.trio

HERE = Path(__file__).parent


@pytest.fixture
def fleet_node_config() -> Path:
    return HERE / "node.yaml"


@pytest.fixture
def fleet_worker_config() -> Path:
    return HERE / "worker.yaml"


async def test_upper_returns_the_text_in_capitals(fleet_node: Any) -> None:
    job = await fleet_node.run("upper", {"text": "hello"})
    assert job["state"] == "done"
    assert job["data"] == {"text": "HELLO"}


async def test_upper_refuses_a_payload_without_text(fleet_node: Any) -> None:
    r = await fleet_node.dispatch("upper", {})
    assert r.status_code == 400
    assert r.json()["error"] == "upper payload: text required"


async def test_health_shows_what_the_fake_gpu_holds(fleet_node: Any, fake_gpu: Any) -> None:
    await fake_gpu.hold("30G")  # of 80 GiB: 50 GiB stay free
    with trio.fail_after(5):  # the node samples every 200 ms (node.yaml)
        while True:
            health = await fleet_node.health()
            if health["vram_free_gb"] < 50.5:
                break
            await trio.sleep(0.05)
    assert health["vram_free_gb"] > 49.5


async def test_the_dispatcher_places_a_job_on_the_node(dispatcher: Any, fleet_node: Any) -> None:
    record = await dispatcher.submit("upper", payload={"text": "fleet"})
    record = await dispatcher.wait(record.job_id, timeout=10)
    assert record.state == "done"
    assert record.node == fleet_node.url
    assert record.result == {"text": "FLEET"}


async def test_a_job_runs_on_the_worker(fleet_worker: Any) -> None:
    job = await fleet_worker.run("gpu0", ["sh", "-c", "echo $RC_DEVICE"])
    assert job.state == "succeeded"
    assert fleet_worker.logs(job.job_id) == b"example-box:gpu0\n"
