"""Failure injection on the simulated controller's worker routes (E1–E7): answer the next
requests with an error status or a verbatim body, close their connections unanswered, or
delay every request. A plain sync plan; the app (:mod:`.app`) consults it per request."""

from __future__ import annotations

import attrs

from fleet_trio.sim.controller.records import ENDPOINTS


def check_endpoint(endpoint: str) -> str:
    if endpoint not in ENDPOINTS:
        raise ValueError(f"unknown endpoint {endpoint!r}; one of {', '.join(ENDPOINTS)}")
    return endpoint


@attrs.define
class Fault:
    endpoint: str
    status: int | None  # None: drop the connection
    count: int
    body: bytes | None = None  # None: the standard injected error body


@attrs.define
class FaultPlan:
    """The injected failures still to happen, and the per-endpoint latency."""

    faults: list[Fault] = attrs.Factory(list)
    latency: dict[str, float] = attrs.Factory(dict)

    def fail_next(self, endpoint: str, status: int, count: int, body: bytes | None) -> None:
        self.faults.append(Fault(check_endpoint(endpoint), status, count, body))

    def drop_next(self, endpoint: str, count: int) -> None:
        self.faults.append(Fault(check_endpoint(endpoint), None, count))

    def set_latency(self, endpoint: str, seconds: float) -> None:
        self.latency[check_endpoint(endpoint)] = seconds

    def delay(self, endpoint: str) -> float:
        return self.latency.get(endpoint, 0.0)

    def take(self, endpoint: str) -> Fault | None:
        """The fault for this request to ``endpoint``, if one is due (it is used up)."""
        for f in self.faults:
            if f.endpoint == endpoint:
                f.count -= 1
                if f.count <= 0:
                    self.faults.remove(f)
                return f
        return None
