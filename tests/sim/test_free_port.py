"""``free_port`` picks a port the kernel never hands out by itself (``fleet_trio.sim.fleet``)."""

from __future__ import annotations

import socket

import pytest

from fleet_trio.sim import fleet


def ephemeral_low() -> int:
    with open(fleet.EPHEMERAL_RANGE) as f:
        return int(f.read().split()[0])


def test_the_port_is_free_and_below_the_ephemeral_range() -> None:
    """Below the range, no server binding port 0 and no outgoing connection can be handed the
    port between the pick and the bind it was picked for (a worker's tail port went to a test's
    simulated controller that way)."""
    low = ephemeral_low()
    if low - 1 <= fleet.FREE_PORT_FLOOR:
        pytest.skip(f"no room below the ephemeral range (it starts at {low})")
    ports = {fleet.free_port() for _ in range(20)}
    assert all(fleet.FREE_PORT_FLOOR <= p < low for p in ports), ports
    assert len(ports) > 1  # picked at random, not one fixed port
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free


def test_without_room_below_the_range_the_kernel_picks(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    squeezed = tmp_path / "range"
    squeezed.write_text("1024\t65000\n")
    monkeypatch.setattr(fleet, "EPHEMERAL_RANGE", str(squeezed))
    port = fleet.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
