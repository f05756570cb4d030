"""The end of the story: the summary table, the exit status, the leftover-process check."""

from __future__ import annotations

import os
from collections.abc import Sequence

from fleet_trio.sim.demo.console import Console
from fleet_trio.sim.demo.model import EXIT_MISMATCH, EXIT_OK, RUN_MARKER, Step


def one_line(text: str, width: int = 200) -> str:
    """``text`` on one line (line breaks shown as `` / ``), cut at ``width`` characters."""
    text = " / ".join(part.strip() for part in text.strip().splitlines() if part.strip())
    return text if len(text) <= width else text[: width - 3] + "..."


def _short(text: str, width: int = 40) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def marked_processes(run_id: str, marker: str = RUN_MARKER) -> list[int]:
    """Live processes but this one whose environment holds ``marker=run_id`` (walks /proc)."""
    from fleet_trio.proc.procfs import list_pids, pid_alive, read_environ

    needle = f"{marker}={run_id}".encode()
    found = []
    for pid in list_pids() or []:
        if pid == os.getpid():
            continue
        try:
            env = read_environ(pid)
        except OSError:
            continue
        if needle in env.split(b"\0") and pid_alive(pid):
            found.append(pid)
    return found


def story_status(steps: Sequence[Step]) -> int:
    """0 when every step went as expected (or was skipped), else 1."""
    bad = [s for s in steps if s.status not in ("ok", "skipped")]
    return EXIT_MISMATCH if bad else EXIT_OK


def summary(con: Console, steps: Sequence[Step]) -> list[str]:
    """The final table, one line per step (the lines are returned too, uncoloured)."""
    head = ("#", "step", "where", "expected", "observed", "")
    rows = [
        (str(i), s.name, s.where, _short(s.expected), _short(s.observed), s.status)
        for i, s in enumerate(steps, 1)
    ]
    widths = [max(len(r[c]) for r in [head, *rows]) for c in range(5)]

    def fmt(row: tuple[str, ...]) -> str:
        cells = [row[0].rjust(widths[0])] + [row[c].ljust(widths[c]) for c in range(1, 5)]
        return "  ".join(cells) + "  " + row[5]

    lines = [fmt(head).rstrip()]
    con.say("")
    con.say(con.paint(lines[0], "bold"))
    for row in rows:
        line = fmt(row)
        lines.append(line)
        status = row[5]
        style = "green" if status == "ok" else "yellow" if status == "skipped" else "red"
        con.say(line[: -len(status)] + con.paint(status, style, "bold"))
    return lines
