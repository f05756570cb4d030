"""Packaging and service units (issue 8 §3–§4).

* The wheel and the sdist build with ``python -m build`` (no isolation: the build backend comes
  from the test extras), the wheel installs into a fresh venv, and the installed CLI works.
* ``examples/systemd/*.service`` pass ``systemd-analyze verify`` where it exists, and their
  stop timeout covers the shutdown bound computed from the code's defaults.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

import fleet_trio
from fleet_trio.cli import build_parser
from fleet_trio.node.config import Timings
from fleet_trio.nursery.tree import DEFAULT_INTERRUPT_BUDGET, JOBS_CLOSED_BUDGET, SHUTDOWN_SLACK
from fleet_trio.proc.supervisor import ESCAPED_EOF_WAIT, STRAGGLER_WAIT
from fleet_trio.worker.hooks import DRAIN_BUDGET, HOOK_GRACE
from fleet_trio.worker.worker import (
    CLIENT_CLOSE_BOUND,
    TAILS_END_BUDGET,
    WorkerTimings,
    shutdown_bound,
)

ROOT = Path(__file__).resolve().parent.parent
UNITS = ROOT / "examples" / "systemd"
NODE_UNIT = UNITS / "fleet-trio-node.service"
WORKER_UNIT = UNITS / "fleet-trio-worker.service"
INSTALLED_BINARY = "/opt/fleet-trio/bin/fleet-trio"
"""Where the units expect the CLI (a venv in /opt/fleet-trio, docs/systemd.md)."""

# What a copy of the source tree for the build needs; the rest of the checkout stays out.
SOURCE_ENTRIES = (
    "pyproject.toml",
    "README.md",
    "CHANGELOG.md",
    "MANIFEST.in",
    "fleet_trio",
    "docs",
    "examples",
    "scripts",
    "tests",
)
COPY_IGNORE = shutil.ignore_patterns(
    "__pycache__", "*.pyc", ".hypothesis", "*.egg-info", "build", "dist"
)
STEP_TIMEOUT = 120  # seconds per subprocess step; the whole test takes about 10 s


# -- systemd units ------------------------------------------------------------------------------


def parse_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """A unit file as section → key → values (systemd keys may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    logical = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not logical and (not line or line.startswith(("#", ";"))):
            continue
        if line.endswith("\\"):
            logical += line[:-1] + " "
            continue
        line, logical = logical + line, ""
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"{path.name}: {line!r} before any section"
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: not a key=value line: {line!r}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


_SPAN = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|us|min|s|m|h)?")
_SPAN_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, None: 1.0, "min": 60.0, "m": 60.0, "h": 3600.0}


def systemd_seconds(text: str) -> float:
    """A systemd time span (``90``, ``60s``, ``2min 30s``) in seconds."""
    total, pos = 0.0, 0
    text = text.strip()
    while pos < len(text):
        match = _SPAN.match(text, pos)
        assert match, f"not a systemd time span: {text!r}"
        total += float(match.group(1)) * _SPAN_UNITS[match.group(2)]
        pos = match.end()
        while pos < len(text) and text[pos] == " ":
            pos += 1
    return total


def node_shutdown_bound() -> float:
    """docs/task-tree.md: drain + interrupt budget + kill grace + slack + the tails' end + the
    poll linger, node defaults."""
    t = Timings()
    tree = float(t.drain_timeout) + DEFAULT_INTERRUPT_BUDGET + float(t.kill_grace)
    return tree + SHUTDOWN_SLACK + JOBS_CLOSED_BUDGET + float(t.poll_linger)


def worker_shutdown_bound() -> float:
    """The worker's task tree (serve_worker: interrupt budget = kill grace + 5 s), the tails'
    end and the release drain of lingering on_release hooks (its budget, then a hook's SIGTERM
    grace and the post-SIGKILL pipe and straggler waits) inside it, then the controller
    client's close; the code's own figure (``shutdown_bound``) must agree."""
    t = WorkerTimings()
    tree = t.shutdown_drain + (t.kill_grace + 5.0) + t.kill_grace + SHUTDOWN_SLACK
    release_drain = DRAIN_BUDGET + HOOK_GRACE + ESCAPED_EOF_WAIT + STRAGGLER_WAIT
    total = tree + TAILS_END_BUDGET + release_drain + CLIENT_CLOSE_BOUND
    assert shutdown_bound(t) >= total
    return shutdown_bound(t)


@pytest.mark.parametrize(
    ("unit", "subcommand", "bound"),
    [(NODE_UNIT, "node", node_shutdown_bound), (WORKER_UNIT, "worker", worker_shutdown_bound)],
    ids=["node", "worker"],
)
def test_systemd_unit_settings(unit: Path, subcommand: str, bound: object) -> None:
    assert callable(bound)
    cfg = parse_unit(unit)
    service = cfg["Service"]

    def one(key: str) -> str:
        values = service.get(key, [])
        assert len(values) == 1, f"{unit.name}: expected one {key}=, got {values}"
        return values[0]

    # The stop timeout covers the documented bound, with room to spare.
    timeout = systemd_seconds(one("TimeoutStopSec"))
    needed = bound()
    assert timeout >= needed, f"{unit.name}: TimeoutStopSec={timeout:g}s < bound {needed:g}s"
    # docs/systemd.md states the same bound and timeout.
    doc = (ROOT / "docs" / "systemd.md").read_text(encoding="utf-8")
    assert f"**{needed:g} s**" in doc and f"**{one('TimeoutStopSec')}**" in doc

    # SIGTERM to the supervisor only; SIGKILL to the rest of the cgroup after the timeout.
    assert one("KillMode") == "mixed"
    assert one("KillSignal") == "SIGTERM"
    assert service.get("SendSIGKILL", ["yes"]) == ["yes"]
    assert one("Restart") == "on-failure"
    assert systemd_seconds(one("RestartSec")) >= 1.0
    assert one("OOMPolicy") == "continue"
    assert {"StartLimitIntervalSec", "StartLimitBurst"} <= set(cfg["Unit"])

    # Hardening that would break the sweep or NVML is absent.
    assert service.get("PrivateDevices", ["no"]) == ["no"]
    assert service.get("ProtectProc", ["default"]) == ["default"]
    assert service.get("ProcSubset", ["all"]) == ["all"]
    for key in ("DeviceAllow", "ProtectClock", "ProtectKernelModules", "DevicePolicy"):
        assert key not in service, f"{unit.name}: {key}= cuts off /dev/nvidia* or nvidia-uvm"
    for key in ("CapabilityBoundingSet", "User", "DynamicUser", "NoNewPrivileges"):
        assert key not in service, f"{unit.name}: {key}= takes CAP_KILL/CAP_SYS_PTRACE away"

    # ExecStart is the installed CLI with arguments the current parser accepts.
    argv = shlex.split(one("ExecStart"))
    assert argv[0] == INSTALLED_BINARY
    args = build_parser().parse_args(argv[1:])
    assert args.subcommand == subcommand
    assert args.config, f"{unit.name}: ExecStart names no config file"


def test_worker_unit_keeps_its_token_out_of_the_environment() -> None:
    """Jobs inherit the worker's environment, so RC_TOKEN must not be set by the unit."""
    service = parse_unit(WORKER_UNIT)["Service"]
    assert not any("RC_TOKEN" in v for v in service.get("Environment", []))
    assert "EnvironmentFile" not in service


def test_systemd_time_span_parser() -> None:
    assert systemd_seconds("90") == 90.0
    assert systemd_seconds("120s") == 120.0
    assert systemd_seconds("2min 30s") == 150.0
    assert systemd_seconds("500ms") == 0.5


def test_systemd_units_verify(tmp_path: Path) -> None:
    """``systemd-analyze verify`` accepts both units (Debian's systemd package).

    verify checks that ExecStart's binary exists, so it runs on a copy whose ExecStart points
    at this interpreter; everything else is the file as shipped. Unknown keys and bad values
    are only warnings for verify (exit 0), so any message naming one of our units fails too.
    """
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not found (Debian: apt-get install systemd)")
    copies = []
    for unit in (NODE_UNIT, WORKER_UNIT):
        text = unit.read_text(encoding="utf-8")
        assert INSTALLED_BINARY in text
        copy = tmp_path / unit.name
        copy.write_text(text.replace(INSTALLED_BINARY, sys.executable), encoding="utf-8")
        copies.append(copy)
    proc = subprocess.run(
        [analyze, "verify", *map(str, copies)],
        capture_output=True,
        text=True,
        timeout=STEP_TIMEOUT,
        cwd=tmp_path,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    ours = [line for line in output.splitlines() if "fleet-trio-" in line]
    assert ours == [], "\n".join(ours)


# -- wheel, sdist, clean venv ------------------------------------------------------------------


def source_subcommands() -> list[str]:
    """The subcommands of the source tree's parser (the wheel must offer the same)."""
    (action,) = (a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return list(action.choices)


def _run(argv: list[str], *, cwd: Path, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=STEP_TIMEOUT
    )
    assert proc.returncode == 0, f"{argv}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.mark.slow
def test_wheel_and_sdist_build_and_install_into_a_clean_venv(tmp_path: Path) -> None:
    pytest.importorskip("build", reason="the test extras' build package is not installed")
    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCE_ENTRIES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=COPY_IGNORE, symlinks=True)
        elif path.exists():
            shutil.copy2(path, src / name)
    dist = tmp_path / "dist"
    # Without --sdist/--wheel, build makes the sdist and then the wheel *from the sdist*, so a
    # file missing from the sdist breaks the wheel too.
    _run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(src)],
        cwd=tmp_path,
    )
    version = fleet_trio.__version__
    (wheel,) = dist.glob(f"fleet_trio-{version}-py3-none-any.whl")
    (sdist,) = dist.glob(f"fleet_trio-{version}.tar.gz")

    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        entry_points = zf.read(f"fleet_trio-{version}.dist-info/entry_points.txt").decode()
        metadata = zf.read(f"fleet_trio-{version}.dist-info/METADATA").decode()
    assert "fleet_trio/logbus/static/tail.html" in names
    for script in ("count", "escape", "leak", "verify", "render", "train"):  # the demo's jobs
        assert f"fleet_trio/sim/demo/jobs/{script}.py" in names
    assert "fleet_trio/__main__.py" in names
    assert not any(n.startswith(("tests/", "docs/", "examples/")) for n in names)
    assert "fleet-trio = fleet_trio.launch:entry" in entry_points
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    for group, points in declared.get("entry-points", {}).items():
        assert f"[{group}]" in entry_points
        for name, target in points.items():
            assert f"{name} = {target}" in entry_points
    assert f"\nVersion: {version}\n" in metadata

    with tarfile.open(sdist) as tf:
        members = {m.name.split("/", 1)[1] for m in tf.getmembers() if "/" in m.name}
    for expected in (
        "pyproject.toml",
        "README.md",
        "CHANGELOG.md",
        "fleet_trio/logbus/static/tail.html",
        "docs/README.md",
        "docs/architecture.md",
        "examples/node.yaml",
        "examples/worker.yaml",
        "examples/systemd/fleet-trio-node.service",
        "examples/systemd/fleet-trio-worker.service",
        "examples/verify.d/10-gpu-memory-free",
        "tests/conftest.py",
        "tests/test_packaging.py",
        "scripts/gpu-smoke",
    ):
        assert expected in members, f"{expected} missing from the sdist"
    assert not any("__pycache__" in m or m.endswith(".pyc") for m in members)

    # A fresh venv with only the wheel; the dependencies come from this environment through a
    # plain path line (a path line runs no code, so the editable install's finder stays off).
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(py),
            "install",
            "--no-deps",
            "--no-index",
            "--disable-pip-version-check",
            "--quiet",
            str(wheel),
        ],
        cwd=tmp_path,
    )
    site = Path(
        _run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            cwd=tmp_path,
        ).strip()
    )
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "_fleet_trio_test_deps.pth").write_text("".join(f"{p}\n" for p in sorted(ours)))

    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    where = _run(
        [str(py), "-c", "import fleet_trio; print(fleet_trio.__file__)"], cwd=tmp_path, env=env
    ).strip()
    assert Path(where).resolve().is_relative_to(env_dir.resolve()), where

    cli = str(env_dir / "bin" / "fleet-trio")
    help_text = _run([cli, "--help"], cwd=tmp_path, env=env)
    subcommands = source_subcommands()
    assert {"exec", "node", "measure", "worker", "tail"} <= set(subcommands)
    for subcommand in subcommands:
        assert subcommand in help_text
        sub_help = _run([cli, subcommand, "--help"], cwd=tmp_path, env=env)
        assert sub_help.startswith(f"usage: fleet-trio {subcommand}"), sub_help[:200]
    _run([cli, "exec", "--", "true"], cwd=tmp_path, env=env)
    failed = subprocess.run(
        [cli, "exec", "--", "false"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        timeout=STEP_TIMEOUT,
    )
    assert failed.returncode == 1
    printed = _run([str(py), "-m", "fleet_trio", "--version"], cwd=tmp_path, env=env)
    assert printed.strip() == f"fleet-trio {version}"
    meta = _run(
        [str(py), "-c", "import importlib.metadata as m; print(m.version('fleet-trio'))"],
        cwd=tmp_path,
        env=env,
    )
    assert meta.strip() == version


def test_version_has_one_source() -> None:
    """pyproject reads the version from fleet_trio.__version__; nothing else states it."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" not in pyproject["project"]
    assert "version" in pyproject["project"]["dynamic"]
    dynamic = pyproject["tool"]["setuptools"]["dynamic"]
    assert dynamic["version"] == {"attr": "fleet_trio.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", fleet_trio.__version__)
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert f"## [{fleet_trio.__version__}]" in changelog
