"""The package's import rules (docs/architecture.md), checked in a fresh interpreter each.

A rule is a set of modules to import and the module prefixes that must then be absent from
``sys.modules``: the two roles (``fleet_trio.node``, ``fleet_trio.worker``) never import each
other, and nothing under the production packages imports the simulators (``fleet_trio.sim``).
A subpackage's every module is imported, so a lazy import inside a function is not checked;
a module-level one anywhere in the subpackage is. To add a rule, add a row to ``RULES`` (a
subpackage, or a single module such as ``cli``).
"""

from __future__ import annotations

import json
import os
import pkgutil
import subprocess
import sys

import pytest

import fleet_trio

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
RULES: list[tuple[str, tuple[str, ...]]] = [
    ("worker", ("fleet_trio.node",)),
    ("node", ("fleet_trio.worker",)),
    *((sub, ("fleet_trio.sim",)) for sub in PRODUCTION),
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


@pytest.mark.parametrize(("subpackage", "banned"), RULES, ids=[f"{s}-{b[0]}" for s, b in RULES])
def test_subpackage_does_not_import(subpackage: str, banned: tuple[str, ...]) -> None:
    modules = modules_of(subpackage)
    assert loaded_after(modules, banned) == []


def test_the_probe_sees_an_import() -> None:
    """The check itself: every module of a subpackage is found, and what it imports is seen."""
    assert {"fleet_trio.worker.config.loader", "fleet_trio.worker.relay"} <= set(
        modules_of("worker")
    )
    assert modules_of("edge") == ["fleet_trio.edge"]
    assert "fleet_trio.worker.config" in loaded_after(["fleet_trio.worker"], ("fleet_trio.worker",))
