"""The README and the docs' quickstarts, run verbatim: they cannot drift.

What runs: every fenced ``sh`` block of ``README.md``, and every ``sh`` block of
``docs/*.md`` right after a ``<!-- quickstart -->`` line. A block right after
``<!-- quickstart: skip (why) -->`` is left out (the README's test-suite command: it would run
this test).

How, as a newcomer would, with three documented adaptations:

* the venv-creation prefix of a README line (``python3 -m venv .venv && .venv/bin/pip install
  … && ``) is dropped and ``.venv/bin/`` stripped: the commands run with the current
  environment's ``fleet-trio`` first on ``PATH`` (no pip install in the tests);
* ports are made free: ``18811`` (the node) and ``18810`` (the sim controller) are replaced by
  free ports, and a ``fleet-trio node`` / ``fleet-trio sim controller`` line without
  ``--listen`` gets one;
* a line ending in ``&`` starts a long-running server: it is started in the background, waited
  for (``serving on`` for a node, ``worker config:`` for the sim controller) and stopped with
  SIGTERM after the block; every other line must exit 0 within its timeout, print no
  traceback and no error envelope (``"status":"error"``: ``curl -s`` exits 0 on an HTTP error).

Each block runs from the repository root with a fresh temporary ``HOME`` (no ``XDG_*``, no
``FLEET_TRIO_*``); afterwards nothing may have been written outside ``HOME``'s state directory
(``~/.local/state``) — not into ``HOME`` itself, not into the repository.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleet_trio.sim.fleet import free_port

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

_BLOCK = re.compile(r"^```sh\n(.*?)^```", re.M | re.S)
_VENV_PREFIX = re.compile(r"^python3 -m venv \.venv && \.venv/bin/pip install [^&]*&& ")
READY = {"fleet-trio node": "serving on", "fleet-trio sim controller": "worker config:"}
LINE_TIMEOUT = 120.0
READY_TIMEOUT = 30.0


def blocks() -> list[tuple[str, str]]:
    """``(id, text)`` of every block to run."""
    found: list[tuple[str, str]] = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text(encoding="utf-8")
        readme = path.name == "README.md" and path.parent == ROOT
        for n, m in enumerate(_BLOCK.finditer(text), 1):
            before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
            if before.startswith("<!-- quickstart: skip"):
                continue
            if readme or before == "<!-- quickstart -->":
                found.append((f"{path.relative_to(ROOT)}#{n}", m.group(1)))
    return found


def commands(block: str) -> list[str]:
    """The block's command lines (continuations joined, comments and blanks dropped)."""
    out: list[str] = []
    pending = ""
    for raw in block.splitlines():
        line = pending + raw
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        if line.strip() and not line.lstrip().startswith("#"):
            out.append(line.strip())
    return out


def adapt(line: str, ports: dict[str, int]) -> str:
    line = _VENV_PREFIX.sub("", line).replace(".venv/bin/", "")
    for default, port in ports.items():
        line = line.replace(default, str(port))
    for cmd, default in (("fleet-trio node", "18811"), ("fleet-trio sim controller", "18810")):
        if line.startswith(cmd) and "--listen" not in line:
            body, amp = (line[:-1].rstrip(), " &") if line.endswith("&") else (line, "")
            line = f"{body} --listen 127.0.0.1:{ports[default]}{amp}"
    return line


def snapshot(directory: Path) -> set[str]:
    return {str(p.relative_to(directory)) for p in directory.rglob("*")}


def repo_status() -> str:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        return ""
    return subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    ).stdout


BLOCKS = blocks()


def test_the_quickstarts_are_found() -> None:
    ids = [i for i, _ in BLOCKS]
    assert "README.md#1" in ids  # fleet-trio demo
    assert any(i.startswith("docs/node.md#") for i in ids)
    assert any(i.startswith("docs/worker.md#") for i in ids)
    assert not any("pytest" in text for _, text in BLOCKS)  # the test-suite block is skipped


@pytest.mark.slow
@pytest.mark.parametrize(("block_id", "block"), BLOCKS, ids=[i for i, _ in BLOCKS])
def test_quickstart_block_works_verbatim(tmp_path: Path, block_id: str, block: str) -> None:
    if "curl " in block and shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "FLEET_TRIO_"))}
    env.pop("STATE_DIRECTORY", None)
    env.update(HOME=str(home), PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}")
    ports = {"18811": free_port(), "18810": free_port()}
    before = repo_status()
    servers: list[tuple[str, subprocess.Popen[bytes], Path]] = []
    transcript: list[str] = []
    try:
        for n, raw in enumerate(commands(block)):
            line = adapt(raw, ports)
            if line.endswith("&"):
                log = tmp_path / f"server-{n}.log"
                with log.open("wb") as out:
                    proc = subprocess.Popen(
                        ["bash", "-c", f"exec {line[:-1].strip()}"],
                        cwd=ROOT,
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                servers.append((line, proc, log))
                ready = next((r for cmd, r in READY.items() if line.startswith(cmd)), None)
                deadline = time.monotonic() + READY_TIMEOUT
                while ready is not None and ready not in log.read_text(errors="replace"):
                    assert proc.poll() is None, f"{line}: exited\n{log.read_text()}"
                    assert time.monotonic() < deadline, f"{line}: not ready\n{log.read_text()}"
                    time.sleep(0.1)
                transcript.append(f"$ {line}")
                continue
            done = subprocess.run(
                ["bash", "-o", "pipefail", "-c", line],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=LINE_TIMEOUT,
                check=False,
            )
            transcript.append(f"$ {line}\n{done.stdout}{done.stderr}")
            assert done.returncode == 0, "\n".join(transcript)
            assert "Traceback" not in done.stderr, "\n".join(transcript)
            # curl -s exits 0 on an HTTP error too: the error envelope must not be what we got
            assert '"status":"error"' not in done.stdout, "\n".join(transcript)
    finally:
        for line, proc, log in reversed(servers):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
                pytest.fail(f"{line}: did not stop on SIGTERM\n{log.read_text()}")
    for line, proc, log in servers:
        assert "Traceback" not in log.read_text(errors="replace"), log.read_text()
        assert proc.returncode in (0, -signal.SIGTERM), f"{line}: {proc.returncode}"
    written = snapshot(home)
    allowed = (".local", ".local/state")
    outside_state = {p for p in written if p not in allowed and not p.startswith(".local/state/")}
    assert not outside_state, f"{block_id} wrote into $HOME: {sorted(outside_state)}"
    assert repo_status() == before, f"{block_id} wrote into the repository"
