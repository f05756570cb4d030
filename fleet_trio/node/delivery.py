"""Delivery-checked acks: a dispatch is an ack only while its client can still get the 202.

A node frozen past its dispatcher's client timeout (SIGSTOP, a swap storm, a long GC pause, a
slow commit) finds, when it runs again, requests whose clients gave up: the dispatcher took the
missing 202 as a refusal and sent the same id elsewhere. Answering 202 to nobody and running the
job would run it twice. So a dispatch is checked on its way to becoming an ack
(docs/node.md "Delivery-checked acks"):

1. before its ack is committed (right before registration, and again when the journal takes
   the ack for its commit): a client gone (EOF or reset on its connection,
   :mod:`fleet_trio.nursery.peer`) or a request older than ``ack_deadline`` (arrival → commit)
   is refused — nothing is written; the answer is 503 (``ack deadline passed`` for a late
   request);
2. after the commit, right before the 202 is returned: a client gone then takes the ack back
   (:meth:`~fleet_trio.node.jobs.JobStore.withdraw`);
3. after the 202's bytes were handed to the kernel, right before the job is released: a
   connection reset by then means the 202 was never read, and the ack is taken back too. An EOF
   then is a client that read its 202 and closed: delivered.

A taken-back ack leaves the id unknown (poll 404; a re-dispatch of the id is a fresh ack) and
its job never starts. One line is logged per refusal, naming the job id and why.
"""

from __future__ import annotations

import trio

from fleet_trio.nursery.peer import Peer

DEFAULT_ACK_DEADLINE = 2.0
"""Seconds from a dispatch's arrival to its ack's commit after which the ack is refused
(``node.timings.ack_deadline``): well under the 3 s or more a dispatcher's client waits."""

MSG_ACK_DEADLINE = "ack deadline passed"
"""The 503 message of a dispatch whose ack would have been committed past ``ack_deadline``."""
MSG_CLIENT_GONE = "client gone"
"""The 503 message of a dispatch whose client is gone (written to nobody; for the log)."""
NOT_WRITTEN = "the request ended before its 202 was written"


class Delivery:
    """One dispatch on its way to its client: its arrival, its deadline, its connection.

    ``peer`` is ``None`` when the server gives no connection (a test's ASGI client): only the
    deadline is checked then."""

    def __init__(self, peer: Peer | None, arrived: float, ack_deadline: float) -> None:
        self.peer = peer
        self.arrived = arrived
        self.ack_deadline = ack_deadline
        self.answered = False
        """The handler returned the 202 (its write may still fail)."""
        self.refused: str | None = None
        """The 503 message of the last refusal :meth:`before_commit` gave."""

    def gone(self) -> str | None:
        """Why the client is gone (EOF or reset), or ``None``."""
        return self.peer.gone() if self.peer is not None else None

    def late(self) -> str | None:
        """Why the request is too old to be acked now, or ``None`` (an age of exactly
        ``ack_deadline`` is still acked)."""
        age = trio.current_time() - self.arrived
        if age > self.ack_deadline:
            return f"the request is {age:.3g} s old, past ack_deadline {self.ack_deadline:g} s"
        return None

    def before_commit(self) -> str | None:
        """Checkpoint 1: why the ack must not be committed now (a client gone, a late
        request), or ``None``. Remembers the refusal's 503 message in :attr:`refused`."""
        gone = self.gone()
        if gone is not None:
            self.refused = MSG_CLIENT_GONE
            return f"{gone} before its ack was committed"
        late = self.late()
        if late is not None:
            self.refused = MSG_ACK_DEADLINE
            return late
        return None

    def gone_before_202(self) -> str | None:
        """For a job whose release waited its full bound: why its client is gone while its
        202 is still unwritten (EOF or reset), or — once the handler returned the 202, whose
        bytes may have reached the client since — only a reset (:meth:`lost`)."""
        return self.lost() if self.answered else self.gone()

    def answering(self) -> None:
        """Right before the 202 is returned: its connection notes what must be acknowledged
        for the 202 to have reached the client (:meth:`Peer.answering`)."""
        if self.peer is not None:
            self.peer.answering()

    def lost(self) -> str | None:
        """Checkpoint 3, after the 202 was handed over: why it cannot have been read (the
        connection was reset), or ``None``."""
        reset = self.peer.reset() if self.peer is not None else None
        return f"{reset} before its 202 could be read" if reset is not None else None


__all__ = [
    "DEFAULT_ACK_DEADLINE",
    "MSG_ACK_DEADLINE",
    "MSG_CLIENT_GONE",
    "NOT_WRITTEN",
    "Delivery",
]
