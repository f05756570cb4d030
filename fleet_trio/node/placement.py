"""GPU placement on the node: the async side of :class:`fleet_trio.gpu.allocator.DeviceAllocator`
(docs/node.md, "Multi-GPU nodes").

The node takes a job's place in line at its ack (:meth:`Placement.reserve`); the runner
waits for the devices with ``async with placement.acquire(ticket=...) as uuids`` before it
spawns the job and gives them back when the job ends, whatever the path (done, error,
interrupted, spawn failure, or never run: a refused ack, a shutdown before its start). The
device sampler feeds each round's per-device view into :meth:`Placement.update`, which wakes
the queued jobs that now fit.

A job runs with ``CUDA_VISIBLE_DEVICES`` and ``NVIDIA_VISIBLE_DEVICES`` set to its devices'
UUIDs (:func:`pin_env`), so CUDA's own device ordering never matters.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Protocol

import trio

from fleet_trio.gpu.allocator import AllocationError, DeviceAllocator

PIN_VARIABLES = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")


class DeviceLike(Protocol):
    @property
    def uuid(self) -> str: ...


class SnapshotLike(Protocol):
    @property
    def total_gb(self) -> float: ...
    @property
    def free_gb(self) -> float: ...


class Placement:
    """Devices handed to GPU jobs, FIFO, one job per device.

    ``Placement.single()`` is the node without device information (a stand-in sampler): one
    anonymous device, no VRAM known, so footprints are not checked and nothing is pinned.
    """

    def __init__(self, uuids: Sequence[str], *, knows_vram: bool = True) -> None:
        self.allocator = DeviceAllocator(uuids)
        self.knows_vram = knows_vram
        self._events: dict[int, trio.Event] = {}

    @classmethod
    def single(cls) -> Placement:
        return cls([""], knows_vram=False)

    @property
    def uuids(self) -> tuple[str, ...]:
        return self.allocator.uuids

    @property
    def queued(self) -> int:
        """GPU jobs waiting for a device."""
        return len(self.allocator.waiting())

    def update(self, device: DeviceLike, snap: SnapshotLike | None) -> None:
        """A sampling round's view of ``device``: fresh (``snap``) or stale/unknown (``None``)."""
        if snap is None:
            self.allocator.update(device.uuid, usable=False)
        else:
            self.allocator.update(
                device.uuid, usable=True, free_gb=snap.free_gb, total_gb=snap.total_gb
            )
        self._wake()

    def _wake(self) -> None:
        for ticket in self.allocator.take_granted():
            event = self._events.get(ticket)
            if event is not None:
                event.set()

    def reserve(self, count: int = 1, need_gb: float | None = None) -> int:
        """Take a place in line now for ``count`` devices that fit ``need_gb`` (sync); the
        ticket for :meth:`acquire`. The node reserves at a job's ack, so jobs are placed in
        the order the node acked them, whichever of their runners asks first. The ticket
        may be granted at once; it must end with :meth:`release` (``acquire`` releases it).

        Raises :class:`~fleet_trio.gpu.allocator.AllocationError` at once for a request that
        can never be met (more devices than the node has).
        """
        if not self.knows_vram:
            need_gb = None
        ticket = self.allocator.request(count, need_gb)
        self._wake()
        return ticket

    def release(self, ticket: int) -> None:
        """End ``ticket`` (queued, granted or already ended: idempotent); its devices, if any,
        go to the next in line."""
        self._events.pop(ticket, None)
        self.allocator.release(ticket)
        self._wake()

    @asynccontextmanager
    async def acquire(
        self,
        count: int = 1,
        need_gb: float | None = None,
        *,
        ticket: int | None = None,
        on_wait: Callable[[], None] | None = None,
    ) -> AsyncIterator[tuple[str, ...]]:
        """Wait (FIFO) for ``count`` devices that fit ``need_gb``, or for the devices of a
        ``ticket`` from :meth:`reserve` (its own count and need apply); hold them for the
        block, and release the ticket after it on every path.

        Raises :class:`~fleet_trio.gpu.allocator.AllocationError` at once for a request that
        can never be met (more devices than the node has), or for a ticket already released.
        """
        if ticket is None:
            ticket = self.reserve(count, need_gb)
        try:
            held = self.allocator.granted(ticket)
            if held is None:
                if ticket not in self.allocator.waiting():
                    raise AllocationError(f"placement ticket {ticket} was released")
                event = trio.Event()
                self._events[ticket] = event
                if on_wait is not None:
                    on_wait()
                await event.wait()
                held = self.allocator.granted(ticket)
                assert held is not None
            else:
                await trio.lowlevel.checkpoint()
            yield held
        finally:
            self.release(ticket)


def pin_env(uuids: Iterable[str]) -> dict[str, str]:
    """``CUDA_VISIBLE_DEVICES`` / ``NVIDIA_VISIBLE_DEVICES`` for the devices; ``{}`` when a
    device has no UUID (the anonymous device of :meth:`Placement.single`)."""
    ids = list(uuids)
    if not ids or not all(ids):
        return {}
    value = ",".join(ids)
    return dict.fromkeys(PIN_VARIABLES, value)


class FootprintsLike(Protocol):
    def entries(self) -> Sequence[Any]: ...


def footprint_need(
    footprints: FootprintsLike | None, family: str, quant: str, task: str
) -> float | None:
    """The VRAM (GiB, as advertised) a job of this key is known to need: its exact
    ``(family, quant, task)`` entry, else the largest entry of its family; ``None`` when no
    footprint is known. Reads the store's memory only (no I/O)."""
    if footprints is None or not family:
        return None
    exact: float | None = None
    largest: float | None = None
    for entry in footprints.entries():
        wire: Mapping[str, Any] = entry.to_wire() if hasattr(entry, "to_wire") else entry
        if wire.get("model_family") != family:
            continue
        peak = wire.get("vram_peak_gb")
        if isinstance(peak, bool) or not isinstance(peak, int | float):
            continue
        if not (math.isfinite(peak) and peak > 0):
            continue
        if wire.get("quant", "") == quant and wire.get("task_type", "") == task:
            exact = float(peak)
        largest = float(peak) if largest is None else max(largest, float(peak))
    return exact if exact is not None else largest


__all__ = [
    "PIN_VARIABLES",
    "AllocationError",
    "Placement",
    "footprint_need",
    "pin_env",
]
