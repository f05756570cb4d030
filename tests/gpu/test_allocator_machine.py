"""The device allocator (``fleet_trio.gpu.allocator``) as a Hypothesis state machine.

The test keeps its own model of the devices (usable, free VRAM, settling) and of the jobs
(queued in order, or holding devices) and checks after every step:

* a device is never given to two jobs, and a job holds exactly ``count`` distinct devices;
* no queued job fits what is free (every queued job gets a device as soon as one fits);
* the queue is served in arrival order among the jobs that fit;
* at the end, once every job is released and every device is fresh and empty, the queue is
  empty: every queued job eventually got a device.

Releases go through every path a job can end on (done, error, interrupted while running or
while queued, spawn failure): the allocator sees one ``release`` for each.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    rule,
)

from fleet_trio.gpu.allocator import AllocationError, DeviceAllocator

UUIDS = ("GPU-a", "GPU-b", "GPU-c")
TOTAL = 80.0
PATHS = ("done", "error", "interrupted", "spawn-failure")


class AllocatorMachine(RuleBasedStateMachine):
    tickets = Bundle("tickets")

    def __init__(self) -> None:
        super().__init__()
        self.alloc = DeviceAllocator(UUIDS)
        self.usable = dict.fromkeys(UUIDS, True)
        self.free: dict[str, float | None] = dict.fromkeys(UUIDS, None)
        self.settling = dict.fromkeys(UUIDS, False)
        self.jobs: dict[int, tuple[int, float | None]] = {}  # ticket -> (count, need per dev)
        self.order: list[int] = []
        self.released: set[int] = set()
        self.known_total = False  # a total is known once a device was sampled
        self._waiting_before: set[int] = set()

    # -- the model's fit rule (written from the docs, not from the allocator) ---------------
    def _need(self, ticket: int) -> float | None:
        _count, need = self.jobs[ticket]
        if need is None or (self.known_total and need > TOTAL):
            return None
        return need

    def _free_devices(self) -> list[str]:
        held = self.alloc.holders()
        return [u for u in UUIDS if u not in held and self.usable[u]]

    def _fits(self, ticket: int, older_need_waits: bool) -> bool:
        count, _ = self.jobs[ticket]
        need = self._need(ticket)
        ok = []
        for u in self._free_devices():
            if need is None:
                if not (self.settling[u] and older_need_waits):
                    ok.append(u)
            elif not self.settling[u] and self.free[u] is not None and self.free[u] >= need:  # type: ignore[operator]
                ok.append(u)
        return len(ok) >= count

    def _after(self) -> None:
        """Every job granted by the last step got devices that fit it."""
        waiting_before = [t for t in self.order if t in self._waiting_before]
        for ticket in self.alloc.take_granted():
            held = self.alloc.granted(ticket)
            assert held is not None
            need = self._need(ticket)
            older = waiting_before[: waiting_before.index(ticket)]
            older_need_waits = any(
                self._need(t) is not None and self.alloc.granted(t) is None for t in older
            )
            for u in held:
                assert self.usable[u], f"{u} is stale but was given to {ticket}"
                if need is None:
                    assert not (self.settling[u] and older_need_waits), (
                        f"{u} settling given to {ticket} ahead of an older job with a footprint"
                    )
                else:
                    assert not self.settling[u], f"{u} settling given to {ticket}"
                    free = self.free[u]
                    assert free is not None and free >= need, f"{u} too small for {ticket}"
        self._waiting_before = set(self.alloc.waiting())

    # -- rules --------------------------------------------------------------------------------
    @rule(
        target=tickets,
        count=st.integers(min_value=1, max_value=3),
        need=st.none() | st.floats(min_value=0.5, max_value=100.0),
    )
    def submit(self, count: int, need: float | None) -> int:
        ticket = self.alloc.request(count, need)
        self._waiting_before.add(ticket)
        self.jobs[ticket] = (count, None if need is None else need / count)
        self.order.append(ticket)
        self._after()
        return ticket

    @rule(ticket=consumes(tickets), path=st.sampled_from(PATHS))
    def end(self, ticket: int, path: str) -> None:
        # every path is one release: done / error / interrupted (queued or running) / spawn
        held = self.alloc.granted(ticket)
        got = self.alloc.release(ticket)
        assert got == (held or ())
        for u in got:
            self.settling[u] = self.free[u] is not None
        self.released.add(ticket)
        self.order.remove(ticket)
        assert self.alloc.granted(ticket) is None
        assert ticket not in self.alloc.waiting()
        self._after()

    @rule(ticket=tickets)
    def release_twice_is_harmless(self, ticket: int) -> None:
        if ticket in self.released:
            assert self.alloc.release(ticket) == ()

    @rule(
        device=st.sampled_from(UUIDS),
        free=st.floats(min_value=0.0, max_value=TOTAL),
    )
    def sample(self, device: str, free: float) -> None:
        self.alloc.update(device, usable=True, free_gb=free, total_gb=TOTAL)
        self.usable[device], self.free[device], self.settling[device] = True, free, False
        self.known_total = True
        self._after()

    @rule(device=st.sampled_from(UUIDS))
    def goes_stale(self, device: str) -> None:
        self.alloc.update(device, usable=False)
        self.usable[device] = False
        self._after()

    @rule()
    def too_many_devices_is_refused(self) -> None:
        with pytest.raises(AllocationError):
            self.alloc.request(len(UUIDS) + 1)
        with pytest.raises(AllocationError):
            self.alloc.request(0)

    # -- invariants -----------------------------------------------------------------------------
    @invariant()
    def a_device_is_never_given_to_two_jobs(self) -> None:
        seen: dict[str, int] = {}
        for ticket in self.order:
            held = self.alloc.granted(ticket)
            if held is None:
                continue
            assert len(held) == self.jobs[ticket][0] == len(set(held))
            for u in held:
                assert u not in seen, f"{u} given to {seen[u]} and {ticket}"
                seen[u] = ticket
                assert self.alloc.holders()[u] == ticket
        assert set(self.alloc.holders()) == set(seen)

    @invariant()
    def no_queued_job_fits_what_is_free(self) -> None:
        older_need_waits = False
        for ticket in self.alloc.waiting():
            assert not self._fits(ticket, older_need_waits), f"job {ticket} fits but waits"
            older_need_waits = older_need_waits or self._need(ticket) is not None

    @invariant()
    def every_job_is_queued_or_holds(self) -> None:
        waiting = self.alloc.waiting()
        assert waiting == [t for t in self.order if t in waiting]  # arrival order
        for ticket in self.order:
            assert (ticket in waiting) != (self.alloc.granted(ticket) is not None)

    def teardown(self) -> None:
        # every queued job eventually gets a device once one fits: release the running ones
        # (they end), make every device fresh and empty, and the queue must drain
        for _ in range(len(self.order) + 1):
            running = [t for t in self.order if self.alloc.granted(t) is not None]
            for ticket in running:
                self.alloc.release(ticket)
                self.order.remove(ticket)
            for u in UUIDS:
                self.alloc.update(u, usable=True, free_gb=TOTAL, total_gb=TOTAL)
        assert self.alloc.waiting() == []
        assert self.alloc.holders() == {}


AllocatorMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40)
test_allocator_machine = AllocatorMachine.TestCase
