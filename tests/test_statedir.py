"""fleet-trio's state directory and the ``${XDG_STATE_HOME}`` expansion of config paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet_trio.node.config import expand_path
from fleet_trio.statedir import expand_vars, state_dir


def test_state_dir_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    assert state_dir() == f"{tmp_path}/.local/state/fleet-trio"
    monkeypatch.setenv("XDG_STATE_HOME", "relative/is/ignored")
    assert state_dir() == f"{tmp_path}/.local/state/fleet-trio"
    monkeypatch.setenv("XDG_STATE_HOME", "/srv/state")
    assert state_dir() == "/srv/state/fleet-trio"
    monkeypatch.setenv("STATE_DIRECTORY", "/var/lib/fleet-trio:/var/lib/other")  # systemd
    assert state_dir() == "/var/lib/fleet-trio"


def test_config_paths_expand_xdg_state_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    path = "${XDG_STATE_HOME}/fleet-trio/footprints.json"
    assert expand_path(path, "/cfg") == f"{tmp_path}/.local/state/fleet-trio/footprints.json"
    monkeypatch.setenv("XDG_STATE_HOME", "/s")
    assert expand_path(path, "/cfg") == "/s/fleet-trio/footprints.json"
    assert expand_vars("$HOME/x $OTHER") == "$HOME/x $OTHER"  # nothing else is expanded
