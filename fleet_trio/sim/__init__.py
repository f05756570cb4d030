"""The simulated rc controller (test infrastructure; see docs/sim-controller.md)."""

from fleet_trio.sim.controller import (
    ENDPOINTS,
    INSTANCE_HEADER,
    Device,
    Event,
    Job,
    RequestRecord,
    SimController,
    SimError,
    Worker,
    create_app,
    serve_controller,
)

__all__ = [
    "ENDPOINTS",
    "INSTANCE_HEADER",
    "Device",
    "Event",
    "Job",
    "RequestRecord",
    "SimController",
    "SimError",
    "Worker",
    "create_app",
    "serve_controller",
]
