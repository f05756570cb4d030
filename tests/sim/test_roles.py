"""The sim's role launcher (``fleet_trio.sim.roles``): a node or worker in a process of its own."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from fleet_trio import cli
from fleet_trio.sim import roles


@pytest.mark.parametrize("role", ["node", "worker"])
def test_a_role_process_absorbs_late_signals(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, role: str
) -> None:
    """The launcher's process is the role's alone, as the console script's is: once its task
    tree has closed, a late second SIGTERM must be ignored, not end a clean shutdown by its
    default action (a chaos seed saw a worker exit -15 that way)."""
    seen: list[argparse.Namespace] = []

    def fake(args: argparse.Namespace, **_: Any) -> int:
        seen.append(args)
        return 0

    monkeypatch.setattr(cli, "_cmd_node" if role == "node" else "_cmd_worker", fake)
    cfg = tmp_path / "x.yaml"
    cfg.write_text("{}\n")
    assert roles.main(["--", role, "-c", str(cfg)]) == 0
    assert [getattr(a, "own_process", None) for a in seen] == [True]
