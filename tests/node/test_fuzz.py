"""Hypothesis fuzz of the routes through the ASGI app (no sockets, no processes): never a 5xx
(but 503 "node draining" while draining), never a crash, never a traceback in the log, never a
second run of a job id, nothing registered on a refused request; hostile shapes included (deep
nesting, huge and non-finite numbers, control characters, lone surrogates, wrong types, foreign
origins). And the tail's query parser and server loop with the same shapes."""

from __future__ import annotations

import json
import logging
from collections import Counter
from typing import Any
from urllib.parse import quote

import httpx
import trio
import trio.lowlevel
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet_trio.edge import EdgePolicy, EdgeRequest, own_origin, parse_origin, refusal
from fleet_trio.inputs import InputError, id_problem, loads_json
from fleet_trio.logbus.bus import LogBus
from fleet_trio.logbus.tail import (
    ALL_STREAMS,
    CLOSE_BAD_REQUEST,
    CLOSE_NORMAL,
    CLOSE_UNKNOWN_JOB,
    TailProtocolError,
    parse_query,
    serve_tail,
)
from fleet_trio.node.app import NodeContext, create_app
from fleet_trio.node.config import config_from_mapping
from fleet_trio.node.jobs import Done, Failed, JobStore, Outcome
from fleet_trio.node.tasks import PreparedJob, TaskRegistry
from tests.node.harness import FakeSampler

SPEC_ID = "a3f9-XYZ_0123456789abcdef.fleet~job"
IDS = st.sampled_from(
    ["a", "b", "a/b", "ü", "", " ", "%2F", "x" * 300, SPEC_ID, "a\x00b", "a\nb", "-x", "a\x1b"]
)
HOSTILE_TEXT = st.text(
    alphabet=st.sampled_from(
        ["a", "\x00", "\n", "\r", "\x1b", "\x85", "\u202e", "\ud800", "\udc00", "\\", '"', "ü"]
    ),
    max_size=6,
)
JSONISH = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=5)
    | HOSTILE_TEXT,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
ENVELOPE = st.fixed_dictionaries(
    {},
    optional={
        "job_id": IDS | JSONISH | HOSTILE_TEXT,
        "task_type": st.sampled_from(["t", "g", "llm", ""]) | JSONISH | HOSTILE_TEXT,
        "payload": JSONISH | st.fixed_dictionaries({"graph": JSONISH}),
        "priority": JSONISH,
        "bogus": JSONISH,
    },
)
# Raw JSON fragments json.dumps will not write: deep nesting, non-finite and huge numbers.
DEPTHS = st.sampled_from([1, 2, 62, 63, 64, 65, 200, 999, 1000, 3000]) | st.integers(1, 3000)
HOSTILE_VALUE = st.one_of(
    DEPTHS.map(lambda n: "[" * n + "]" * n),
    DEPTHS.map(lambda n: '{"a":' * n + "0" + "}" * n),
    DEPTHS.map(lambda n: "[" * n),  # unterminated
    st.sampled_from(["1e400", "-1e400", "NaN", "Infinity", "-Infinity", "1" * 5000, "1e-400"]),
    st.sampled_from(['"\\ud800"', '"\\udfff\\ud800"', '"\\u0000"', '"\\ud83d\\ude00"']),
)


def splice(envelope: dict[str, Any], member: str, raw: str) -> bytes:
    """``envelope`` as JSON with ``member`` set to the raw JSON text ``raw``."""
    fields = [f"{json.dumps(k)}:{json.dumps(v)}" for k, v in envelope.items() if k != member]
    fields.append(f"{json.dumps(member)}:{raw}")
    return ("{" + ",".join(fields) + "}").encode()


BODY = st.one_of(
    ENVELOPE.map(lambda d: json.dumps(d).encode()),
    st.builds(
        splice,
        ENVELOPE,
        st.sampled_from(["payload", "job_id", "task_type", "priority", "width"]),
        HOSTILE_VALUE,
    ),
    HOSTILE_VALUE.map(str.encode),
    st.binary(max_size=40),
    st.sampled_from([b"", b"null", b"[]", b"{", b'{"job_id":"a"} x', b"\xff\xfe"]),
)
CONTENT_TYPES = st.sampled_from(
    [None, "", "application/json", "text/plain", "application/json; charset=utf-8", ";;", "a/b/c"]
)
REQUEST = st.one_of(
    st.tuples(st.just("POST"), st.just("/fleet/dispatch"), BODY, CONTENT_TYPES),
    st.tuples(
        st.just("GET"),
        (IDS | HOSTILE_TEXT).map(lambda i: "/fleet/jobs/" + quote(i, errors="surrogatepass")),
        st.just(b""),
        st.none(),
    ),
    st.tuples(
        st.sampled_from(["GET", "HEAD", "POST", "PUT"]),
        st.sampled_from(["/fleet/health", "/fleet/dispatch", "/fleet/jobs/", "/x"]),
        st.just(b""),
        st.none(),
    ),
)


class CountingRunner:
    def __init__(self) -> None:
        self.runs: Counter[str] = Counter()

    async def execute(self, job: PreparedJob) -> Outcome:
        self.runs[job.job_id] += 1
        job.cleanup()
        await trio.lowlevel.checkpoint()
        return Done(b"{}") if len(job.job_id) % 2 else Failed("")

    def reserve(self, job: PreparedJob) -> None:
        """No GPU placement here."""

    def discard(self, job: PreparedJob) -> None:
        job.cleanup()


def make_ctx(tmp: str, spawn: Any) -> tuple[NodeContext, CountingRunner]:
    cfg = config_from_mapping(
        {
            "tasks": {
                "t": {"command": ["true"], "payload": {"n": {"type": "integer"}}},
                "g": {
                    "command": ["true"],
                    "materialize": {"graph": "g.json"},
                    "payload": {"graph": {"type": "object", "required": True}},
                },
            }
        }
    )
    runner = CountingRunner()
    store = JobStore(spawn=spawn)
    sampler = FakeSampler()
    sampler.publish(16, 1)
    ctx = NodeContext(
        node_id="n",
        gpu_arch="nvidia",
        registry=TaskRegistry(cfg.tasks, work_root=tmp),
        store=store,
        runner=runner,
        sampler=sampler,  # type: ignore[arg-type]
    )
    return ctx, runner


ORIGINS = st.sampled_from(
    [None, None, None, "http://127.0.0.1:18811", "http://evil.example", "null", "http://x\x85"]
)


def registered_id(body: bytes) -> str | None:
    """The job id a dispatch body names, if it decodes at all (else nothing to look up)."""
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None
    job_id = value.get("job_id") if isinstance(value, dict) else None
    return job_id if isinstance(job_id, str) else None


def must_refuse(body: bytes) -> bool:
    """An independent oracle: a body the edge rules refuse (too deep, a non-finite number, not
    JSON, a job id or task type outside the id set, a lone surrogate) is never acked."""
    try:
        value = loads_json(body)
        json.dumps(value, ensure_ascii=False).encode("utf-8")  # a lone surrogate fails here
    except (InputError, UnicodeEncodeError):
        return True
    if not isinstance(value, dict):
        return True
    return any(
        isinstance(value.get(k), str) and value[k] and id_problem(value[k]) is not None
        for k in ("job_id", "task_type")
    )


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    requests=st.lists(st.tuples(REQUEST, ORIGINS), min_size=1, max_size=8),
    drain_at=st.integers(0, 8),
)
async def test_fuzz_routes_never_5xx(
    tmp_path_factory: Any, caplog: Any, requests: list[Any], drain_at: int
) -> None:
    caplog.clear()
    caplog.set_level(logging.INFO)
    tmp = str(tmp_path_factory.mktemp("fuzz"))
    accepted: set[str] = set()
    async with trio.open_nursery() as nursery:

        def spawn(fn: Any, *args: Any, name: str) -> None:
            nursery.start_soon(fn, *args, name=name)

        ctx, runner = make_ctx(tmp, spawn)
        sampler = ctx.sampler
        assert isinstance(sampler, FakeSampler)
        transport = httpx.ASGITransport(app=create_app(ctx))
        base = "http://127.0.0.1:18811"
        async with httpx.AsyncClient(transport=transport, base_url=base) as client:
            for i, ((method, path, body, ctype), origin) in enumerate(requests):
                if i == drain_at:
                    ctx.store.begin_drain()
                sampler.publish(16, 1)
                headers: dict[str, Any] = {} if ctype is None else {"Content-Type": ctype}
                if origin is not None:
                    headers["Origin"] = origin.encode("latin-1")
                r = await client.request(method, path, content=body, headers=headers)
                # The only 5xx the contract has: 503 "node draining" once draining began.
                draining_503 = r.status_code == 503 and i >= drain_at
                assert r.status_code < 500 or draining_503, (method, path, body, r.text)
                if r.status_code == 503 and method != "HEAD":
                    assert r.json()["error"] == "node draining"
                if origin not in (None, base):
                    assert r.status_code == 403, (origin, r.status_code)
                if method != "HEAD":
                    parsed = r.json()
                    if r.status_code >= 400:
                        assert set(parsed) == {"status", "error"} and parsed["status"] == "error"
                if method == "POST" and path == "/fleet/dispatch":
                    job_id = registered_id(body)
                    if r.status_code == 202:
                        assert job_id is not None
                        assert not must_refuse(body), body[:200]
                        accepted.add(job_id)
                    elif job_id is not None and job_id not in accepted:
                        # a refused request registers nothing
                        assert ctx.store.get(job_id) is None, (job_id, r.status_code, r.text)
                await trio.testing.wait_all_tasks_blocked()
    assert all(n == 1 for n in runner.runs.values()), runner.runs
    for record in caplog.records:  # no traceback, no internal error
        assert record.exc_info is None and record.levelno < logging.ERROR, record.getMessage()


# -- the tail's query and its server loop --------------------------------------------------------

QUERY_VALUES = st.one_of(
    HOSTILE_TEXT,
    st.text(max_size=30),
    st.sampled_from(["start", "now", "0", "5", "²", "1e3", "-1", "9" * 30, "9" * 5000, "stdout"]),
    st.sampled_from(["stdout,stderr", "stderr", ",", "stdout,stdout", "STDOUT , x"]),
)
QUERY = st.dictionaries(st.sampled_from(["from", "streams", "token", "x"]), QUERY_VALUES)


@settings(max_examples=200, deadline=None)
@given(query=QUERY)
def test_fuzz_tail_query(query: dict[str, str]) -> None:
    try:
        q = parse_query(query)
    except TailProtocolError as exc:
        message = str(exc)
        assert len(message) < 300 and message.isprintable(), message
    else:
        assert q.streams and q.streams <= ALL_STREAMS
        assert q.start in ("start", "now") or (isinstance(q.start, int) and q.start >= 0)


@settings(max_examples=60, deadline=None)
@given(job_id=IDS | HOSTILE_TEXT, query=QUERY)
async def test_fuzz_tail_server_loop(job_id: str, query: dict[str, str]) -> None:
    bus = LogBus()
    log = bus.open("a")
    await log.write("stdout", b"x\n")
    log.end("done", 0)
    sent: list[dict[str, Any]] = []

    async def send_text(text: str) -> None:
        text.encode("utf-8")  # a frame the server can really send
        sent.append(json.loads(text))

    with trio.fail_after(5):
        code = await serve_tail(bus, job_id, send_text, query)
    assert code in (CLOSE_NORMAL, CLOSE_BAD_REQUEST, CLOSE_UNKNOWN_JOB)
    assert sent and sent[-1]["type"] in ("end", "error")


# -- the edge rules with hostile headers ---------------------------------------------------------

HEADER_TEXT = st.one_of(
    st.none(),
    HOSTILE_TEXT,
    st.text(max_size=40),
    st.sampled_from(
        ["http://127.0.0.1:18811", "127.0.0.1:18811", "[::1", "a:b:c", "http://[::1]:99999", ""]
    ),
)


@settings(max_examples=300, deadline=None)
@given(
    host=HEADER_TEXT,
    origin=HEADER_TEXT,
    site=HEADER_TEXT,
    mode=HEADER_TEXT,
    loopback=st.booleans(),
    websocket=st.booleans(),
)
def test_fuzz_edge_rules(
    host: str | None,
    origin: str | None,
    site: str | None,
    mode: str | None,
    loopback: bool,
    websocket: bool,
) -> None:
    req = EdgeRequest(
        method="POST",
        host=host,
        origin=origin,
        sec_fetch_site=site,
        sec_fetch_mode=mode,
        websocket=websocket,
    )
    refused = refusal(req, EdgePolicy(loopback=loopback))
    if refused is not None:
        _reason, message = refused
        assert message.startswith("forbidden") and message.isprintable()
    elif origin is not None:
        # let through with an Origin: only the server's own (no list here)
        assert parse_origin(origin) == own_origin("http", host)
    if origin is not None and parse_origin(origin) is None:
        assert refused is not None  # "null", garbage: never accepted
