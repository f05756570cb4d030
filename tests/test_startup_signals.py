"""Issue acceptance: a signal before the task tree opens is one line, never a traceback.

Ctrl-C in the first fraction of a second of ``fleet-trio node`` printed a ``KeyboardInterrupt``
traceback (the import of trio, the web stack, the config load); a SIGTERM or SIGHUP there
killed the process silently. The entry point (``fleet_trio.launch``) now holds the three
signals from its first lines: before trio runs, a signal ends the process with one line and
the signal's own death (a shell's 128 + n); inside trio it waits for the tree, which drains.

A signal at a given point of the start is sent by the child itself, from an import hook, so
the point is a fact, not a timing. The loop over delays starts from the moment the child holds
the signals (``SigCgt`` in ``/proc/PID/status`` has SIGTERM, the last one the entry point
installs): the interpreter's own start before that (its ``site`` module) is not ours to guard.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from fleet_trio.gpu.fake import init_device
from fleet_trio.launch import early_stop_line
from tests.helpers import wait_until

PY = sys.executable

# The child: a meta-path hook sends SIG to the child itself when MODULE is first imported,
# then runs ``python -m fleet_trio`` with the rest of argv.
AT_IMPORT = """
import os, sys
sig, module = int(sys.argv[1]), sys.argv[2]

class Trigger:
    fired = False
    def find_spec(self, name, path=None, target=None):
        if name == module and not Trigger.fired:
            Trigger.fired = True
            os.kill(os.getpid(), sig)
        return None

sys.meta_path.insert(0, Trigger())
sys.argv = ["fleet-trio", *sys.argv[3:]]
import runpy
runpy.run_module("fleet_trio", run_name="__main__", alter_sys=True)
"""


def _node_argv(tmp_path: Path) -> list[str]:
    gpu = tmp_path / "gpu"
    if not gpu.exists():
        init_device(str(gpu))  # made here: the node's "initialised" note is not in the way
    return [
        "node", "--gpu", "fake", "--fake-gpu-dir", str(gpu), "--listen", "127.0.0.1:0",
        "--no-journal", "--footprints", str(tmp_path / "fp.json"),
    ]  # fmt: skip


def _stopped_line(signum: int) -> str:
    from fleet_trio.launch import EarlyStop

    return early_stop_line(EarlyStop(signum))


@pytest.mark.parametrize(
    ("signum", "module"),
    [
        (signal.SIGINT, "trio"),  # the imports
        (signal.SIGINT, "fleet_trio.node.config"),  # the config load
        (signal.SIGINT, "fleet_trio.node.server"),  # the web stack, before trio runs
        (signal.SIGTERM, "trio"),
        (signal.SIGHUP, "fleet_trio.node.server"),
    ],
)
async def test_a_signal_at_a_point_of_the_start_is_one_line_and_the_signals_death(
    tmp_path: Path, signum: int, module: str
) -> None:
    with trio.fail_after(60):
        done = await trio.run_process(
            [PY, "-c", AT_IMPORT, str(signum), module, *_node_argv(tmp_path)],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    err = done.stderr.decode()
    assert "Traceback" not in err, err
    assert err == _stopped_line(signum) + "\n", err
    assert done.returncode == -signum  # the signal's own death: a shell says 128 + n
    assert done.stdout == b""


def _caught(pid: int) -> int:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:  # gone
        return -1
    [mask] = [line.split()[1] for line in text.splitlines() if line.startswith("SigCgt:")]
    return int(mask, 16)


async def _signal_during_start(tmp_path: Path, signum: int, delay: float) -> tuple[int, str]:
    with trio.fail_after(60):
        proc = await trio.lowlevel.open_process(
            [PY, "-m", "fleet_trio", *_node_argv(tmp_path)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            bit = 1 << (signal.SIGTERM - 1)
            await wait_until(
                lambda: _caught(proc.pid) & bit or proc.returncode is not None,
                what="the entry point holding the signals",
            )
            await trio.sleep(delay)  # the point of the start under test, not a wait for a fact
            proc.send_signal(signum)
            assert proc.stderr is not None
            err = b""
            while chunk := await proc.stderr.receive_some(65536):
                err += chunk
            return await proc.wait(), err.decode()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


@pytest.mark.slow
async def test_ctrl_c_at_many_points_of_the_start_is_one_line_or_a_drain(tmp_path: Path) -> None:
    """Before the tree opens: the one line and SIGINT's death; once it is open (inside trio,
    the GPU probe, serving): a shutdown, exit 0, only the node's own lines. Never a
    traceback."""
    outcomes = []
    for step in range(11):
        code, err = await _signal_during_start(tmp_path, signal.SIGINT, step * 0.05)
        assert "Traceback" not in err, (step, err)
        lines = err.splitlines()
        if code == -signal.SIGINT:
            assert lines == [_stopped_line(signal.SIGINT)], (step, err)
        else:
            assert code == 0, (step, code, err)
            assert all(line.startswith("fleet-trio node: ") for line in lines), (step, err)
        outcomes.append(code)
    assert -signal.SIGINT in outcomes  # the loop did reach the start before the tree


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
async def test_sigterm_and_sighup_during_the_start_are_one_line_or_a_drain(
    tmp_path: Path, signum: int
) -> None:
    for delay in (0.0, 0.2):
        code, err = await _signal_during_start(tmp_path, signum, delay)
        assert "Traceback" not in err, err
        if code == -signum:
            assert err.splitlines() == [_stopped_line(signum)], err
        else:
            assert code == 0, (code, err)


async def test_the_entry_module_imports_nothing_before_its_handlers() -> None:
    """The console script's module holds the signals before anything slow is imported."""
    probe = (
        "import sys; import fleet_trio.launch; "
        "print(sorted(m for m in ('trio', 'fleet_trio.cli', 'signal', 'attrs') "
        "if m in sys.modules))"
    )
    with trio.fail_after(30):
        done = await trio.run_process(
            [PY, "-S", "-c", probe],
            capture_stdout=True,
            check=False,
            env={"PYTHONPATH": str(Path(__file__).resolve().parents[1])},
        )
    assert done.stdout.decode().strip() == "[]", done.stdout
