"""The console entry point: shutdown signals are ours from the first line fleet-trio runs.

``fleet-trio`` (and ``python -m fleet_trio``) start here, in a module that imports nothing
but ``sys`` and the C module ``_signal`` before its handlers are in, so that SIGINT, SIGHUP
and SIGTERM are handled before the slow part of the start: importing trio, the web stack and
the config. Until then a Ctrl-C raised ``KeyboardInterrupt`` wherever the import
was (a traceback), and a SIGHUP or SIGTERM killed the process with the default action.

:class:`EarlySignals` is the handler until the command's task tree installs its own:

- outside trio (imports, argument parsing, the config load), a signal ends the process at
  once with one line, ``fleet-trio: SIGINT during startup: stopped (nothing was running)``;
  the process then dies by that signal's default action, so a shell reports 128 + n (130 for
  SIGINT, 129 for SIGHUP, 143 for SIGTERM) and systemd a clean stop;
- inside ``trio.run`` (before the task tree opens), it only records the signal: the tree's
  signal service (:func:`fleet_trio.nursery.signals.serve_shutdown_signals`) takes it over
  when it installs its handlers (``take_pending``), and it is a shutdown request like any
  later one. Raising there would break trio's run loop at an arbitrary point;
- once the command has ended, later signals are ignored (the process is exiting).

A command that does not serve signals through a task tree (``tail``, ``fake-gpu``, the
harness commands) gets the previous handlers back before it runs (:meth:`release`).

Not covered: the few milliseconds between the interpreter's start and this module's first
line (the interpreter's own set-up, the ``site`` module). A SIGINT there is Python's own
``KeyboardInterrupt``; a SIGHUP or SIGTERM there ends the process silently by its default
action. A SIGHUP that was ignored when the process started (``nohup``) stays ignored.
"""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any

# The C module: ``signal`` itself builds its enums at import, which took tens of milliseconds
# on a loaded machine, all of them a window for a KeyboardInterrupt traceback.
_signal: Any = __import__("_signal")

EARLY_SIGNALS: tuple[int, ...] = (_signal.SIGINT, _signal.SIGHUP, _signal.SIGTERM)
"""SIGTERM last: once a process catches SIGTERM, the other two are ours as well (a test that
waits for the start reads ``SigCgt`` in ``/proc/PID/status``)."""

PROG = "fleet-trio"


class EarlyStop(BaseException):
    """A shutdown signal before the command's task tree took the signals over.

    A ``BaseException``, like ``KeyboardInterrupt``: no ``except Exception`` on its way turns
    it into an error report."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal_name(self.signum)

    @property
    def status(self) -> int:
        """128 + n, as a shell reports a death by signal n."""
        return 128 + self.signum


class EarlySignals:
    """The shutdown signals' handler from the entry point to the task tree (module docstring).

    States: ``raising`` (outside trio: raise :class:`EarlyStop`), recording (inside a trio
    run: keep the signal for the tree), ``done`` (ignore). Installed with :meth:`install`.
    """

    def __init__(self) -> None:
        self.previous: dict[int, Any] = {}
        self.pending: list[int] = []
        self.done = False

    @classmethod
    def install(cls, signals: tuple[int, ...] = EARLY_SIGNALS) -> EarlySignals:
        """Handle ``signals`` from now on (SIGHUP not when it is ignored: ``nohup``)."""
        early = cls()
        for signum in signals:
            was = _signal.getsignal(signum)
            if signum == _signal.SIGHUP and was == _signal.SIG_IGN:
                continue  # nohup: the operator asked for the hangup to be ignored
            early.previous[signum] = was
            _signal.signal(signum, early)
        return early

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.done:
            return
        if _in_trio_run():
            self.pending.append(signum)  # the task tree's signal service takes it over
            return
        self.done = True  # a second signal while this one ends the process changes nothing
        raise EarlyStop(signum)

    def take_pending(self) -> list[int]:
        """The signals recorded inside trio, for the task tree to serve (once)."""
        pending, self.pending = self.pending, []
        return pending

    def release(self) -> None:
        """Give the signals back to the handlers that were there before, for a command that
        does not serve them itself (called outside trio, so nothing was recorded)."""
        for signum, was in self.previous.items():
            if _signal.getsignal(signum) is self:
                _signal.signal(signum, _signal.SIG_DFL if was is None else was)
        self.done = True


def _in_trio_run() -> bool:
    trio = sys.modules.get("trio")
    if trio is None:
        return False
    try:
        return bool(trio.lowlevel.in_trio_run())
    except AttributeError:  # trio half imported: not running yet
        return False


def signal_name(signum: int) -> str:
    import signal

    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def early_stop_line(stop: EarlyStop) -> str:
    return f"{PROG}: {stop.name} during startup: stopped (nothing was running)"


def _say(line: str) -> None:
    logs = sys.modules.get("fleet_trio.logs")
    try:
        if logs is not None:  # logging is set up: the line follows --log-format
            logs.console(line, logger="fleet_trio", level=30)
        else:
            print(line, file=sys.stderr, flush=True)
    except Exception:  # the terminal may be gone: a SIGHUP's usual cause
        pass


def _die_by(signum: int) -> int:
    """End the process by ``signum``'s default action, as a process without a handler would:
    a shell reports 128 + n, and systemd counts a stop by SIGTERM, SIGINT or SIGHUP as clean.
    Returns 128 + n should the process outlive it (the signal blocked)."""
    import os

    try:
        _signal.signal(signum, _signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    except OSError:
        pass
    return 128 + signum


def entry() -> int:
    """The ``fleet-trio`` console script and ``python -m fleet_trio``."""
    early = EarlySignals.install()
    try:
        from fleet_trio.cli import main

        return main(own_process=True, early=early)
    except EarlyStop as stop:
        _say(early_stop_line(stop))
        return _die_by(stop.signum)
    finally:
        early.done = True  # the process is exiting: a signal now changes nothing


__all__ = ["EARLY_SIGNALS", "EarlySignals", "EarlyStop", "early_stop_line", "entry"]
