"""The simulated controller's interactive relay: the worker halves E8/E9 (worker-protocol §3.8).

Mounted on the sim's quart-trio app by :func:`mount_relay` (one call in ``create_app``):

* ``POST /v1/jobs/<id>/tty/out`` (E8, worker-out): auth as every worker route (401/403), the
  job must exist (else ``404 not_found "job not found"``), the half must be free (else
  ``409 conflict "that half of this job's terminal is already connected"``). The answer is a
  ``200`` whose head is flushed at once (hypercorn sends ``http.response.start`` straight to
  the socket) while the handler goes on reading the chunked request body: full duplex over
  plain quart-trio, no second server needed. Every chunk is appended to the session's
  output; the end of the body (or a dropped connection) ends the session: :attr:`ended`.
* ``GET /v1/jobs/<id>/tty/in`` (E9, worker-in): same checks; ``200
  application/x-ndjson`` flushed at once, then the operator's input, open-ended. It ends when
  the operator closes the input (the worker's stdin EOF) or when the session ended.

Both responses are streamed by async generators with the response timeout off
(``Response.timeout = None``); quart-trio cancels the generator when the worker disconnects,
which frees the half (a reconnect is then accepted, and input not yet sent is kept for it).

Sessions are kept per job (``SimController.relay_sessions``), created by whichever half
(worker or operator) comes first; :func:`operator` plays the operator from Python. Input is
encoded per the job's ``stdio``: NDJSON frames for ``tty``, raw bytes for ``pipe`` (§8.2).

Not modelled: the client halves over HTTP (``GET …/tty/out``, ``POST …/tty/in``), the
controller's unbuffered back-pressure (output is buffered without bound here), ``500
unsupported``; relay requests are recorded in ``ctrl.requests()`` as ``tty_out``/``tty_in``
(empty bodies) but take no ``fail_next``/``drop_next`` injections.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import trio
from quart import Response, request
from quart_trio import QuartTrio

from fleet_trio.sim.client_api import error_reply
from fleet_trio.worker.relay import encode_data, encode_resize

if TYPE_CHECKING:
    from fleet_trio.sim.controller import SimController

NDJSON = "application/x-ndjson"
CONFLICT_MESSAGE = "that half of this job's terminal is already connected"


class RelaySession:
    """One job's terminal on the controller: the worker's two halves and the operator's side."""

    def __init__(self, job_id: str, mode: str) -> None:
        self.job_id = job_id
        self.mode = mode
        """The job's ``stdio`` (``tty``/``pipe``; ``""`` if the job was unknown)."""
        self.worker_out = False
        """The worker-out half (E8) is connected."""
        self.worker_in = False
        """The worker-in half (E9) is connected."""
        self.out_connections = 0
        self.in_connections = 0
        self.ended = False
        """The worker's out-stream ended (body finished, or connection dropped)."""
        self.ended_cleanly = False
        """... by the end of its body (the terminating chunk), not a dropped connection."""
        self._output = bytearray()
        self._input = bytearray()
        self._input_closed = False
        self._changed = trio.Event()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    # ------------------------------------------------------------------ operator API
    async def send(self, data: bytes) -> None:
        """Type ``data``: a data frame for a ``tty`` job, the raw bytes for a ``pipe`` job."""
        await self.send_raw(data if self.mode == "pipe" else encode_data(data))

    async def resize(self, rows: int, cols: int) -> None:
        """A resize frame (``tty``)."""
        await self.send_raw(encode_resize(rows, cols))

    async def send_raw(self, data: bytes) -> None:
        """Bytes exactly as given, onto the worker's input stream (malformed frames, tests)."""
        await trio.lowlevel.checkpoint()
        if self._input_closed:
            raise RuntimeError("the operator's input is closed")
        self._input += data
        self._notify()

    async def close_input(self) -> None:
        """End the operator's input: once sent, the worker's input stream ends (stdin EOF)."""
        await trio.lowlevel.checkpoint()
        self._input_closed = True
        self._notify()

    def output(self) -> bytes:
        """Everything the worker sent on its out-stream so far."""
        return bytes(self._output)

    async def wait_output(
        self,
        pattern: bytes | str | re.Pattern[bytes],
        timeout: float = 5.0,  # noqa: ASYNC109 -- the documented test API
    ) -> bytes:
        """Wait until the output contains ``pattern`` (bytes, text, or a bytes regex);
        returns the output. ``trio.TooSlowError`` after ``timeout`` seconds."""
        if isinstance(pattern, str):
            pattern = pattern.encode()
        with trio.fail_after(timeout):
            while True:
                changed = self._changed
                out = bytes(self._output)
                if isinstance(pattern, bytes):
                    if pattern in out:
                        return out
                elif pattern.search(out):
                    return out
                await changed.wait()

    async def wait_ended(self, timeout: float = 5.0) -> bytes:  # noqa: ASYNC109
        """Wait until the worker's out-stream ended; returns the whole output."""
        with trio.fail_after(timeout):
            while not self.ended:
                await self._changed.wait()
        return bytes(self._output)

    async def wait_connected(self, timeout: float = 5.0, *, out: bool = True) -> None:  # noqa: ASYNC109
        """Wait until both halves (``out=False``: the in half alone) are connected."""
        with trio.fail_after(timeout):
            while not (self.worker_in and (self.worker_out or not out)):
                await self._changed.wait()

    # ------------------------------------------------------------------ server side
    async def _receive_output(self, body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        try:
            async for chunk in body:
                if chunk:
                    self._output += chunk
                    self._notify()
            self.ended_cleanly = True
        finally:
            self.worker_out = False
            self.ended = True
            self._notify()
        empty: tuple[bytes, ...] = ()
        for nothing in empty:  # an async generator that yields nothing: the answer has no body
            yield nothing

    async def _send_input(self) -> AsyncIterator[bytes]:
        try:
            while True:
                changed = self._changed
                if self._input:
                    data = bytes(self._input)
                    self._input.clear()
                    yield data
                    continue
                if self._input_closed or self.ended:
                    return
                await changed.wait()
        finally:
            self.worker_in = False
            self._notify()


def operator(ctrl: SimController, job_id: str) -> RelaySession:
    """Play the operator of ``job_id``'s terminal: its session, created on first use (by
    either side)."""
    session = ctrl.relay_sessions.get(job_id)
    if session is None:
        job = ctrl._jobs.get(job_id)
        session = ctrl.relay_sessions[job_id] = RelaySession(job_id, job.stdio if job else "")
    return session


def mount_relay(app: QuartTrio, ctrl: SimController) -> None:
    """Add E8/E9 to the sim's app (``create_app`` calls this)."""

    def claim(side: str, job_id: str) -> RelaySession | Response:
        """Record and authorize a ``tty_<side>`` request; the session, with the worker's
        ``side`` connection marked open, or the refusal (401, 404, 409)."""
        from fleet_trio.sim.controller.app import authorize, record

        record(ctrl, f"tty_{side}", b"")
        denied = authorize(ctrl)
        if denied is not None:
            return denied
        if job_id not in ctrl._jobs:
            return error_reply(404, "not_found", "job not found")
        session = operator(ctrl, job_id)
        if getattr(session, f"worker_{side}"):
            return error_reply(409, "conflict", CONFLICT_MESSAGE)
        setattr(session, f"worker_{side}", True)
        count = f"{side}_connections"
        setattr(session, count, getattr(session, count) + 1)
        session._notify()
        ctrl._notify()
        return session

    async def tty_out(job_id: str) -> Response:
        session = claim("out", job_id)
        if isinstance(session, Response):
            return session
        body = request.body  # read by the generator, after the 200 head went out
        resp = Response(session._receive_output(body), status=200)
        del resp.headers["Content-Type"]
        resp.timeout = None
        return resp

    async def tty_in(job_id: str) -> Response:
        session = claim("in", job_id)
        if isinstance(session, Response):
            return session
        resp = Response(session._send_input(), status=200, content_type=NDJSON)
        resp.timeout = None
        return resp

    app.add_url_rule("/v1/jobs/<job_id>/tty/out", "tty_out", tty_out, methods=["POST"])
    app.add_url_rule("/v1/jobs/<job_id>/tty/in", "tty_in", tty_in, methods=["GET"])


__all__ = ["CONFLICT_MESSAGE", "NDJSON", "RelaySession", "mount_relay", "operator"]
