"""The rc controller client of ``fleet-trio worker`` (worker-protocol.md §1–§3, §5.4, §8.1).

(Over 500 lines: the controller's seven endpoints share one retry rule, one instance tracker and
one converter; splitting them would spread one wire contract over several files.)

Every worker-side request/response endpoint (E1–E7) with the reference's exact paths, bodies
and headers (``Authorization: Bearer``, ``Content-Type: application/json`` everywhere, path
segments unescaped), the ``Rc-Controller-Instance`` tracking of every exchange
(:class:`ContactTracker`, a plain synchronous class), the retry rules, and the log batching.

One deliberate difference from the reference: terminal reports, log chunks and the worker's
own fault reports (``report_fault(..., keep=True)``) are *kept* through a controller outage
and delivered, in order, once it answers again (:meth:`ControllerClient.deliver`), unless the
controller has meanwhile written the worker off (no contact for ``Timings.patience``, the
controller's 5-minute ``worker_lost`` horizon, after which it has declared the job ``lost``).
The reference gives up after 5 tries × 5 s. A log chunk given up takes its job's backlog with
it (:class:`LogShipper`), and from the shutdown on chunks get one attempt
(:meth:`ControllerClient.stop_log_retries`), as in the reference.

cattrs is used only at the wire edge (:data:`converter`, :func:`register_hooks`); the worker
never imports ``fleet_trio.sim``: these are its own wire types.
"""

from __future__ import annotations

import json
import logging
import math
import random
import zlib
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import cattrs
import httpx
import trio

from fleet_trio.backoff import Backoff
from fleet_trio.durations import go_duration_seconds
from fleet_trio.errors import WireError
from fleet_trio.inputs import InputError, id_problem, loads_json, printable
from fleet_trio.worker.outage import FailureRun

if TYPE_CHECKING:
    from fleet_trio.worker.metrics import WorkerMetrics

log = logging.getLogger(__name__)

INSTANCE_HEADER = "Rc-Controller-Instance"
"""The controller identity header, read from every response (§1.4, §5.4)."""

MAX_LOG_CHUNK = 1 << 20
"""§3.6: the controller refuses a chunk over 1 MiB with 413; no chunk we send exceeds it."""
LOG_FLUSH_BYTES = 65536
"""§8.1: flush once the buffer holds this many bytes."""
MAX_REASON_BYTES = 65536
"""A terminal report's reason is cut to this many bytes (the kept report stays bounded)."""
MAX_ANSWER_SECONDS = ((1 << 63) - 1) // 1_000_000_000
"""The largest ``max_runtime_seconds`` / ``idle_timeout_seconds`` accepted: the most whole
seconds a Go ``time.Duration`` holds (9,223,372,036, some 292 years), what the reference can
take; beyond it its limit would overflow."""
ANSWER_MAX_DEPTH = 8
"""A poll answer is nested 4 deep (answer, assignments, assignment, env); deeper is refused."""
MAX_ANSWER_BYTES = 32 << 20
"""A register or poll answer (2xx) longer than this is refused: the request fails and the
connection is closed. A poll answer holds at most one assignment per device, and each job's
command and environment are bounded by the kernel's argument limit (2 MiB by default): 32 MiB
holds 16 devices' worth of the largest jobs the kernel would start (a typical answer is a few
KiB)."""
MAX_ERROR_BODY = 64 * 1024
"""Of any other answer body (an error's, or a 2xx nobody reads) at most this much is read;
the rest is left unread and the connection closed."""

Labels = dict[str, dict[str, str]]


# --------------------------------------------------------------------------------------------
# Timings (every one overridable, so tests can shrink them)
# --------------------------------------------------------------------------------------------


@attrs.frozen
class Timings:
    """Client-side constants of worker-protocol.md §13, in float seconds."""

    request_timeout: float = 120.0
    """Request/response calls, the whole exchange (connect, send, the full answer), as Go's
    ``Client.Timeout``; the long poll adds its own wait on top."""
    report_attempt_timeout: float = 5.0
    """One attempt of a terminal report, fault report or log chunk."""
    report_backoff: tuple[float, ...] = (0.2, 0.4, 0.8, 1.6)
    """Sleeps between attempts; the last value repeats (the kept outbox keeps trying)."""
    report_attempts_4xx: int = 5
    """A terminal report refused with a 4xx this many times is given up (reference parity)."""
    report_attempts_5xx: int = 20
    """A message answered with a 5xx this many times is given up: the controller is up, so this
    is not an outage (e.g. 500 ``log_error`` for a job id it cannot store)."""
    fault_attempts: int = 5
    """Plain fault reports (``report_fault`` without ``keep``): at most this many attempts;
    only transport errors and 5xx retry. The worker's own faults are kept (:meth:`deliver`)."""
    shutdown_report_attempts: int = 5
    """Once the shutdown began, a kept report (terminal, or the worker's own fault) that this
    many attempts in a row got no answer (no connection, or none within the attempt's
    timeout) is given up, as the reference gives up after its 5 tries: a drain does not wait
    its whole 45 s on a controller that is gone."""
    patience: float = 300.0
    """No contact for this long ⇒ the controller has written us off (jobs ``lost``): drop
    what is kept for delivery."""
    outbox_max_age: float = 1800.0
    """A kept report/chunk is dropped after this long even while the controller answers 5xx."""
    log_flush_bytes: int = LOG_FLUSH_BYTES
    log_flush_delay: float = 1.0
    log_outbox_limit: int = 16 << 20
    """Bytes of unsent output kept per job; output beyond it is dropped (logged)."""


# --------------------------------------------------------------------------------------------
# The contact tracker (§5.4): sans-IO
# --------------------------------------------------------------------------------------------


class ContactTracker:
    """Instance changes, last contact and the "re-register when idle" debt (§5.4).

    ``observe`` after every completed exchange (any HTTP status; not failed connections).
    ``due(now, busy=...)`` is consulted by the poll loop after an idle poll; when it says yes
    the caller calls ``attempt(now)`` then ``succeeded()`` or nothing (a failure stays owed,
    paced by ``retry_pacing``).
    """

    def __init__(
        self,
        *,
        silence: float = 300.0,
        jitter_window: float = 30.0,
        retry_pacing: float = 60.0,
        rng: random.Random | None = None,
    ) -> None:
        self.silence = silence
        self.jitter_window = jitter_window
        self.retry_pacing = retry_pacing
        self._rng = rng if rng is not None else random.Random()
        self.last_contact: float | None = None
        self.instance = ""
        self.due_at: float | None = None

    def jitter(self) -> float:
        """A fresh draw in ``[0, jitter_window)``."""
        if self.jitter_window <= 0:
            return 0.0
        return min(self._rng.random() * self.jitter_window, self.jitter_window)

    def observe(self, now: float, instance: str | None) -> bool:
        """Record one completed exchange; return True when it armed a re-registration."""
        arm = False
        if self.last_contact is not None and now - self.last_contact >= self.silence:
            arm = True
        if instance and self.instance and instance != self.instance:
            arm = True
        if instance:
            self.instance = instance
        if self.last_contact is None or now > self.last_contact:
            self.last_contact = now
        if arm and self.due_at is None:
            self.due_at = now + self.jitter()
            return True
        return False

    @property
    def owed(self) -> bool:
        return self.due_at is not None

    def due(self, now: float, *, busy: bool) -> bool:
        """True when a re-registration should be sent now (owed, due, and nothing supervised)."""
        return self.due_at is not None and now >= self.due_at and not busy

    def attempt(self, now: float) -> None:
        """A re-registration is being sent: pace the next try (kept if this one fails)."""
        self.due_at = now + self.retry_pacing

    def succeeded(self) -> None:
        """The re-registration was accepted: nothing is owed."""
        self.due_at = None

    def silent_for(self, now: float) -> float | None:
        """Seconds since the last contact, ``None`` before the first."""
        return None if self.last_contact is None else now - self.last_contact


# --------------------------------------------------------------------------------------------
# Wire types (attrs values; cattrs only through ``converter``)
# --------------------------------------------------------------------------------------------


@attrs.frozen
class DeviceDecl:
    name: str
    max_runtime_seconds: int = 0


@attrs.frozen
class Registration:
    """E1 body (§3.1). ``recovery`` is the wire dict (``None`` = omitted)."""

    host: str
    devices: tuple[DeviceDecl, ...] = ()
    boot_id: str = ""
    recovery: dict[str, bool] | None = None
    labels: Labels | None = None
    declared_labels: dict[str, dict[str, str] | None] = attrs.Factory(dict)
    sheet: str | None = ""
    device_sheets: dict[str, str] = attrs.Factory(dict)


@attrs.frozen
class Assignment:
    """One E4 assignment (§3.4)."""

    job_id: str
    device_id: str
    command: tuple[str, ...] = ()
    cwd: str = ""
    env: dict[str, str] = attrs.Factory(dict)
    max_runtime_seconds: int = 0
    idle_timeout_seconds: int = 0
    submitter: str = ""
    kind: str = ""
    stdio: str = ""

    @property
    def is_hold(self) -> bool:
        return self.kind == "hold"


@attrs.frozen
class Refused:
    """One assignment of a poll answer that could not be taken (a member of the wrong type
    or out of range, an invalid id). ``job_id``: its id when that much was usable (the worker
    then reports the job ``failed`` with ``reason``), else ``None``."""

    reason: str
    """Why, safe for a log line (escaped, bounded)."""
    job_id: str | None = None


@attrs.frozen
class PollAnswer:
    """An E4 answer; a 204 is the empty answer.

    Decoded item by item: ``refused`` holds the assignments that could not be taken and
    ``bad_kills`` the reasons kill ids were skipped; the rest of the answer stands."""

    assignments: tuple[Assignment, ...] = ()
    kills: tuple[str, ...] = ()
    refused: tuple[Refused, ...] = ()
    bad_kills: tuple[str, ...] = ()


@attrs.frozen
class StatusReport:
    """E5 body (§3.5). ``exit_code`` ``None`` = key absent."""

    worker_id: str
    state: str
    exit_code: int | None = None
    reason: str = ""


def register_hooks(conv: cattrs.Converter) -> None:
    """Teach ``conv`` the omitempty rules of §3 (unstructure) and lenient decoding (structure)."""

    def unstructure_registration(r: Registration) -> dict[str, Any]:
        body: dict[str, Any] = {"host": r.host}
        if r.boot_id:
            body["boot_id"] = r.boot_id
        if r.recovery:
            body["recovery"] = dict(r.recovery)
        body["devices"] = [
            {"name": d.name, "max_runtime_seconds": d.max_runtime_seconds}
            if d.max_runtime_seconds  # omitempty
            else {"name": d.name}
            for d in r.devices
        ]
        body["labels"] = r.labels
        body["declared_labels"] = dict(r.declared_labels)
        if r.sheet is not None:
            body["sheet"] = r.sheet
        if r.device_sheets:
            body["device_sheets"] = dict(r.device_sheets)
        return body

    def unstructure_status(s: StatusReport) -> dict[str, Any]:
        body: dict[str, Any] = {"worker_id": s.worker_id, "state": s.state}
        if s.exit_code is not None:
            body["exit_code"] = s.exit_code
        if s.reason:
            body["reason"] = s.reason
        return body

    def structure_assignment(data: Any, _: type) -> Assignment:
        """Strict: every member its wire type, ids in the documented set, seconds in range."""
        if not isinstance(data, Mapping):
            raise WireError("assignment is not an object")
        job_id = answer_id(data, "job_id")
        where = f"assignment {job_id}"
        env = data.get("env") or {}
        command = data.get("command") or []
        if not isinstance(env, Mapping) or not isinstance(command, list):
            raise WireError(f"{where}: env/command have the wrong type")
        if not all(isinstance(c, str) for c in command):
            raise WireError(f"{where}: command must be an array of strings")
        if not all(isinstance(v, str) for v in env.values()):
            raise WireError(f"{where}: env must map strings to strings")
        return Assignment(
            job_id=job_id,
            device_id=answer_id(data, "device_id", where),
            command=tuple(command),
            cwd=answer_str(data, "cwd", where),
            env=dict(env),
            max_runtime_seconds=answer_seconds(data, "max_runtime_seconds", where),
            idle_timeout_seconds=answer_seconds(data, "idle_timeout_seconds", where),
            submitter=answer_str(data, "submitter", where),
            kind=answer_str(data, "kind", where),
            stdio=answer_str(data, "stdio", where),
        )

    def structure_poll(data: Any, _: type) -> PollAnswer:
        """Item by item: a bad assignment or kill id is set aside alone (the rest of the answer
        stands); only an answer that is not an object, or whose ``assignments`` / ``kills``
        are not arrays, is refused whole."""
        if not isinstance(data, Mapping):
            raise WireError("poll answer is not an object")
        raw = data.get("assignments") or []
        raw_kills = data.get("kills") or []
        if not isinstance(raw, list) or not isinstance(raw_kills, list):
            raise WireError("poll answer has the wrong shape (assignments/kills not arrays)")
        kills: list[str] = []
        bad_kills: list[str] = []
        for k in raw_kills:
            if not isinstance(k, str) or id_problem(k) is not None:
                bad_kills.append(f"kills: invalid job id {_shown(k)}")
            else:
                kills.append(k)
        assignments: list[Assignment] = []
        refused: list[Refused] = []
        for a in raw:
            try:
                assignments.append(conv.structure(a, Assignment))
            except (WireError, ValueError, TypeError) as exc:
                refused.append(Refused(printable(str(exc), limit=300), _usable_id(a)))
        return PollAnswer(
            assignments=tuple(assignments),
            kills=tuple(kills),
            refused=tuple(refused),
            bad_kills=tuple(bad_kills),
        )

    conv.register_unstructure_hook(Registration, unstructure_registration)
    conv.register_unstructure_hook(StatusReport, unstructure_status)
    conv.register_structure_hook(Assignment, structure_assignment)
    conv.register_structure_hook(PollAnswer, structure_poll)


def _usable_id(data: object) -> str | None:
    """The ``job_id`` of a refused assignment when it is itself valid, else ``None``."""
    if not isinstance(data, Mapping):
        return None
    value = data.get("job_id")
    if isinstance(value, str) and id_problem(value) is None:
        return value
    return None


def _shown(value: object) -> str:
    """A value from the controller, safe for a log line (quoted, escaped, cut)."""
    text = value if isinstance(value, str) else json.dumps(value)[:80]
    return '"' + printable(text, limit=80) + '"' if isinstance(value, str) else printable(text)


def answer_id(data: Mapping[str, Any], name: str, where: str = "assignment") -> str:
    """A controller-side id used in paths, env and logs: checked like every outside id."""
    value = data.get(name)
    if not isinstance(value, str):
        raise WireError(f"{where}: {name} must be a string, got {_shown(value)}")
    problem = id_problem(value)
    if problem is not None:
        raise WireError(f"{where}: invalid {name} {_shown(value)}: {problem}")
    return value


def answer_str(data: Mapping[str, Any], name: str, where: str) -> str:
    value = data.get(name)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise WireError(f"{where}: {name} must be a string, got {_shown(value)}")
    return value


def answer_seconds(data: Mapping[str, Any], name: str, where: str) -> int:
    """Whole seconds, 0 (none) to :data:`MAX_ANSWER_SECONDS`; Go refuses ``1.5`` and so do we."""
    value = data.get(name)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise WireError(f"{where}: {name} must be an integer, got {_shown(value)}")
    if not 0 <= value <= MAX_ANSWER_SECONDS:
        raise WireError(
            f"{where}: {name} out of range (0 to {MAX_ANSWER_SECONDS}), got {_shown(value)}"
        )
    return value


def decode_answer(conv: cattrs.Converter, content: bytes) -> PollAnswer:
    """An E4 answer body → :class:`PollAnswer`; any problem is a :class:`WireError` whose
    message is safe to log (depth-bounded, finite numbers only, strict types, checked ids)."""
    try:
        data = loads_json(content, max_depth=ANSWER_MAX_DEPTH, go_text=True)
    except InputError as exc:
        raise WireError(str(exc)) from None
    try:
        answer: PollAnswer = conv.structure(data, PollAnswer)
    except WireError:
        raise
    except (ValueError, TypeError, cattrs.BaseValidationError) as exc:  # pragma: no cover
        raise WireError(printable(str(exc), limit=200)) from None
    return answer


def make_converter() -> cattrs.Converter:
    conv = cattrs.Converter()
    register_hooks(conv)
    return conv


def encode(conv: cattrs.Converter, value: object) -> bytes:
    return json.dumps(conv.unstructure(value), separators=(",", ":")).encode()


# --------------------------------------------------------------------------------------------
# The client
# --------------------------------------------------------------------------------------------


def _compact(body: object) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


class ControllerError(Exception):
    """A request that got no usable answer: transport failure or an unexpected status."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@attrs.frozen
class Answer:
    """One controller answer, read with a size cap (:meth:`ControllerClient.request`)."""

    status_code: int
    headers: httpx.Headers
    content: bytes
    """At most the cap; ``cut``: there was more (left unread, the connection closed)."""
    cut: bool = False

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")


def _body_excerpt(answer: Answer, limit: int = 200) -> str:
    """The start of an answer's body for a log line: escaped, at most ``limit`` characters."""
    text = printable(
        answer.content[: limit * 4].decode("utf-8", errors="replace").strip(), limit=limit
    )
    return text + (" [cut]" if answer.cut and len(text) < limit else "")


async def _aiter_once(data: bytes) -> AsyncIterator[bytes]:
    yield data


def _inflater(encoding: str) -> zlib._Decompress | None:
    """The decoder of an answer's ``Content-Encoding`` (``None``: the body is as sent). Only
    ``gzip`` is asked for (the reference's ``Accept-Encoding``); anything else is refused."""
    name = encoding.strip().lower()
    if name in ("", "identity"):
        return None
    if name in ("gzip", "x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    raise httpx.DecodingError(f"unsupported Content-Encoding {printable(encoding, limit=40)!r}")


def _inflate(
    inflate: zlib._Decompress, raw: bytes, room: int
) -> tuple[list[bytes], zlib._Decompress]:
    """Inflate ``raw`` (never more than ``room`` + 1 bytes out: a zip bomb stops at the cap),
    going on into the next gzip member as Go's multistream reader does; bytes after a member
    that are no gzip member are a :class:`httpx.DecodingError` (Go's ``invalid header``)."""
    out: list[bytes] = []
    data = raw
    try:
        while data:
            chunk = inflate.decompress(data, room + 1)
            out.append(chunk)
            room -= len(chunk)
            if room < 0:
                break  # over the cap: the caller cuts here
            if inflate.eof and inflate.unused_data:
                data = inflate.unused_data
                inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
                continue
            data = b""
    except zlib.error as exc:
        raise httpx.DecodingError(f"bad gzip body: {exc}") from None
    return out, inflate


def _http_error(what: str, response: Answer) -> ControllerError:
    return ControllerError(
        f"{what}: HTTP {response.status_code}: {_body_excerpt(response)}", response.status_code
    )


def _too_long(what: str, response: Answer, limit: int) -> ControllerError:
    return ControllerError(
        f"{what}: answer (HTTP {response.status_code}) longer than {limit >> 20} MiB: refused, "
        "connection closed",
        response.status_code,
    )


def _ok(status: int | None) -> bool:
    return status is not None and 200 <= status < 300


class ControllerClient:
    """httpx (on trio) client of the controller's worker routes.

    Use as ``async with ControllerClient(...) as client``. Every completed exchange is fed to
    ``tracker``; transport failures are not contact.
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        tracker: ContactTracker | None = None,
        timings: Timings | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/") if base_url.strip("/") else base_url
        self.metrics = metrics
        """Request latency and outcomes by endpoint (docs/metrics.md); ``None``: not counted."""
        self.token = token
        self.tracker = tracker if tracker is not None else ContactTracker()
        self.timings = timings if timings is not None else Timings()
        self.converter = make_converter()
        self.attempt_deadline = math.inf
        """``trio.current_time()`` past which no report or chunk attempt runs (the worker
        sets it to its shutdown's hurry deadline, :meth:`cut_attempts_at`)."""
        self._attempts: set[trio.CancelScope] = set()
        self.log_retries = True
        """False once the shutdown's drain has begun (:meth:`stop_log_retries`)."""
        self.heartbeats = FailureRun("heartbeat")
        """Heartbeats that got no answer, told in one line a minute."""
        self._http = httpx.AsyncClient(
            transport=transport,
            timeout=httpx.Timeout(self.timings.request_timeout),
            headers={
                "Authorization": f"Bearer {token}",
                "Content-Type": "application/json",
                "Accept-Encoding": "gzip",  # the reference's; decoded here, within the cap
            },
        )

    async def __aenter__(self) -> ControllerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True), trio.move_on_after(2.0):
            await self._http.aclose()

    # -- one exchange ----------------------------------------------------------------------
    async def request(
        self,
        method: str,
        path: str,
        *,
        content: bytes | None = None,
        params: Mapping[str, str] | None = None,
        http_timeout: float | None = None,
        answer_limit: int = MAX_ERROR_BODY,
    ) -> Answer:
        """One exchange. Raises :class:`ControllerError` on a transport failure only.

        The whole exchange (connect, send, headers, the full body) is bounded by
        ``http_timeout`` (default ``Timings.request_timeout``), as Go's ``Client.Timeout``
        bounds it: a controller that trickles its answer is a timeout, not a hang. The body
        is read streamed: of a 2xx at most ``answer_limit`` bytes, of any other at most
        :data:`MAX_ERROR_BODY`; the rest is left unread and the connection closed
        (``Answer.cut``). Callers that need the whole body check ``cut``."""
        url = self.base_url + path
        limit = http_timeout if http_timeout is not None else self.timings.request_timeout
        started = trio.current_time()  # metrics
        answer: Answer | None = None
        failure: BaseException | None = None
        with trio.move_on_after(limit):
            try:
                answer = await self._exchange(method, url, content, params, limit, answer_limit)
            except (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError) as exc:
                failure = exc
        if answer is None:
            if self.metrics is not None:
                self.metrics.controller_request(path, None, trio.current_time() - started)
            if failure is None:
                why = f"no complete answer within {go_duration_seconds(limit)}"
            else:
                why = f"{type(failure).__name__}: {printable(str(failure), limit=300)}"
            raise ControllerError(f"{method} {path}: {why}") from failure
        if self.metrics is not None:
            self.metrics.controller_request(path, answer.status_code, trio.current_time() - started)
        self.tracker.observe(trio.current_time(), answer.headers.get(INSTANCE_HEADER))
        if answer.cut:
            log.debug(
                "%s %s: HTTP %d answer longer than the cap: cut, connection closed",
                method,
                path,
                answer.status_code,
            )
        return answer

    async def _exchange(
        self,
        method: str,
        url: str,
        content: bytes | None,
        params: Mapping[str, str] | None,
        limit: float,
        answer_limit: int,
    ) -> Answer:
        """Send, then read the body up to its cap (leaving the stream closes the connection
        when the body was not read to its end)."""
        async with self._http.stream(
            method, url, content=content, params=params, timeout=limit
        ) as response:
            status = response.status_code
            cap = answer_limit if 200 <= status < 300 else min(answer_limit, MAX_ERROR_BODY)
            if response.is_stream_consumed:  # read in full before it reached us (an
                inflate = None  # in-memory transport, as in tests), and decoded already
                raws: AsyncIterator[bytes] = _aiter_once(response.content)
            else:
                inflate = _inflater(response.headers.get("Content-Encoding", ""))
                raws = response.aiter_raw()
            body = bytearray()
            cut = False
            received = 0
            async for raw in raws:
                received += len(raw)
                if inflate is None:
                    chunks = [raw]
                else:
                    chunks, inflate = _inflate(inflate, raw, cap - len(body))
                for chunk in chunks:
                    room = cap - len(body)
                    if len(chunk) > room:
                        body += chunk[:room]
                        cut = True
                        break
                    body += chunk
                if cut:
                    break
            if inflate is not None and not cut and received and not inflate.eof:
                # (an empty body marked gzip is an empty body, as Go reads it)
                raise httpx.DecodingError("bad gzip body: it ends before the gzip stream does")
            return Answer(status, response.headers, bytes(body), cut)

    async def _attempt(
        self, method: str, path: str, content: bytes | None, limit: float
    ) -> int | None:
        """One bounded, shielded attempt (a shutdown cannot cut it in half, so a retry never
        duplicates a chunk the controller already took). ``None`` = no answer.

        No attempt runs past :attr:`attempt_deadline` (a shutdown's hurry deadline): the
        shield holds off the tree's cancel, not that deadline."""
        remaining = self.attempt_deadline - trio.current_time()
        if remaining <= 0:
            await trio.lowlevel.checkpoint()
            return None
        limit = min(limit, max(remaining - 1.0, remaining / 2))
        with trio.CancelScope(shield=True):
            with trio.move_on_after(min(limit + 1.0, remaining)) as attempt:
                self._attempts.add(attempt)
                try:
                    response = await self.request(method, path, content=content, http_timeout=limit)
                except ControllerError as exc:
                    log.debug("%s", exc)
                    return None
                finally:
                    self._attempts.discard(attempt)
                return response.status_code
        return None

    def cut_attempts_at(self, deadline: float) -> None:
        """From now on, and for the attempts in flight, no report or chunk attempt runs past
        ``deadline`` (``trio.current_time()``): a shutdown's hurry deadline."""
        self.attempt_deadline = min(self.attempt_deadline, deadline)
        for attempt in self._attempts:
            attempt.deadline = min(attempt.deadline, deadline)

    # -- E1 / E2 / E3 / E4 -------------------------------------------------------------------
    async def register(self, registration: Registration) -> str:
        """E1. Returns the worker id; raises :class:`ControllerError` on any non-200."""
        response = await self.request(
            "POST",
            "/v1/workers/register",
            content=encode(self.converter, registration),
            answer_limit=MAX_ANSWER_BYTES,
        )
        if response.status_code != 200:
            raise _http_error("register", response)
        if response.cut:
            raise _too_long("register", response, MAX_ANSWER_BYTES)
        try:
            body = loads_json(response.content, max_depth=ANSWER_MAX_DEPTH, go_text=True)
            worker_id = body["worker_id"]
        except (InputError, KeyError, TypeError) as exc:
            text = printable(str(exc), limit=200)
            raise ControllerError(f"register: undecodable answer: {text}", 200) from None
        if not isinstance(worker_id, str) or not worker_id:
            raise ControllerError("register: empty worker_id", 200)
        problem = id_problem(worker_id)
        if problem is not None:
            raise ControllerError(
                f"register: invalid worker_id {_shown(worker_id)}: {problem}", 200
            )
        return worker_id

    async def push_labels(self, worker_id: str, registration: Registration) -> bool:
        """E2 (labels/sheets refresh): no retry; failures are logged and dropped."""
        body = self.converter.unstructure(registration)
        body.pop("boot_id", None)
        body.pop("recovery", None)
        body["devices"] = [d.name for d in registration.devices]
        response = await self._post_or_warn(f"/v1/workers/{worker_id}/labels", body, "labels push")
        if response is None:
            return False
        if not _ok(response.status_code):
            log.warning("labels push: HTTP %d %s", response.status_code, _body_excerpt(response))
            return False
        return True

    async def heartbeat(self, worker_id: str, running_job_ids: Sequence[str]) -> bool:
        """E3: ``{}`` when idle. The answer is not inspected; failures are logged."""
        body: dict[str, Any] = {}
        if running_job_ids:
            body["running_job_ids"] = list(running_job_ids)
        path = f"/v1/workers/{worker_id}/heartbeat"
        try:
            response = await self.request("POST", path, content=_compact(body))
        except ControllerError as exc:  # an outage: one line a minute, not one a heartbeat
            if (line := self.heartbeats.failed(trio.current_time(), str(exc))) is not None:
                log.warning("%s", line)
            return False
        if (line := self.heartbeats.succeeded(trio.current_time())) is not None:
            log.info("%s", line)
        return _ok(response.status_code)

    async def _post_or_warn(self, path: str, body: object, what: str) -> Answer | None:
        """POST ``body`` as compact JSON; ``None`` when no answer came (logged as ``what``)."""
        try:
            return await self.request("POST", path, content=_compact(body))
        except ControllerError as exc:
            log.warning("%s failed: %s", what, exc)
            return None

    async def poll(self, worker_id: str, wait: float) -> PollAnswer:
        """E4 long poll. 204 ⇒ empty answer; anything else unusable ⇒ :class:`ControllerError`."""
        response = await self.request(
            "GET",
            f"/v1/workers/{worker_id}/assignments",
            params={"wait": go_duration_seconds(wait)},
            http_timeout=self.timings.request_timeout + wait,
            answer_limit=MAX_ANSWER_BYTES,
        )
        if response.status_code == 204:
            return PollAnswer()
        if response.status_code != 200:
            raise _http_error("poll", response)
        if response.cut:
            raise _too_long("poll", response, MAX_ANSWER_BYTES)
        try:
            return decode_answer(self.converter, response.content)
        except WireError as exc:
            raise ControllerError(f"poll: undecodable answer: {exc}", 200) from None

    # -- E5 / E6 / E7 ------------------------------------------------------------------------
    async def report_running(self, job_id: str, worker_id: str) -> bool:
        """E5 ``running``: exactly one attempt, result only logged (§3.5, §17.3)."""
        body = encode(self.converter, StatusReport(worker_id=worker_id, state="running"))
        status = await self._attempt(
            "POST", f"/v1/jobs/{job_id}/status", body, self.timings.report_attempt_timeout
        )
        if not _ok(status):
            log.warning("job %s: running report not accepted (%s)", job_id, status)
        return _ok(status)

    async def report_terminal(self, job_id: str, report: StatusReport) -> bool:
        """E5 terminal report, kept until delivered (see :meth:`deliver`)."""
        reason = report.reason
        if len(reason.encode()) > MAX_REASON_BYTES:
            reason = reason.encode()[:MAX_REASON_BYTES].decode("utf-8", errors="ignore")
            report = attrs.evolve(report, reason=reason)
        body = encode(self.converter, report)
        return await self.deliver(
            f"job {job_id} {report.state} report", "POST", f"/v1/jobs/{job_id}/status", body
        )

    async def send_log_chunk(self, job_id: str, chunk: bytes, *, once: bool = False) -> bool:
        """E6, one chunk (≤ 1 MiB), kept until delivered (see :meth:`deliver`). ``once``, or
        once :meth:`stop_log_retries` was called: one attempt, no retry (the reference's rule)."""
        if len(chunk) > MAX_LOG_CHUNK:
            raise ValueError("log chunk over 1 MiB")
        return await self.deliver(
            f"job {job_id} log chunk ({len(chunk)} B)",
            "POST",
            f"/v1/jobs/{job_id}/logs",
            chunk,
            once=(lambda: True) if once else (lambda: not self.log_retries),
            # a request/response call (§1.2: 2 min), not a report's 5 s: a 1 MiB chunk on a
            # link slower than 200 KB/s could never get through in 5 s
            attempt_timeout=self.timings.request_timeout,
        )

    def stop_log_retries(self) -> None:
        """The shutdown's drain has begun: from now on a log chunk gets one attempt, and a
        chunk being retried stops after its attempt in flight (the reference's rule), so the
        final flushes cannot eat the drain that the verify passes, faults and terminal reports
        need."""
        self.log_retries = False

    async def report_fault(self, device_id: str, reason: str, *, keep: bool = False) -> bool:
        """E7. Only transport errors and 5xx are retried; a 4xx is final at once (§3.7).

        Plain: up to ``fault_attempts`` (the reference's rule). ``keep``: kept and retried
        through an outage under :meth:`deliver`'s give-up rule, like the terminal report that
        follows it: the worker's own faults (a failed verify pass, a failed acquire hook) are
        at least as durable as that report, so an outage cannot deliver the report that frees
        the device while losing the fault that should have quarantined it first."""
        body = json.dumps({"reason": reason}, separators=(",", ":")).encode()
        path = f"/v1/devices/{device_id}/fault"
        status: int | None = None
        limit = self.timings.report_attempt_timeout
        if keep:
            ok = await self.deliver(f"fault report for {device_id}", "POST", path, body, refusals=1)
        else:
            ok = False
            for attempt in range(self.timings.fault_attempts):
                if attempt:
                    await trio.sleep(self._backoff(attempt - 1))
                status = await self._attempt("POST", path, body, limit)
                if _ok(status):
                    ok = True
                    break
                if status is not None and 400 <= status < 500:
                    break
        if ok:
            log.warning("fault reported for %s: %s", device_id, reason)
            return True
        if keep:  # deliver() has logged why
            log.error("fault report for %s NOT delivered: %s", device_id, reason)
        else:
            log.error(
                "fault report for %s NOT delivered (last status %s): %s", device_id, status, reason
            )
        return False

    def _backoff(self, index: int) -> float:
        return Backoff(self.timings.report_backoff).delay(index)

    async def deliver(
        self,
        what: str,
        method: str,
        path: str,
        body: bytes,
        *,
        refusals: int | None = None,
        once: Callable[[], bool] | None = None,
        attempt_timeout: float | None = None,
    ) -> bool:
        """Send until a 2xx, keeping the message through an outage.

        Gives up when: a 4xx came back ``refusals`` times (default ``report_attempts_4xx``: the
        controller refuses it for good), or a 5xx ``report_attempts_5xx`` times; or nothing
        answered for ``patience`` (the controller has written this worker off and declared its
        jobs lost); or the message is older than ``outbox_max_age``; or, with ``once``, after
        any failed attempt made while ``once()`` is true (checked after every attempt: an
        attempt in flight when it turns true is the last). Between attempts it backs off 200,
        400, 800, 1600 ms, … (the last value repeats). Each attempt is bounded by
        ``attempt_timeout`` (default ``report_attempt_timeout``, 5 s).
        """
        t = self.timings
        refusals = t.report_attempts_4xx if refusals is None else refusals
        per_attempt = t.report_attempt_timeout if attempt_timeout is None else attempt_timeout
        first = trio.current_time()
        refused = 0
        errors = 0
        attempt = 0
        silent_in_shutdown = 0
        while True:
            status = await self._attempt(method, path, body, per_attempt)
            if _ok(status):
                if attempt:
                    log.info("%s delivered after %d retries", what, attempt)
                return True
            now = trio.current_time()
            if status is not None and 400 <= status < 500:
                refused += 1
                if refused >= refusals:
                    log.error("%s refused (HTTP %d) %d times: giving up", what, status, refused)
                    return False
            elif status is not None:
                errors += 1
                if errors >= t.report_attempts_5xx:
                    log.error("%s failed (HTTP %d) %d times: giving up", what, status, errors)
                    return False
            silent_in_shutdown = 0 if status is not None else silent_in_shutdown
            if status is None and not self.log_retries:  # shutting down, the controller gone
                silent_in_shutdown += 1
                if silent_in_shutdown >= t.shutdown_report_attempts:
                    log.error(
                        "%s: no answer from the controller to %d tries since the shutdown "
                        "began: giving up (the controller reconciles the job as lost)",
                        what,
                        silent_in_shutdown,
                    )
                    return False
            if status is None:
                last = self.tracker.last_contact
                silent = now - (first if last is None else last)
                if silent >= t.patience:
                    log.error(
                        "%s: no answer from the controller for %.0fs (it has written this "
                        "worker off and declared the job lost): giving up",
                        what,
                        silent,
                    )
                    return False
            if now - first >= t.outbox_max_age:
                log.error("%s: still undelivered after %.0fs: giving up", what, now - first)
                return False
            if once is not None and once():
                log.error("%s not accepted (%s); no retry: giving up", what, status)
                return False
            if attempt == 0:
                log.warning("%s not accepted (%s); keeping it and retrying", what, status)
            await trio.sleep(self._backoff(attempt))
            attempt += 1


# --------------------------------------------------------------------------------------------
# Log batching (§8.1) with a bounded, ordered outbox
# --------------------------------------------------------------------------------------------

SendChunk = Callable[[bytes], Awaitable[bool]]


class LogShipper:
    """The job's output sink: batches, then ships chunks in order through ``send``.

    Flush when the buffer reaches ``flush_bytes`` or ``flush_delay`` after the first unflushed
    byte; every chunk ≤ 1 MiB (output batched while a send is in flight goes out together, as
    the reference's buffer fills during its sends: a 64 KiB cap cut a fast job's upload rate
    about sevenfold). Writes never block on the network: sealed chunks wait in an ordered
    outbox (at most ``limit`` bytes; output beyond it is dropped and counted). ``serve`` is
    the sender task; ``close`` seals the rest and waits until the outbox is empty.

    A chunk that ``send`` gives up on (the controller refused it, or answered 5xx, too many
    times; or was silent past its patience) takes the whole backlog with it: every chunk
    still queued and the unflushed buffer are dropped at once (logged once, with the byte
    count), so a failing log endpoint costs the terminal report at most one chunk's retry
    budget. Until a chunk is accepted again, later output is shipped through ``send_once``
    (one attempt, no retry; ``send`` when not given) and dropped the same way on a failure.
    """

    def __init__(
        self,
        send: SendChunk,
        *,
        send_once: SendChunk | None = None,
        single: Callable[[], bool] | None = None,
        flush_bytes: int = LOG_FLUSH_BYTES,
        flush_delay: float = 1.0,
        limit: int = 16 << 20,
        label: str = "job",
    ) -> None:
        self._send = send
        self._send_once = send_once if send_once is not None else send
        self._single = single if single is not None else (lambda: False)
        """True while every chunk gets one attempt (the shutdown): a failed chunk is then
        dropped alone, as the reference drops it, and the chunks behind it are still tried."""
        self.flush_bytes = max(1, min(flush_bytes, MAX_LOG_CHUNK))
        self.flush_delay = flush_delay
        self.limit = limit
        self.label = label
        self._buf = bytearray()
        self._first_at: float | None = None
        self._outbox: deque[bytes] = deque()
        self._pending = 0
        self._wake = trio.Event()
        self._closing = False
        self._lock = trio.Lock()
        self.dropped = 0
        """Bytes lost because the outbox was full (or the live log skipped them)."""
        self.given_up = 0
        """Bytes of output dropped because a chunk was given up (that chunk included)."""
        self.failing = False
        """A chunk was given up and none accepted since: chunks get one attempt each."""
        self.sent_chunks = 0

    @property
    def pending_bytes(self) -> int:
        return self._pending + len(self._buf)

    async def write(self, data: bytes) -> None:
        self.write_nowait(data)

    def write_nowait(self, data: bytes) -> None:
        """Batch ``data`` (never waits: sending is :meth:`serve`'s job)."""
        if not data:
            return
        room = self.limit - self.pending_bytes
        if room <= 0:
            self.count_dropped(len(data))
            return
        if len(data) > room:
            self.count_dropped(len(data) - room)
            data = data[:room]
        if not self._buf:
            self._first_at = trio.current_time()
            self._poke()
        self._buf += data
        if len(self._buf) >= self.flush_bytes:
            self._seal()

    def count_dropped(self, n: int) -> None:
        """``n`` bytes of output were lost: the outbox was full, or before they reached it."""
        if not self.dropped:
            log.error("%s: log outbox full (%d B kept): dropping output", self.label, self.limit)
        self.dropped += n

    def _poke(self) -> None:
        self._wake.set()

    def _seal(self) -> None:
        """Move the whole buffer into the outbox, in chunks of at most 1 MiB."""
        while self._buf:
            chunk = bytes(self._buf[:MAX_LOG_CHUNK])
            del self._buf[:MAX_LOG_CHUNK]
            self._outbox.append(chunk)
            self._pending += len(chunk)
        self._first_at = None
        self._poke()

    def _give_up(self, chunk: bytes) -> None:
        """``chunk`` was given up: drop the backlog with it (its first byte was popped)."""
        backlog = self._pending + len(self._buf)
        self._outbox.clear()
        self._pending = 0
        self._buf.clear()
        self._first_at = None
        if not self.given_up:
            log.error(
                "%s: a log chunk (%d B) was given up: dropping the %d B of output still "
                "queued behind it, so the terminal report does not wait for them; later "
                "output gets one attempt per chunk until one is accepted",
                self.label,
                len(chunk),
                backlog,
            )
        self.given_up += len(chunk) + backlog
        self.failing = True

    async def _ship_ready(self) -> None:
        async with self._lock:
            while self._outbox:
                chunk = self._outbox[0]
                send = self._send_once if self.failing else self._send
                ok = await send(chunk)
                self._outbox.popleft()
                self._pending -= len(chunk)
                if ok:
                    self.sent_chunks += 1
                    self.failing = False
                elif self._single() and not self.failing:
                    self.given_up += len(chunk)
                    log.warning(
                        "%s: a log chunk (%d B) failed during the shutdown: dropped",
                        self.label,
                        len(chunk),
                    )
                else:
                    self._give_up(chunk)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The sender: one flush at a time, in order. Returns once closed and empty."""
        task_status.started()
        while True:
            if self._outbox:
                await self._ship_ready()
                continue
            if self._closing and not self._buf:
                return
            if self._buf and self._first_at is not None:
                due = self._first_at + self.flush_delay
                if trio.current_time() >= due:
                    self._seal()
                    continue
                self._wake = trio.Event()
                with trio.move_on_at(due):
                    await self._wake.wait()
            else:
                self._wake = trio.Event()
                await self._wake.wait()

    def seal(self) -> None:
        """Stop batching: everything written so far becomes a chunk."""
        self._closing = True
        self._seal()

    async def close(self) -> None:
        """The final flush (§7.3 step 7): seal and ship everything left, in order."""
        self.seal()
        await self._ship_ready()


__all__ = [
    "INSTANCE_HEADER",
    "LOG_FLUSH_BYTES",
    "MAX_ANSWER_BYTES",
    "MAX_ERROR_BODY",
    "MAX_LOG_CHUNK",
    "Answer",
    "Assignment",
    "ContactTracker",
    "ControllerClient",
    "ControllerError",
    "DeviceDecl",
    "LogShipper",
    "PollAnswer",
    "Refused",
    "Registration",
    "StatusReport",
    "Timings",
    "decode_answer",
    "encode",
    "make_converter",
    "register_hooks",
]
