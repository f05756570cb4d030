"""The package's import rules (docs/architecture.md), checked in a fresh interpreter each.

A rule is a set of modules to import and the module prefixes that must then be absent from
``sys.modules``: the two roles (``fleet_trio.node``, ``fleet_trio.worker``) never import each
other, and nothing under the production packages imports the simulators (``fleet_trio.sim``).
A subpackage's every module is imported, so a lazy import inside a function is not checked;
a module-level one anywhere in the subpackage is. To add a rule, add a row to ``RULES`` (a
subpackage, or a single module such as ``cli``; several joined by ``+`` share one interpreter).

The CLI has rules of its own: ``--help`` and every production command import no simulation
module unless the command is a harness one (``demo``, ``sim``).
"""

from __future__ import annotations

import ast
import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import fleet_trio
import fleet_trio.sim.controller

PRODUCTION = ("node", "worker", "proc", "gpu", "logbus", "nursery")


def modules_of(name: str) -> list[str]:
    """``fleet_trio.<name>`` and, for a subpackage, every module under it (found on disk;
    walking into a nested package imports that package here, in the test process)."""
    root = f"fleet_trio.{name}"
    path = [os.path.join(p, *name.split(".")) for p in fleet_trio.__path__]
    if not any(os.path.isdir(p) for p in path):
        return [root]  # a single module
    found = pkgutil.walk_packages(path, prefix=root + ".")
    return [root] + [info.name for info in found if not info.name.endswith("__main__")]


# (what is imported: a subpackage or module under fleet_trio, packages that must not be loaded)
_ROLES = ("fleet_trio.node", "fleet_trio.worker", "fleet_trio.sim", "fleet_trio.cli")
LEAVES = ("edge", "auth", "metrics", "backoff", "errors", "durations", "inputs", "logs",
          "configfile", "confighints", "memory", "statedir")  # fmt: skip
_SHARED = ("fleet_trio.nursery", "fleet_trio.proc", "fleet_trio.gpu", "fleet_trio.logbus")
RULES: list[tuple[str, tuple[str, ...]]] = [
    ("worker", ("fleet_trio.node",)),
    ("node", ("fleet_trio.worker",)),
    *((sub, ("fleet_trio.sim",)) for sub in PRODUCTION),
    # the arrows of docs/architecture.md's picture point down: the shared packages never load
    # a role, the harness or the CLI, nor a package drawn beside or above them
    ("nursery", (*_ROLES, "fleet_trio.proc", "fleet_trio.gpu", "fleet_trio.logbus")),
    ("proc", (*_ROLES, "fleet_trio.nursery", "fleet_trio.gpu", "fleet_trio.logbus")),
    ("gpu", (*_ROLES, "fleet_trio.nursery", "fleet_trio.logbus")),
    ("logbus", (*_ROLES, "fleet_trio.nursery", "fleet_trio.gpu")),
    ("+".join(LEAVES), (*_ROLES, *_SHARED)),  # the leaves, in one interpreter
]

PROBE = """
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
print(json.dumps(sorted(m for m in sys.modules if m.startswith("fleet_trio"))))
"""


def loaded_after(modules: list[str], banned: tuple[str, ...]) -> list[str]:
    """The modules of ``banned`` (packages: themselves and everything under them) in
    ``sys.modules`` of a fresh interpreter after importing ``modules``."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *modules],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    under = tuple(b + "." for b in banned)
    return [m for m in json.loads(done.stdout) if m in banned or m.startswith(under)]


@pytest.mark.parametrize(
    ("subpackage", "banned"), RULES, ids=[f"{s[:20]}-not-{'+'.join(b)}" for s, b in RULES]
)
def test_subpackage_does_not_import(subpackage: str, banned: tuple[str, ...]) -> None:
    modules = [m for name in subpackage.split("+") for m in modules_of(name)]
    assert loaded_after(modules, banned) == []


def test_the_probe_sees_an_import() -> None:
    """The check itself: every module of a subpackage is found, and what it imports is seen."""
    assert {"fleet_trio.worker.config.loader", "fleet_trio.worker.relay"} <= set(
        modules_of("worker")
    )
    assert modules_of("edge") == ["fleet_trio.edge"]
    seen = loaded_after(["fleet_trio.worker.worker"], ("fleet_trio.worker",))
    assert "fleet_trio.worker.config" in seen


CLI_PROBE = """
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
        [sys.executable, "-c", CLI_PROBE, *argv], capture_output=True, text=True, timeout=60
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


@pytest.mark.parametrize(
    ("command", "server"),
    [
        ("node", "fleet_trio.node.server"),
        ("measure", "fleet_trio.node.measure"),
        ("worker", "fleet_trio.worker.worker"),
    ],
)
def test_a_config_error_answers_before_the_server_stack_loads(
    tmp_path: Path, command: str, server: str
) -> None:
    """A typo in the config is the newcomer's first error: its one line comes without loading
    the HTTP server and its web framework (about a second of imports on a busy machine)."""
    result = _run_cli(command, "-c", str(tmp_path / "missing.yaml"))
    assert result["status"] == 1
    assert "missing.yaml: cannot read" in str(result["out"])
    modules = result["modules"]
    assert isinstance(modules, list) and modules
    assert server not in modules and "fleet_trio.nursery.httpserve" not in modules


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


MODULE_LINES = 500


def test_a_module_over_500_lines_says_why_at_its_top() -> None:
    """Issue 18: no module over ~500 lines without a reason written at its top: a
    ``(Over 500 lines: …)`` paragraph within the first lines of its docstring."""
    package = Path(fleet_trio.__file__).parent
    silent = []
    for path in sorted(package.rglob("*.py")):
        lines = path.read_text(encoding="utf-8").splitlines()
        if len(lines) > MODULE_LINES and not any("(Over 500 lines:" in line for line in lines[:12]):
            silent.append(f"{path.relative_to(package)} ({len(lines)} lines)")
    assert silent == []
