"""A simulated Fleet Dispatcher: the client side of CONTRACT v2 (node.md §1), on Trio.

(Over 500 lines: the simulated dispatcher is one client of CONTRACT v2, its admission, placement
and polling reading one health table.)

It places jobs on ``fleet-trio node`` instances the way the real dispatcher does:

* **health-aware admission**: a node is a candidate for a job when its last good
  ``GET /fleet/health`` lists the job's ``task_type`` in ``supported_task_types`` and its
  ``vram_free_gb`` (on a multi-GPU node, the most free on one of its ``gpu_devices``) covers
  the advertised footprint (``model_footprints``) for the job's ``(model_family,
  task_type)``, plus an optional margin; candidates are tried in order of most free VRAM;
* **the refusal rule**: any answer to ``POST /fleet/dispatch`` other than 202 (or a connection
  error) is a refusal, and the same ``job_id`` goes to the next candidate; when none is left
  the job is ``unplaced``;
* **ownership**: once a node acked (202), the job belongs to that node and is never sent
  elsewhere; ``GET /fleet/jobs/{id}`` is polled until ``done`` or ``error``.

Every health probe, dispatch and poll is recorded as an :class:`Observation`, and every job as
a :class:`DispatchRecord`, so tests (and the chaos checker) can assert on what the dispatcher
saw. ``SimDispatcher`` is a plain state object; :func:`serve_dispatcher` (``disp.serve``) runs
its background loops (health refresh per node, one poller per acked job) in one nursery.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
import httpx
import trio

TERMINAL_RECORD_STATES = frozenset({"done", "error", "unplaced"})
"""Record states after which a :class:`DispatchRecord` never changes again."""
NODE_TERMINAL = frozenset({"done", "error"})
"""Job states (node.md §2.4) that end polling."""
LOST_404 = "lost: 404 from node"


@attrs.frozen
class Observation:
    """One health probe, dispatch or poll, as the dispatcher saw it."""

    at: float
    """``trio.current_time()`` when the answer (or the error) arrived."""
    node: str
    """The node's base URL."""
    kind: str
    """``"health"`` | ``"dispatch"`` | ``"poll"``."""
    status: int | None
    """HTTP status; ``None`` on a connection error or timeout."""
    detail: str
    """Job state, error text, refusal reason, or ``"ok"`` for a good health answer."""
    job_id: str | None = None
    """The job concerned (dispatch and poll); ``None`` for health."""


@attrs.define
class DispatchRecord:
    """The dispatcher's record of one job (mutable, owned by :class:`SimDispatcher`)."""

    job_id: str
    task_type: str
    model_family: str | None
    payload: dict[str, Any]
    node: str | None = None
    """The node that acked (202) the job."""
    state: str = "pending"
    """``pending`` | ``acked`` | ``running`` | ``done`` | ``error`` | ``unplaced``."""
    error: str | None = None
    """The node's error text (``"interrupted"`` …), ``"lost: 404 from node"``, or, when
    unplaced, a summary of why no node took the job."""
    result: Any = None
    """The job's ``data`` once ``done`` (``None`` when the node sent none)."""
    attempts: list[tuple[str, int | None, str]] = attrs.Factory(list)
    """``(node, status, reason)`` for every dispatch try, in order (the 202 included)."""
    states_seen: list[str] = attrs.Factory(list)
    """Job states the polls returned, in order; a state equal to the previous one is not
    repeated (so a regression such as ``running`` → ``accepted`` shows up)."""
    terminal_polls: int = 0
    """How many polls returned ``done`` or ``error``."""
    acked_at: float | None = None
    terminal_at: float | None = None

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_RECORD_STATES


@attrs.define
class _NodeHealth:
    body: dict[str, Any] | None = None
    """Last good health body."""
    ok: bool = False
    """Whether the latest probe succeeded."""
    checked_at: float | None = None
    reason: str = "no health yet"


def _footprint(health: Mapping[str, Any], model_family: str | None, task_type: str) -> float | None:
    """The advertised peak for ``(model_family, task_type)``: the largest matching entry (any
    quant); ``None`` when the node advertises none, or when no ``model_family`` is given."""
    if model_family is None:
        return None
    best: float | None = None
    for entry in health.get("model_footprints") or ():
        if not isinstance(entry, Mapping):
            continue
        if entry.get("model_family") != model_family:
            continue
        if entry.get("task_type", "") not in ("", task_type):
            continue
        peak = entry.get("vram_peak_gb")
        if isinstance(peak, int | float) and (best is None or peak > best):
            best = float(peak)
    return best


def _best_free(health: Mapping[str, Any]) -> float:
    """The VRAM a job can get on the node: the headline ``vram_free_gb``, or on a multi-GPU
    node (``gpu_devices``, where a job runs on one device) the most free on one device."""
    free = float(health["vram_free_gb"])
    devices = health.get("gpu_devices")
    if isinstance(devices, list):
        per_device = [
            float(d["vram_free_gb"])
            for d in devices
            if isinstance(d, Mapping)
            and isinstance(d.get("vram_free_gb"), int | float)
            and not isinstance(d.get("vram_free_gb"), bool)
        ]
        if per_device:
            free = max(per_device)
    return free


def _health_problem(body: Any) -> str | None:
    """Why a 200 health body is unusable (``vram_total_gb <= 0`` is a failed probe)."""
    if not isinstance(body, dict):
        return "health body is not an object"
    total = body.get("vram_total_gb")
    if not isinstance(total, int | float) or total <= 0:
        return f"vram_total_gb {total!r} <= 0"
    if not isinstance(body.get("vram_free_gb"), int | float):
        return "vram_free_gb missing"
    if not isinstance(body.get("supported_task_types"), list):
        return "supported_task_types missing"
    return None


def _error_text(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text.strip()[:200]
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        return str(body["error"])
    return json.dumps(body)[:200]


def _conn_error(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class SimDispatcher:
    """A fleet dispatcher over a list of node base URLs (see the module docstring).

    ``health_interval``: seconds between health probes of each node while :meth:`serve` runs;
    ``poll_interval``: seconds between polls of each acked job; ``request_timeout``: the bound
    on every request (the whole exchange). ``vram_margin_gb`` is added to a footprint at
    admission (CONTRACT v2 leaves the margin to the dispatcher; default 0). ``lost_after``: a
    job whose polls get only 404s for that long ends ``error`` / ``"lost: 404 from node"``
    (the node restarted and forgot it). ``terminal_confirmations``: polls returning a terminal
    state before polling stops (default 1; more lets a test see that the terminal state does
    not change; the record keeps the first terminal state either way).
    """

    def __init__(
        self,
        nodes: Sequence[str] = (),
        *,
        token: str | None = None,
        health_interval: float = 0.5,
        poll_interval: float = 0.2,
        request_timeout: float = 5.0,
        vram_margin_gb: float = 0.0,
        lost_after: float = 5.0,
        terminal_confirmations: int = 1,
    ) -> None:
        if isinstance(nodes, str):
            raise TypeError("nodes must be a sequence of base URLs, not one string")
        self.token = token
        self.health_interval = health_interval
        self.poll_interval = poll_interval
        self.request_timeout = request_timeout
        self.vram_margin_gb = vram_margin_gb
        self.lost_after = lost_after
        self.terminal_confirmations = max(1, terminal_confirmations)
        self._nodes: list[str] = []
        self._health: dict[str, _NodeHealth] = {}
        self._records: dict[str, DispatchRecord] = {}
        self._observations: list[Observation] = []
        self._terminal_events: dict[str, trio.Event] = {}
        self._changed = trio.Event()
        self._client: httpx.AsyncClient | None = None
        self._nursery: trio.Nursery | None = None
        self._polling: set[str] = set()
        for url in nodes:
            self.add_node(url)

    # ------------------------------------------------------------------ nodes

    @property
    def nodes(self) -> list[str]:
        return list(self._nodes)

    def add_node(self, url: str) -> None:
        """Add a node (its base URL); while serving, its health loop starts at once."""
        url = url.rstrip("/")
        if url in self._nodes:
            return
        self._nodes.append(url)
        self._health[url] = _NodeHealth()
        if self._nursery is not None:
            self._start_health_loop(url)

    def health(self, url: str) -> dict[str, Any] | None:
        """The last good health body seen from ``url`` (``None`` if none yet)."""
        state = self._health.get(url.rstrip("/"))
        return None if state is None or state.body is None else dict(state.body)

    def healthy(self, url: str) -> bool:
        """Whether the latest health probe of ``url`` succeeded."""
        state = self._health.get(url.rstrip("/"))
        return state is not None and state.ok

    # ------------------------------------------------------------------ read back

    def record(self, job_id: str) -> DispatchRecord:
        try:
            return self._records[job_id]
        except KeyError:
            raise KeyError(f"unknown job {job_id!r}") from None

    def find(self, job_id: str) -> DispatchRecord | None:
        """The record of ``job_id``; ``None`` before its submit began."""
        return self._records.get(job_id)

    def records(self) -> list[DispatchRecord]:
        return list(self._records.values())

    def observations(self, node: str | None = None) -> list[Observation]:
        if node is None:
            return list(self._observations)
        node = node.rstrip("/")
        return [o for o in self._observations if o.node == node]

    async def wait_for(
        self,
        predicate: Any,
        *,
        timeout: float = 10.0,  # noqa: ASYNC109 -- the documented test API
    ) -> Any:
        """Re-check ``predicate()`` after every observation; return its truthy value or raise
        ``trio.TooSlowError``."""
        with trio.fail_after(timeout):
            while True:
                value = predicate()
                if value:
                    return value
                await self._changed.wait()

    # ------------------------------------------------------------------ HTTP

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    def _new_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            headers=self._headers(),
            timeout=httpx.Timeout(self.request_timeout),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
            trust_env=False,
        )

    def _observe(
        self, node: str, kind: str, status: int | None, detail: str, job_id: str | None = None
    ) -> None:
        self._observations.append(
            Observation(trio.current_time(), node, kind, status, detail, job_id)
        )
        self._changed.set()
        self._changed = trio.Event()

    async def _request(
        self,
        client: httpx.AsyncClient,
        method: str,
        url: str,
        body: bytes | None = None,
        *,
        observe: tuple[str, str, str | None] | None = None,
    ) -> httpx.Response | str:
        """One exchange bounded by ``request_timeout``; a string is the connection error.

        A GET that fails on a broken connection (reset, closed, refused; not a timeout) is
        retried once at once (a pooled keep-alive connection cut under the request gets a new
        one, as HTTP clients do); the first failure is observed as ``(node, kind, job_id)`` of
        ``observe`` with ``"(retried)"`` appended to its detail.
        """
        for attempt in (1, 2):
            try:
                with trio.fail_after(self.request_timeout):
                    return await client.request(method, url, content=body)
            except trio.TooSlowError:
                return f"timeout after {self.request_timeout:g}s"
            except httpx.TimeoutException as exc:
                return _conn_error(exc)
            except (httpx.HTTPError, httpx.InvalidURL, OSError) as exc:
                if method != "GET" or attempt == 2 or isinstance(exc, httpx.InvalidURL):
                    return _conn_error(exc)
                if observe is not None:
                    node, kind, job_id = observe
                    self._observe(node, kind, None, f"{_conn_error(exc)} (retried)", job_id)
        raise AssertionError("unreachable")

    async def _probe(self, client: httpx.AsyncClient, url: str) -> None:
        state = self._health[url]
        resp = await self._request(
            client, "GET", f"{url}/fleet/health", observe=(url, "health", None)
        )
        state.checked_at = trio.current_time()
        status = None if isinstance(resp, str) else resp.status_code
        body = None
        if isinstance(resp, str):
            detail = state.reason = resp
        elif status != 200:
            detail = _error_text(resp)
            state.reason = f"{status} {detail}"
        else:
            with contextlib.suppress(ValueError):
                body = resp.json()
            detail = state.reason = _health_problem(body) or "ok"
        state.ok = status == 200 and detail == "ok"
        if state.ok:
            state.body = body
        self._observe(url, "health", status, detail)

    # ------------------------------------------------------------------ submit

    def _admission(self, task_type: str, model_family: str | None) -> tuple[list[str], list[str]]:
        """(candidates ordered by most free VRAM, reasons the others were skipped)."""
        scored: list[tuple[float, int, str]] = []
        skipped: list[str] = []
        for index, url in enumerate(self._nodes):
            state = self._health[url]
            if not state.ok or state.body is None:
                skipped.append(f"{url} (no health: {state.reason})")
                continue
            body = state.body
            if task_type not in body["supported_task_types"]:
                skipped.append(f"{url} (task_type {task_type!r} not supported)")
                continue
            free = _best_free(body)
            need = _footprint(body, model_family, task_type)
            if need is not None and free < need + self.vram_margin_gb:
                skipped.append(
                    f"{url} (needs {need + self.vram_margin_gb:g} GiB, {free:g} GiB free)"
                )
                continue
            scored.append((-free, index, url))
        scored.sort()
        return [url for _, _, url in scored], skipped

    def _stale(self, url: str) -> bool:
        state = self._health[url]
        if state.checked_at is None:
            return True
        if self._nursery is not None:
            return False  # the health loops keep it fresh
        return trio.current_time() - state.checked_at >= self.health_interval

    async def submit(
        self,
        task_type: str,
        *,
        model_family: str | None = None,
        payload: Mapping[str, Any] | None = None,
        job_id: str | None = None,
    ) -> DispatchRecord:
        """Place one job and return its record as soon as a node acked it (or none did).

        Health is fetched on demand for nodes never probed (and, when :meth:`serve` is not
        running, for nodes whose last probe is older than ``health_interval``). A ``job_id``
        already known raises ``ValueError``, except for an ``unplaced`` record, which is tried
        again (its attempts accumulate).
        """
        job_id = job_id if job_id is not None else uuid.uuid4().hex
        rec = self._records.get(job_id)
        if rec is not None and rec.state != "unplaced":
            raise ValueError(f"job_id {job_id!r} already submitted (state {rec.state})")
        if rec is None:
            rec = DispatchRecord(
                job_id=job_id,
                task_type=task_type,
                model_family=model_family,
                payload=dict(payload) if payload is not None else {},
            )
            self._records[job_id] = rec
        else:
            rec.state, rec.error = "pending", None
        envelope: dict[str, Any] = {
            "job_id": job_id,
            "task_type": task_type,
            "payload": rec.payload,
        }
        if model_family is not None:
            envelope["model_family"] = model_family
        body = json.dumps(envelope).encode()
        if self._client is not None:
            await self._place(self._client, rec, body)
        else:
            async with self._new_client() as client:
                await self._place(client, rec, body)
        self._changed.set()
        self._changed = trio.Event()
        return rec

    async def _place(self, client: httpx.AsyncClient, rec: DispatchRecord, body: bytes) -> None:
        stale = [url for url in self._nodes if self._stale(url)]
        if stale:
            async with trio.open_nursery() as nursery:
                for url in stale:
                    nursery.start_soon(self._probe, client, url)
        candidates, skipped = self._admission(rec.task_type, rec.model_family)
        refused: list[str] = []
        for url in candidates:
            resp = await self._request(client, "POST", f"{url}/fleet/dispatch", body)
            status = None if isinstance(resp, str) else resp.status_code
            if status != 202:
                reason = resp if isinstance(resp, str) else _error_text(resp)
                rec.attempts.append((url, status, reason))
                refused.append(f"{url} ({reason if status is None else f'{status} {reason}'})")
                self._observe(url, "dispatch", status, reason, rec.job_id)
                continue
            rec.attempts.append((url, 202, "accepted"))
            self._observe(url, "dispatch", 202, "accepted", rec.job_id)
            rec.node, rec.state, rec.acked_at = url, "acked", trio.current_time()
            self._start_poller(rec.job_id)
            return
        parts = []
        if refused:
            parts.append("refused by " + "; ".join(refused))
        if skipped:
            parts.append("skipped " + "; ".join(skipped))
        if not self._nodes:
            parts.append("no nodes")
        rec.state = "unplaced"
        rec.error = "unplaced: " + ", ".join(parts)
        rec.terminal_at = trio.current_time()
        self._terminal_event(rec.job_id).set()

    # ------------------------------------------------------------------ polling

    def _terminal_event(self, job_id: str) -> trio.Event:
        return self._terminal_events.setdefault(job_id, trio.Event())

    def _finish(self, rec: DispatchRecord, state: str, error: str | None, result: Any) -> None:
        if rec.terminal:
            return  # write-once, as on the node
        rec.state, rec.error, rec.result = state, error, result
        rec.terminal_at = trio.current_time()
        self._terminal_event(rec.job_id).set()

    async def _poll_once(self, client: httpx.AsyncClient, rec: DispatchRecord) -> int | None:
        """One poll of ``rec``'s job; returns the HTTP status (``None``: connection error)."""
        assert rec.node is not None
        resp = await self._request(
            client,
            "GET",
            f"{rec.node}/fleet/jobs/{rec.job_id}",
            observe=(rec.node, "poll", rec.job_id),
        )
        if isinstance(resp, str) or resp.status_code != 200:
            status = None if isinstance(resp, str) else resp.status_code
            detail = resp if isinstance(resp, str) else _error_text(resp)
            self._observe(rec.node, "poll", status, detail, rec.job_id)
            return status
        try:
            body = resp.json()
        except ValueError:
            body = None
        state = body.get("state") if isinstance(body, dict) else None
        if not isinstance(body, dict) or not isinstance(state, str):
            detail = f"malformed job body: {resp.text[:200]}"
            self._observe(rec.node, "poll", 200, detail, rec.job_id)
            return 200
        self._observe(rec.node, "poll", 200, state, rec.job_id)
        if not rec.states_seen or rec.states_seen[-1] != state:
            rec.states_seen.append(state)
        if state in NODE_TERMINAL:
            rec.terminal_polls += 1
            if state == "done":
                self._finish(rec, "done", None, body.get("data"))
            else:
                self._finish(rec, "error", str(body.get("error") or "deferred"), None)
        elif state == "running" and rec.state == "acked":
            rec.state = "running"
        return 200

    async def _poll_job(self, job_id: str, client: httpx.AsyncClient | None = None) -> None:
        """Poll one acked job until terminal, through connection errors and 5xx answers.

        A run of 404s lasting ``lost_after`` ends the record ``error`` / ``LOST_404``; nothing
        else invents a terminal state.
        """
        rec = self._records[job_id]
        first_404: float | None = None
        try:
            while True:
                use = client if client is not None else self._client
                if use is None:
                    return
                status = await self._poll_once(use, rec)
                if status == 404:
                    if rec.terminal:
                        return  # already terminal (confirmation polls): the node forgot it
                    now = trio.current_time()
                    first_404 = now if first_404 is None else first_404
                    if now - first_404 >= self.lost_after:
                        self._finish(rec, "error", LOST_404, None)
                        return
                elif status == 200:
                    first_404 = None
                if rec.terminal and rec.terminal_polls >= self.terminal_confirmations:
                    return
                await trio.sleep(self.poll_interval)
        finally:
            self._polling.discard(job_id)

    def _start_poller(self, job_id: str) -> None:
        if self._nursery is None or job_id in self._polling:
            return
        self._polling.add(job_id)
        self._nursery.start_soon(self._poll_job, job_id, name=f"poll {job_id}")

    async def wait(
        self,
        job_id: str,
        *,
        timeout: float = 60.0,  # noqa: ASYNC109 -- the documented test API
    ) -> DispatchRecord:
        """Wait until the record is terminal (``done`` | ``error`` | ``unplaced``).

        Raises ``trio.TooSlowError`` after ``timeout``. Without :meth:`serve` running, polls
        the job itself with a short-lived client.
        """
        rec = self.record(job_id)
        with trio.fail_after(timeout):
            if rec.terminal:
                return rec
            if self._nursery is None and rec.node is not None:
                async with self._new_client() as client, trio.open_nursery() as nursery:
                    if job_id not in self._polling:
                        self._polling.add(job_id)
                        nursery.start_soon(self._poll_job, job_id, client)
                    await self._terminal_event(job_id).wait()
                    nursery.cancel_scope.cancel()
            else:
                await self._terminal_event(job_id).wait()
        return rec

    # ------------------------------------------------------------------ serving

    async def _health_loop(self, url: str, first_done: bool) -> None:
        client = self._client
        assert client is not None
        if first_done:
            await trio.sleep(self.health_interval)
        while True:
            await self._probe(client, url)
            await trio.sleep(self.health_interval)

    def _start_health_loop(self, url: str, first_done: bool = False) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(self._health_loop, url, first_done, name=f"health {url}")

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the health loops and the pollers until cancelled; ``started`` once the first
        health round (every node probed once) is over."""
        if self._nursery is not None:
            raise RuntimeError("this SimDispatcher is already serving")
        try:
            async with self._new_client() as client:
                self._client = client
                async with trio.open_nursery() as nursery:
                    first = list(self._nodes)
                    async with trio.open_nursery() as round_:
                        for url in first:
                            round_.start_soon(self._probe, client, url)
                    self._nursery = nursery
                    for url in list(self._nodes):
                        self._start_health_loop(url, first_done=url in first)
                    for rec in self._records.values():
                        if rec.node is not None and not rec.terminal:
                            self._start_poller(rec.job_id)
                    task_status.started()
                    await trio.sleep_forever()
        finally:
            self._nursery = None
            self._client = None
            self._polling.clear()


async def serve_dispatcher(
    disp: SimDispatcher, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """``disp.serve``: run the dispatcher's loops until cancelled (``nursery.start`` it)."""
    await disp.serve(task_status=task_status)


def terminal_states(records: Iterable[DispatchRecord]) -> dict[str, str]:
    """``{job_id: state}`` for the terminal records (a convenience for checkers)."""
    return {r.job_id: r.state for r in records if r.terminal}


__all__ = [
    "LOST_404",
    "DispatchRecord",
    "Observation",
    "SimDispatcher",
    "serve_dispatcher",
    "terminal_states",
]
