"""Every shell block of the README and of ``docs/``, run as one pasted block: none can drift.

What runs: every fenced ``sh`` block of ``README.md`` and ``docs/*.md``. A block right after
``<!-- quickstart: skip (why) -->`` is left out, and must say why (a systemd host, a remote
node, minutes of benchmarks, this test suite itself).

How, as a newcomer who pastes the block into a terminal would, in a clean environment:
``env -i`` with a fresh ``HOME`` and the system's ``PATH`` only — nothing of the machine's
environment, and no ``fleet-trio`` on ``PATH`` unless the block activates the venv the README
made (``.venv`` in the repository root) or calls ``.venv/bin/fleet-trio``. The block is one
``bash -e -o pipefail`` script from the repository root, in a process session of its own, with
one bound for the whole block: a line that fails fails the block, and a block that hangs (a
quickstart racing a server that is not ready yet, an ``until`` loop that never ends) fails at
the bound. A line ending in ``&`` starts a server as the docs do; whatever the block left
running is stopped with SIGTERM when it ends. Two adaptations, both documented here:

* the README's venv-creation prefix (``python3 -m venv .venv && .venv/bin/pip install … &&``)
  is dropped: the venv is already there (the suite runs in it), and the suite installs nothing;
* ports are made free, so blocks can run side by side: ``18811`` (a node) and ``18810`` (the
  sim controller) become free ports, and a ``fleet-trio node`` / ``fleet-trio sim controller``
  line without ``--listen`` gets one.

Nothing may print a traceback or an error envelope (``"status":"error"``: ``curl -s`` exits 0
on an HTTP error), and nothing may be written outside ``HOME``'s state directory
(``~/.local/state``) — not into ``HOME`` itself, not into the repository.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fleet_trio.sim.fleet import free_port

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"

_BLOCK = re.compile(r"^(?P<indent>[ \t]*)```sh[ \t]*\n(?P<body>.*?)^(?P=indent)```", re.M | re.S)
_SKIP = re.compile(r"^<!-- quickstart: skip \((?P<why>.*)\) -->$")
_VENV_PREFIX = re.compile(r"^python3 -m venv \.venv && \.venv/bin/pip install [^&]*&& ", re.M)
_SERVER = re.compile(r"^(?P<cmd>(?:\S*/)?fleet-trio (?:node|sim controller))\b(?P<rest>.*)$")
BLOCK_TIMEOUT = 240.0


def all_blocks() -> list[tuple[str, str, str | None]]:
    """``(id, text, why it is skipped or None)`` of every ``sh`` block."""
    found: list[tuple[str, str, str | None]] = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text(encoding="utf-8")
        for n, m in enumerate(_BLOCK.finditer(text), 1):
            before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
            skip = _SKIP.match(before)
            why = skip.group("why").strip() if skip else None
            body = textwrap.dedent(m.group("body"))  # a block in a list item is indented
            found.append((f"{path.relative_to(ROOT)}#{n}", body, why))
    return found


ALL = all_blocks()
BLOCKS = [(i, text) for i, text, why in ALL if why is None]


def adapt(block: str, ports: dict[str, int]) -> str:
    """The block as it runs here: the README's venv-creation prefix dropped, ports made free."""
    block = _VENV_PREFIX.sub("", block)
    for default, port in ports.items():
        block = block.replace(default, str(port))
    lines = []
    for line in block.splitlines():
        m = _SERVER.match(line)
        if m and "--listen" not in line:
            cmd, rest = m.group("cmd"), m.group("rest")
            default = "18811" if cmd.endswith("node") else "18810"
            body, comment = [*rest.split("#", 1), ""][:2]
            body = body.rstrip()
            amp = ""
            if body.endswith("&"):
                body, amp = body[:-1].rstrip(), " &"
            line = f"{cmd}{body} --listen 127.0.0.1:{ports[default]}{amp}"
            if comment:
                line += f"  #{comment}"
        lines.append(line)
    return "\n".join(lines) + "\n"


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


def test_the_quickstarts_are_found() -> None:
    ids = [i for i, _ in BLOCKS]
    assert "README.md#1" in ids  # fleet-trio demo
    assert any(i.startswith("docs/node.md#") for i in ids)
    assert any(i.startswith("docs/worker.md#") for i in ids)
    assert not any("pytest" in text for _, text in BLOCKS)  # the test-suite blocks are skipped


def test_every_sh_block_is_found_indented_ones_too() -> None:
    """A fenced ``sh`` block inside a list item is indented: it is a quickstart too (before:
    only blocks at column 0 were found, so docs/worker.md's migration step ran nowhere and
    needed no reason to be skipped)."""
    fence = re.compile(r"^[ \t]*```sh[ \t]*$", re.M)
    paths = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    fences = sum(len(fence.findall(p.read_text(encoding="utf-8"))) for p in paths)
    assert len(ALL) == fences


def test_every_skipped_block_says_why() -> None:
    skipped = [(i, why) for i, _, why in ALL if why is not None]
    assert skipped  # the README's test command at least
    assert all(why for _, why in skipped), [i for i, why in skipped if not why]


def test_docs_never_assume_fleet_trio_on_path() -> None:
    """A block that runs ``fleet-trio`` bare activates the venv first (or calls
    ``.venv/bin/fleet-trio``): pasted in a fresh shell it must not say 'command not found'."""
    bare = re.compile(r"(?:^|[;&|]\s*|\$\(\s*)fleet-trio\b", re.M)
    wrong = []
    for block_id, text in BLOCKS:
        first = text.find("fleet-trio")
        if first == -1:
            continue
        activated = text.find(". .venv/bin/activate")
        if bare.search(text) and not (0 <= activated < first):
            wrong.append(block_id)
    assert not wrong, f"blocks run fleet-trio without the venv: {wrong}"


@pytest.mark.slow
@pytest.mark.parametrize(("block_id", "block"), BLOCKS, ids=[i for i, _ in BLOCKS])
def test_quickstart_block_works_pasted(tmp_path: Path, block_id: str, block: str) -> None:
    if not (VENV / "bin" / "fleet-trio").exists() or (
        Path(sys.prefix).resolve() != VENV.resolve()
    ):
        pytest.skip("the suite is not running in the README's venv (.venv in the repository)")
    if "curl " in block and shutil.which("curl", path=SYSTEM_PATH) is None:
        pytest.skip("curl is not installed")
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "PATH": SYSTEM_PATH}
    ports = {"18811": free_port(), "18810": free_port()}
    script = adapt(block, ports)
    before = repo_status()
    out_path = tmp_path / "transcript.log"
    with out_path.open("wb") as out:
        proc = subprocess.Popen(
            ["/bin/bash", "--noprofile", "--norc", "-e", "-o", "pipefail", "-c", script],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code: int | None = proc.wait(timeout=BLOCK_TIMEOUT)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            # whatever the block left running (its servers) is stopped, as `kill %1` would
            leftovers = _stop_session(proc)
    transcript = f"$ {block_id}, run as:\n{script}\n--- output ---\n" + out_path.read_text(
        errors="replace"
    )
    assert code is not None, f"the block hung past {BLOCK_TIMEOUT:g}s\n{transcript}"
    assert code == 0, f"exit {code}\n{transcript}"
    assert not leftovers, f"did not stop on SIGTERM: {leftovers}\n{transcript}"
    assert "Traceback" not in transcript, transcript
    assert '"status":"error"' not in transcript, transcript
    written = snapshot(home)
    allowed = (".local", ".local/state")
    outside_state = {p for p in written if p not in allowed and not p.startswith(".local/state/")}
    assert not outside_state, f"{block_id} wrote into $HOME: {sorted(outside_state)}"
    assert repo_status() == before, f"{block_id} wrote into the repository"


def _session_pids(sid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[3]) == sid and fields[0] != "Z":  # session id; zombies are gone
            pids.append(int(entry))
    return pids


def _stop_session(proc: subprocess.Popen[bytes]) -> list[int]:
    """SIGTERM every process of the block's session (its shell is ``proc``, the session
    leader), wait up to 60 s for each to end (a pidfd per process: the wait is on the exit
    itself); the pids still alive then are SIGKILLed and returned."""
    deadline = time.monotonic() + 60.0
    alive: list[int] = []
    while True:
        pids = [pid for pid in _session_pids(proc.pid) if pid not in alive]
        if not pids:
            break
        fds = {}
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                fds[pid] = os.pidfd_open(pid)
                signal.pidfd_send_signal(fds[pid], signal.SIGTERM)
        poller = select.poll()
        for fd in fds.values():
            poller.register(fd, select.POLLIN)
        waiting = set(fds.values())
        while waiting and (left := deadline - time.monotonic()) > 0:
            for fd, _ in poller.poll(left * 1000):
                waiting.discard(fd)
                poller.unregister(fd)
        for pid, fd in fds.items():
            if fd in waiting:
                alive.append(pid)
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
            os.close(fd)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    return alive
