"""The interactive relay, worker side: ``stdio: tty`` and ``stdio: pipe`` jobs.

worker-protocol.md §3.8 (E8/E9), §8.2 (relay modes), §7.2 (row "relay dial failure");
worker-process.md §8.1 and §8.5.

Three layers, one module each (:mod:`.frames`, :mod:`.streams`, :mod:`.attached`):

* **Frame codec** (§8.2 "Input frame format"): :mod:`.frames` (its docstring has the format).
* **The two streams** (E8 output, E9 input), each an HTTP/1.1 exchange over its own connection:
  :mod:`.streams` (its docstring has the full-duplex rule and the errors).

* :func:`run_attached`: open E8, then E9 (the reference's order), then run the job:

  - ``tty``: :func:`~fleet_trio.proc.pty.start_pty`; PTY output → E8 body, raw; E9 frames →
    PTY input, resizes applied (a size with a 0 dimension is ignored, logged); malformed input
    ends input handling (logged), not the job; input EOF does nothing. After the process ends
    the output copy gets up to :data:`DRAIN_TIMEOUT` (2 s) to reach EOF, then the PTY is torn
    down and both streams closed. Nothing is written to the log endpoint.
  - ``pipe``: :func:`~fleet_trio.proc.run.run` with ``stdin_source`` = the E9 body (**raw
    bytes**, as §8.2 and worker-process §8.1 say: only tty input is framed), stdout → E8,
    byte-exact; E9 EOF closes the child's stdin; stderr → ``stderr_sink`` (the spec sends
    pipe-mode stderr to the log endpoint, E6: pass the job's log shipper; ``None`` discards
    it). ``run`` never waits for the stdin copy (worker-process §2.3.3).

  Failures to open a half return ``Result(exit_code=-1, err="attach <mode> stdio: open
  output stream: <detail>")`` (or ``open input stream``) and start nothing (§7.2). A stop
  (``rc kill``) while a half is being opened returns ``Result(exit_code=-1, killed=True,
  reason="cancelled")``, nothing started (cancellation is never an ``err``, worker-process
  §2.2). Opening is bounded by ``open_timeout``; the streams themselves have no timeout, and
  back-pressure (nobody reading the operator's side) is not an error.

Trio only, no threads. Program shutdown (Trio cancellation): the process is torn down by
``run``/``PtySession.wait`` (shielded), the helpers are cancelled, both streams are closed
in shielded, bounded ``finally`` blocks, and ``Cancelled`` propagates.
"""

from fleet_trio.worker.relay import attached, frames, streams
from fleet_trio.worker.relay.attached import *  # noqa: F403
from fleet_trio.worker.relay.frames import *  # noqa: F403
from fleet_trio.worker.relay.streams import *  # noqa: F403

__all__ = [*attached.__all__, *frames.__all__, *streams.__all__]
