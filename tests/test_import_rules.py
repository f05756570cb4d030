"""Import rules, each checked in a fresh interpreter (so nothing another test imported hides a
leak): the CLI imports no simulation-harness module unless the command needs it."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import fleet_trio.sim.controller

_PROBE = """
import contextlib, io, json, sys
from fleet_trio.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
    try:
        status = main(sys.argv[1:])
    except SystemExit as exc:
        status = exc.code
print(json.dumps({"status": status, "out": out.getvalue(),
                  "modules": sorted(m for m in sys.modules if m.startswith("fleet_trio"))}))
"""


def _run_cli(*argv: str) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, object] = json.loads(proc.stdout.splitlines()[-1])
    return result


@pytest.mark.parametrize(
    "argv",
    [
        ("--help",),
        ("node", "--help"),
        ("worker", "--help"),
        ("tail", "--help"),
        ("exec", "--help"),
        ("measure", "--help"),
        ("fake-gpu", "--help"),
    ],
    ids=["top", "node", "worker", "tail", "exec", "measure", "fake-gpu"],
)
def test_cli_help_of_a_production_command_imports_no_sim(argv: tuple[str, ...]) -> None:
    result = _run_cli(*argv)
    assert result["status"] in (0, None)
    assert "usage: fleet-trio" in str(result["out"])
    modules = result["modules"]
    assert isinstance(modules, list)
    assert [m for m in modules if m.startswith("fleet_trio.sim")] == []


def test_cli_running_a_production_command_imports_no_sim(tmp_path: Path) -> None:
    result = _run_cli("worker", "--check", "-c", str(tmp_path / "missing.yaml"))
    assert result["status"] == 1  # the config is missing: one error line, no traceback
    modules = result["modules"]
    assert isinstance(modules, list) and "fleet_trio.worker.config" in modules
    assert [m for m in modules if m.startswith("fleet_trio.sim")] == []


def test_cli_help_still_lists_the_harness_commands() -> None:
    result = _run_cli("--help")
    out = str(result["out"])
    for command in ("exec", "node", "measure", "worker", "tail", "sim", "demo", "fake-gpu"):
        assert f"    {command} " in out, command


@pytest.mark.parametrize(
    ("argv", "module"),
    [
        (("demo", "--help"), "fleet_trio.sim.demo.command"),
        (("sim", "--help"), "fleet_trio.sim.chaos_cli"),
    ],
    ids=["demo", "sim"],
)
def test_cli_a_harness_command_loads_its_parser(argv: tuple[str, ...], module: str) -> None:
    result = _run_cli(*argv)
    assert result["status"] in (0, None)
    modules = result["modules"]
    assert isinstance(modules, list) and module in modules
    assert [m for m in modules if m.startswith(("fleet_trio.node", "fleet_trio.worker"))] == []


def test_sim_controller_state_never_sees_http() -> None:
    """The simulated controller's state, transitions and faults import no web stack (read from
    their source): only its app speaks HTTP."""
    web = {"quart", "quart_trio", "hypercorn", "werkzeug", "h11", "httpx"}
    package = Path(fleet_trio.sim.controller.__file__).parent
    for name in ("records", "state", "protocol", "faults"):
        tree = ast.parse((package / f"{name}.py").read_text(encoding="utf-8"))
        imported = {
            alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.Import)
            for alias in node.names
        } | {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert {m.split(".")[0] for m in imported} & web == set(), name
        assert "fleet_trio.sim.controller.app" not in imported, name
