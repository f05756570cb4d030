"""Every startup error of every command is exactly one ``error:`` line on stderr, never a
traceback, and the exit code that docs/troubleshooting.md documents for it.

Each row runs ``fleet-trio`` as a user would (a subprocess, fresh HOME, bounded by a
timeout). The table is the one in docs/troubleshooting.md ("Startup errors, every command").
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
import trio

from fleet_trio.sim.fleet import free_port

REPO = Path(__file__).resolve().parents[1]

# (argv, exit code, text the error line contains); {tmp} is a fresh directory with the
# files below, {port} a port nobody listens on.
TABLE: list[tuple[list[str], int, str]] = [
    ([], 2, "no command given"),
    (["no-such-command"], 2, "invalid choice: 'no-such-command'"),
    (["--log-level", "LOUD", "exec", "--", "true"], 2, "LOUD"),
    (["node", "--bogus-flag"], 2, "unrecognized arguments: --bogus-flag"),
    (["node", "--listen", "127.0.0.1:99999", "--gpu", "fake"], 1, "port must be 0-65535"),
    (["node", "--listen", "127.0.0.1", "--gpu", "fake"], 1, "missing port in address"),
    (["node", "--listen", "0.0.0.0:18811"], 1, "refusing to bind --listen"),
    (["node", "-c", "{tmp}/missing.yaml"], 1, "cannot read: No such file or directory"),
    (["node", "-c", "{tmp}/broken.yaml"], 1, "invalid YAML"),
    (["node", "-c", "{tmp}/typo.yaml"], 1, "(did you mean 'listen'?)"),
    (["node", "--gpu", "fake", "--fake-gpu-dir", "{tmp}/file/gpu"], 1, "cannot create the fake"),
    (["node", "--gpu", "fake", "--listen", "127.0.0.1:{busy}"], 1, "cannot listen on"),
    (["measure", "-c", "{tmp}/missing.yaml"], 1, "cannot read"),
    (["measure", "-c", "{tmp}/empty.yaml", "--gpu", "fake", "--task", "nope"], 2, "nope"),
    (["worker", "-c", "{tmp}/missing.yaml"], 1, "cannot read: No such file or directory"),
    (["worker", "-c", "{tmp}/worker-no-url.yaml"], 1, "controller_url: required"),
    (["worker", "-c", "{tmp}/worker-open-tail.yaml"], 1, "tail_listen: refusing to bind"),
    (["worker", "-c", "{tmp}/worker-bad-hook.yaml", "--check"], 1, "on_acquire (gpu0)"),
    (["exec"], 2, "empty command"),
    (["exec", "--grace", "10", "--", "true"], 2, "invalid duration '10'"),
    (["tail", "--url", "http://127.0.0.1:{port}", "j"], 2, "cannot connect"),
    (["tail", "--url", "ftp://example", "j"], 2, "want ws://"),
    (["tail", "--from", "later", "j"], 2, "from must be"),
    (["fake-gpu", "hold", "lots"], 2, "bad size"),
    (["sim", "controller", "--listen", "0.0.0.0:18810"], 2, "loopback only"),
    (["sim", "controller", "--listen", "127.0.0.1:99999"], 2, "port must be 0-65535"),
    (["sim", "controller", "--listen", "127.0.0.1:{busy}"], 1, "Address already in use"),
    (["sim", "submit"], 2, "missing command"),
    (["sim", "jobs"], 1, "no sim controller is running"),
]

FILES = {
    "broken.yaml": "node: [unclosed\n",
    "typo.yaml": "node:\n  listn: 127.0.0.1:1\n",
    "empty.yaml": "tasks: {}\n",
    "worker-no-url.yaml": "token: t\ndevices: [gpu0]\n",
    "worker-open-tail.yaml": "controller_url: http://127.0.0.1:1\ntoken: t\ndevices: [gpu0]\n"
    "tail_listen: 0.0.0.0:18812\n",
    "worker-bad-hook.yaml": "controller_url: http://127.0.0.1:1\ntoken: t\n"
    "devices:\n  - name: gpu0\n    on_acquire: /no/such/hook\n",
    "file": "",
}

ERROR_LINE = re.compile(r"^(?:fleet-trio(?: [a-z-]+)*: )?error: ")


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    for name, text in FILES.items():
        (tmp_path / name).write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEET_TRIO_", "XDG_"))}
    env["HOME"] = str(tmp_path / "home")
    env.pop("STATE_DIRECTORY", None)
    return tmp_path, env


@pytest.mark.parametrize(("argv", "code", "text"), TABLE, ids=[" ".join(r[0]) for r in TABLE])
async def test_bad_invocation_is_one_error_line(
    setup: tuple[Path, dict[str, str]], argv: list[str], code: int, text: str
) -> None:
    tmp, env = setup
    with trio.socket.socket() as busy:
        await busy.bind(("127.0.0.1", 0))
        busy.listen()
        subst = {
            "tmp": str(tmp),
            "port": str(free_port()),
            "busy": str(busy.getsockname()[1]),
        }
        args = [a.format(**subst) for a in argv]
        with trio.fail_after(30):
            done = await trio.run_process(
                [sys.executable, "-m", "fleet_trio", *args],
                env=env,
                cwd=tmp,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
    err = done.stderr.decode()
    errors = [line for line in err.splitlines() if ERROR_LINE.match(line)]
    assert len(errors) == 1, err
    assert text.format(**subst) in errors[0], err
    assert "Traceback" not in err, err
    assert done.returncode == code, err


def test_an_unanticipated_error_is_one_line_and_its_traceback_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    from fleet_trio.cli import run_handler

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)

    def buggy(args: argparse.Namespace) -> int:
        raise ValueError("boom\nsecond line")

    assert run_handler(buggy, argparse.Namespace()) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: internal error: ValueError: boom ")
    [saved] = (tmp_path / "fleet-trio" / "crash").iterdir()
    assert str(saved) in err and "Traceback" in saved.read_text()

    def interrupted(args: argparse.Namespace) -> int:
        raise BaseExceptionGroup("nursery", [KeyboardInterrupt()])

    assert run_handler(interrupted, argparse.Namespace()) == 130
