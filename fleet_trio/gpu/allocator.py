"""The node's device allocator: which GPU job runs on which device (docs/node.md, multi-GPU).

A plain synchronous state machine (no trio, no I/O): :class:`fleet_trio.node.placement.Placement`
drives it from the job runner and the VRAM sampler, and the Hypothesis state machine in
``tests/gpu/test_allocator_machine.py`` checks its invariants.

Rules:

* A request asks for ``count`` devices (``gpu: true`` is 1, ``gpus: N`` is N) and optionally
  ``need_gb``, the job's known footprint (for a multi-device job, ``need_gb / count`` on each).
* A device is given to one request at a time, and only while it is *usable* (its last VRAM
  sample is fresh: a device that fails to read is skipped, the others go on).
* With a footprint, a device also needs ``free_gb >= need`` from a sample taken *after* its
  last release (a device just released is *settling*: its free value still counts the job that
  left it). A footprint larger than every device's total cannot be met by waiting; it is
  ignored (the request then takes any usable device).
* Requests are served in arrival order, first fit: the oldest request that fits the devices
  left is granted first. A request without a footprint does not take a settling device while
  an older request with a footprint waits, so a big job is not starved by small ones racing
  the next sample.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import attrs


class AllocationError(ValueError):
    """A request that can never be granted (more devices than the node has, count < 1)."""


@attrs.define
class DeviceSlot:
    """What the allocator knows about one device."""

    uuid: str
    usable: bool = True
    free_gb: float | None = None
    """Free VRAM from the last fresh sample; ``None`` when unknown."""
    total_gb: float | None = None
    settling: bool = False
    holder: int | None = None
    """The ticket that holds the device, ``None`` when free."""


@attrs.define
class Request:
    ticket: int
    count: int
    need_gb: float | None
    """Per device (the job's footprint divided by ``count``), ``None``: no requirement."""


class DeviceAllocator:
    """Devices (by UUID, in index order) handed to tickets. See the module docstring."""

    def __init__(self, uuids: Sequence[str]) -> None:
        if not uuids:
            raise AllocationError("no devices to allocate")
        if len(set(uuids)) != len(uuids):
            raise AllocationError(f"duplicate device ids: {list(uuids)}")
        self._slots = {u: DeviceSlot(u) for u in uuids}
        self._queue: list[Request] = []
        self._grants: dict[int, tuple[str, ...]] = {}
        self._fresh_grants: list[int] = []
        self._tickets = itertools.count(1)

    # -- views ------------------------------------------------------------------------------
    @property
    def uuids(self) -> tuple[str, ...]:
        return tuple(self._slots)

    def slot(self, uuid: str) -> DeviceSlot:
        return self._slots[uuid]

    def waiting(self) -> list[int]:
        """Queued tickets, oldest first."""
        return [r.ticket for r in self._queue]

    def granted(self, ticket: int) -> tuple[str, ...] | None:
        """The devices held by ``ticket``, ``None`` when it holds none (queued or gone)."""
        return self._grants.get(ticket)

    def holders(self) -> dict[str, int]:
        return {u: s.holder for u, s in self._slots.items() if s.holder is not None}

    def take_granted(self) -> list[int]:
        """Tickets granted since the last call (the async side wakes their waiters)."""
        out, self._fresh_grants = self._fresh_grants, []
        return out

    # -- requests ---------------------------------------------------------------------------
    def request(self, count: int = 1, need_gb: float | None = None) -> int:
        """Queue a request; returns its ticket (it may be granted at once: see ``granted``).

        :class:`AllocationError` when ``count`` is below 1 or above the node's device count.
        """
        if count < 1:
            raise AllocationError(f"a GPU job takes at least 1 device, asked for {count}")
        if count > len(self._slots):
            raise AllocationError(
                f"asked for {count} GPUs but this node has {len(self._slots)} device(s)"
            )
        per_device: float | None = None
        if need_gb is not None and math.isfinite(need_gb) and need_gb > 0:
            per_device = need_gb / count
        ticket = next(self._tickets)
        self._queue.append(Request(ticket, count, per_device))
        self._pump()
        return ticket

    def release(self, ticket: int) -> tuple[str, ...]:
        """End ``ticket`` on any path (done, error, interrupted, spawn failure, or still
        queued): its devices (if any) become free and settling, a queued ticket leaves the
        queue. Idempotent; returns the devices it held."""
        self._queue = [r for r in self._queue if r.ticket != ticket]
        held = self._grants.pop(ticket, ())
        for uuid in held:
            slot = self._slots[uuid]
            slot.holder = None
            slot.settling = slot.free_gb is not None
        self._pump()
        return held

    def update(
        self,
        uuid: str,
        *,
        usable: bool,
        free_gb: float | None = None,
        total_gb: float | None = None,
    ) -> None:
        """A new view of a device from the sampler: fresh (``usable``) or not, and its VRAM."""
        slot = self._slots.get(uuid)
        if slot is None:
            return
        slot.usable = usable
        if usable:
            slot.free_gb = free_gb
            slot.total_gb = total_gb if total_gb is not None else slot.total_gb
            slot.settling = False
        self._pump()

    # -- the rule ---------------------------------------------------------------------------
    def _need(self, req: Request, largest: float | None) -> float | None:
        """The request's per-device need, or ``None`` when none applies (or none can ever
        be met: larger than ``largest``, the largest known device total)."""
        need = req.need_gb
        if need is None or (largest is not None and need > largest):
            return None
        return need

    def fits(self, slot: DeviceSlot, need: float | None, older_need_waits: bool) -> bool:
        """Whether a free slot can serve a request with per-device ``need``."""
        if slot.holder is not None or not slot.usable:
            return False
        if need is None:
            return not (slot.settling and older_need_waits)
        return not slot.settling and slot.free_gb is not None and slot.free_gb >= need

    def _pump(self) -> None:
        """Grant what the line allows now. Cheap when nothing can be granted (every device
        held or stale, the common case with a long line): the node calls it at each ack."""
        free = [s for s in self._slots.values() if s.holder is None and s.usable]
        if not free or not self._queue:
            return
        totals = [s.total_gb for s in self._slots.values() if s.total_gb is not None]
        largest = max(totals) if totals else None
        older_need_waits = False
        still: list[Request] = []
        for at, req in enumerate(self._queue):
            if not free:  # the rest waits, in its order
                still.extend(self._queue[at:])
                break
            need = self._need(req, largest)
            chosen = [s for s in free if self.fits(s, need, older_need_waits)][: req.count]
            if len(chosen) < req.count:
                still.append(req)
                older_need_waits = older_need_waits or need is not None
                continue
            for slot in chosen:
                slot.holder = req.ticket
            free = [s for s in free if s.holder is None]
            self._grants[req.ticket] = tuple(s.uuid for s in chosen)
            self._fresh_grants.append(req.ticket)
        self._queue = still


__all__ = ["AllocationError", "DeviceAllocator", "DeviceSlot", "Request"]
