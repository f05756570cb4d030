"""Hypothesis fuzz of the three routes through the ASGI app (no sockets, no processes):
never a 5xx (but 503 "node draining" while draining), never a crash, never a second run of
a job id."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import httpx
import trio
import trio.lowlevel
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet_trio.node.app import NodeContext, create_app
from fleet_trio.node.config import config_from_mapping
from fleet_trio.node.jobs import Done, Failed, JobStore, Outcome
from fleet_trio.node.tasks import PreparedJob, TaskRegistry
from tests.node.harness import FakeSampler

IDS = st.sampled_from(["a", "b", "a/b", "ü", "", " ", "%2F", "x" * 300])
JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
ENVELOPE = st.fixed_dictionaries(
    {},
    optional={
        "job_id": IDS | JSONISH,
        "task_type": st.sampled_from(["t", "g", "llm", ""]) | JSONISH,
        "payload": JSONISH | st.fixed_dictionaries({"graph": JSONISH}),
        "priority": JSONISH,
        "bogus": JSONISH,
    },
)
BODY = st.one_of(
    ENVELOPE.map(lambda d: json.dumps(d).encode()),
    st.binary(max_size=40),
    st.sampled_from([b"", b"null", b"[]", b"{", b'{"job_id":"a"} x', b"\xff\xfe"]),
)
CONTENT_TYPES = st.sampled_from(
    [None, "", "application/json", "text/plain", "application/json; charset=utf-8", ";;", "a/b/c"]
)
REQUEST = st.one_of(
    st.tuples(st.just("POST"), st.just("/fleet/dispatch"), BODY, CONTENT_TYPES),
    st.tuples(st.just("GET"), IDS.map(lambda i: f"/fleet/jobs/{i}"), st.just(b""), st.none()),
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


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(requests=st.lists(REQUEST, min_size=1, max_size=8), drain_at=st.integers(0, 8))
async def test_fuzz_routes_never_5xx(
    tmp_path_factory: Any, requests: list[Any], drain_at: int
) -> None:
    tmp = str(tmp_path_factory.mktemp("fuzz"))
    async with trio.open_nursery() as nursery:

        def spawn(fn: Any, *args: Any, name: str) -> None:
            nursery.start_soon(fn, *args, name=name)

        ctx, runner = make_ctx(tmp, spawn)
        sampler = ctx.sampler
        assert isinstance(sampler, FakeSampler)
        transport = httpx.ASGITransport(app=create_app(ctx))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:18811") as client:
            for i, (method, path, body, ctype) in enumerate(requests):
                if i == drain_at:
                    ctx.store.begin_drain()
                sampler.publish(16, 1)
                headers = {} if ctype is None else {"Content-Type": ctype}
                r = await client.request(method, path, content=body, headers=headers)
                # The only 5xx the contract has: 503 "node draining" once draining began.
                draining_503 = r.status_code == 503 and i >= drain_at
                assert r.status_code < 500 or draining_503, (method, path, body, r.text)
                if r.status_code == 503 and method != "HEAD":
                    assert r.json()["error"] == "node draining"
                if method != "HEAD":
                    parsed = r.json()
                    if r.status_code >= 400:
                        assert set(parsed) == {"status", "error"} and parsed["status"] == "error"
                await trio.testing.wait_all_tasks_blocked()
    assert all(n == 1 for n in runner.runs.values()), runner.runs
