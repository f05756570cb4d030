"""What SIGTERM/SIGKILL are aimed at: a process group, or a whole session (PTY jobs)."""

from __future__ import annotations

import os
from typing import Protocol

import attrs

from fleet_trio.proc.procfs import group_alive, group_settling, session_alive, session_pgids


class Target(Protocol):
    def signal(self, sig: int) -> bool:
        """Send ``sig``; True iff ``kill(2)`` succeeded (zombie members count)."""
        ...

    def alive(self) -> bool:
        """Does the target hold a live (non-zombie) process?"""
        ...

    def settling(self) -> bool:
        """Are all of its live processes already exiting by themselves?"""
        ...


@attrs.frozen
class GroupTarget:
    """A process group (piped jobs, hooks, probes, verify scripts)."""

    pgid: int

    def signal(self, sig: int) -> bool:
        try:
            os.killpg(self.pgid, sig)
        except OSError:
            return False
        return True

    def alive(self) -> bool:
        return group_alive(self.pgid)

    def settling(self) -> bool:
        return group_settling(self.pgid)


@attrs.frozen
class SessionTarget:
    """Every process group in a session, zombies included (PTY jobs)."""

    sid: int

    def signal(self, sig: int) -> bool:
        pgids, _scanned = session_pgids(self.sid)
        delivered = False
        for pgid in sorted(pgids):
            try:
                os.killpg(pgid, sig)
            except OSError:
                continue
            delivered = True
        return delivered

    def alive(self) -> bool:
        return session_alive(self.sid)

    def settling(self) -> bool:
        return False


__all__ = ["GroupTarget", "SessionTarget", "Target"]
