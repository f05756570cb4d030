"""Every shipped example config passes its own check (issue 28 §6)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fleet_trio.cli import main
from fleet_trio.node.config import load_config

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
WORKER_CONFIGS = sorted(EXAMPLES.rglob("worker*.yaml"))
NODE_CONFIGS = sorted(EXAMPLES.rglob("node*.yaml"))


def test_the_examples_are_found() -> None:
    assert EXAMPLES / "worker.yaml" in WORKER_CONFIGS
    assert EXAMPLES / "node.yaml" in NODE_CONFIGS


@pytest.mark.parametrize("config", WORKER_CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
@pytest.mark.parametrize("where", ["checkout", "elsewhere"])
def test_worker_example_passes_check(
    config: Path,
    where: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``fleet-trio worker -c examples/worker.yaml --check`` as the docs write it (from the
    checkout), and from another folder with the file's full path."""
    monkeypatch.chdir(ROOT if where == "checkout" else tmp_path)
    path = os.path.relpath(config) if where == "checkout" else str(config)
    rc = main(["worker", "-c", path, "--check"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "error:" not in err


@pytest.mark.parametrize("config", NODE_CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_node_example_loads(config: Path) -> None:
    """The node has no --check: loading is its check (``fleet-trio node -c`` refuses a bad
    file before anything starts)."""
    cfg = load_config(config)
    assert cfg.tasks
