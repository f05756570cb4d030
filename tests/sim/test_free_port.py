"""``free_port`` picks a port the kernel never hands out by itself (``fleet_trio.sim.fleet``)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from fleet_trio.sim import fleet


def ephemeral_range() -> tuple[int, int]:
    with open(fleet.EPHEMERAL_RANGE) as f:
        low, high = f.read().split()[:2]
    return int(low), int(high)


def test_the_port_is_free_and_outside_the_ephemeral_range() -> None:
    """Outside the range, no server binding port 0 and no outgoing connection can be handed the
    port between the pick and the bind it was picked for (a worker's tail port went to a test's
    simulated controller that way)."""
    low, high = ephemeral_range()
    ports = {fleet.free_port() for _ in range(20)}
    assert all(p >= fleet.FREE_PORT_FLOOR and not low <= p <= high for p in ports), ports
    assert len(ports) > 1  # picked at random, not one fixed port
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free


def ephemeral_range_is(monkeypatch: pytest.MonkeyPatch, folder: Path, text: str) -> None:
    """``free_port`` reads ``text`` as the kernel's ephemeral range."""
    path = folder / "ip_local_port_range"
    path.write_text(text)
    monkeypatch.setattr(fleet, "EPHEMERAL_RANGE", str(path))


def test_without_room_outside_the_range_the_kernel_picks(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ephemeral_range_is(monkeypatch, tmp_path, "1024\t65535\n")
    port = fleet.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_a_range_starting_low_still_leaves_the_ports_above_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ephemeral_range_is(monkeypatch, tmp_path, "1024 60999\n")
    assert all(fleet.free_port() > 60999 for _ in range(10))
