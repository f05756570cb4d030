"""The simulated controller's failure plan on its own: a plain sync object (no HTTP)."""

from __future__ import annotations

import pytest

from fleet_trio.sim.controller.faults import FaultPlan


def test_a_fault_is_used_up_after_count_requests_and_first_set_goes_first() -> None:
    plan = FaultPlan()
    plan.fail_next("status", 503, 2, None)
    plan.drop_next("status", 1)
    taken = [plan.take("status") for _ in range(4)]
    assert [f.status if f else "none" for f in taken] == [503, 503, None, "none"]
    assert plan.take("register") is None  # another endpoint is untouched
    assert plan.faults == []


def test_latency_per_endpoint_and_zero_clears() -> None:
    plan = FaultPlan()
    plan.set_latency("heartbeat", 0.5)
    assert (plan.delay("heartbeat"), plan.delay("logs")) == (0.5, 0.0)
    plan.set_latency("heartbeat", 0)
    assert plan.delay("heartbeat") == 0


@pytest.mark.parametrize("endpoint", ["", "Status", "status\n", "relay"])
def test_an_unknown_endpoint_is_refused_with_the_known_ones_named(endpoint: str) -> None:
    plan = FaultPlan()
    with pytest.raises(ValueError, match="one of register, labels, heartbeat"):
        plan.fail_next(endpoint, 503, 1, None)
    with pytest.raises(ValueError, match="unknown endpoint"):
        plan.drop_next(endpoint, 1)
    assert plan.faults == []


async def test_the_transitions_run_without_http() -> None:
    """E1 and E5 straight on the state: what the app would send is a plain Reply."""
    from fleet_trio.sim.controller import SimController, protocol

    ctrl = SimController()
    reply = protocol.register(ctrl, b'{"host": "h", "devices": [{"name": "gpu0"}]}')
    assert (reply.status, reply.json) == (200, True)
    assert ctrl.device("h:gpu0").state == "ready"
    job_id = ctrl.submit("h:gpu0", ["true"])
    assert ctrl.job(job_id).state == "assigned"
    refused = protocol.status(ctrl, job_id, b'{"worker_id": "someone", "state": "running"}')
    assert (refused.status, refused.json) == (403, True)
    assert b"not_job_owner" in refused.body
    assert protocol.reply_empty(204).body == b""
