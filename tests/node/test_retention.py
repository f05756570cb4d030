"""The memory budget wired in (issue 14, item 5): the node's kept results and the log bus's
histories share one ceiling; the oldest ended go first, a running job's output never; an
evicted result polls as a clear error; evictions show in the metrics."""

from __future__ import annotations

import sys
from pathlib import Path

import trio

from fleet_trio.logbus import End, LogBus, Output, Skipped
from fleet_trio.memory import MemoryBudget
from fleet_trio.node.jobs import Done, Failed, JobState, JobTable
from fleet_trio.node.metrics import NodeMetrics
from fleet_trio.node.retention import EVICTED_PREFIX, attach_result_budget
from tests.helpers import wait_until
from tests.node.harness import node_config, running_node

MB = 1 << 20


def table(budget: MemoryBudget) -> JobTable:
    t = JobTable(ttl=3600)
    attach_result_budget(t, budget)
    return t


def finish(t: JobTable, job_id: str, nbytes: int, now: float = 1.0) -> None:
    t.register(job_id)
    t.start(job_id)
    t.finish(job_id, Done(b"1" * nbytes), now)


def test_results_oldest_first_and_an_evicted_one_polls_as_a_clear_error() -> None:
    budget = MemoryBudget(40 * MB)
    t = table(budget)
    for i in range(5):
        finish(t, f"j{i}", 15 * MB)
    assert budget.total <= budget.limit
    evicted = [f"j{i}" for i in range(5) if t.get(f"j{i}").state is JobState.ERROR]  # type: ignore[union-attr]
    assert evicted == ["j0", "j1", "j2"]  # oldest ended first
    view = t.get("j0")
    assert view is not None and view.data is None and view.error is not None
    assert view.error.startswith(f"{EVICTED_PREFIX}: the job succeeded, but its 15728640-byte")
    assert "40MiB" in view.error
    kept = t.get("j4")
    assert kept is not None and kept.state is JobState.DONE and kept.data == b"1" * 15 * MB
    assert budget.evicted.entries["result"] == 3
    # the TTL sweep releases what it removes
    t.sweep(now=10_000.0)
    assert budget.total == 0 and len(t) == 0


def test_errors_and_empty_results_cost_nothing() -> None:
    budget = MemoryBudget(MB)
    t = table(budget)
    t.register("e")
    t.finish("e", Failed("boom"), 1.0)
    finish(t, "empty", 0)
    assert budget.total == 0
    assert t.get("e").error == "boom"  # type: ignore[union-attr]


async def test_a_running_log_is_never_evicted_an_ended_one_is() -> None:
    budget = MemoryBudget(3 * MB)
    bus = LogBus(budget=budget, history_bytes=8 * MB)
    old = bus.open("old")
    await old.write("stdout", b"o" * (2 * MB))
    old.end("done", 0)
    running = bus.open("running")
    for _ in range(4):
        await running.write("stdout", b"r" * MB)
    # the running log is over the budget on its own: the ended one went, the running one stays
    assert running.history.size == 4 * MB
    assert old.history.size == 0 or old.history.size < MB
    assert budget.is_evicted(("log", "old")) and not budget.is_evicted(("log", "running"))
    # a reader of the evicted log is told what it missed, then gets the end
    async with old.subscribe("start") as sub:
        events = [ev async for ev in sub]
    assert isinstance(events[0], Skipped) and isinstance(events[-1], End)
    running.end("done", 0)
    assert budget.total <= budget.limit


async def test_an_evicted_log_is_still_read_from_its_spill_file(tmp_path: Path) -> None:
    budget = MemoryBudget(MB)
    bus = LogBus(budget=budget, spill_dir=str(tmp_path))
    log = bus.open("spilled")
    await log.write("stdout", b"a" * (MB // 2))
    await log.write("stdout", b"b" * (MB // 2))
    log.end("done", 0)
    other = bus.open("other")
    await other.write("stdout", b"c" * MB)
    assert budget.is_evicted(("log", "spilled"))
    got = b""
    with trio.fail_after(5):
        async with log.subscribe("start") as sub:
            async for ev in sub:
                if isinstance(ev, Output):
                    got += ev.data
                assert not isinstance(ev, Skipped)
    assert got == b"a" * (MB // 2) + b"b" * (MB // 2)


async def test_results_and_logs_share_one_budget_and_the_metrics_show_it() -> None:
    budget = MemoryBudget(10 * MB)
    bus = LogBus(budget=budget)
    t = table(budget)
    log = bus.open("j1")
    await log.write("stdout", b"x" * (6 * MB))
    log.end("done", 0)
    finish(t, "j1", 6 * MB)  # over: the log ended first, so it goes first
    assert budget.is_evicted(("log", "j1")) and t.get("j1").state is JobState.DONE  # type: ignore[union-attr]
    metrics = NodeMetrics()
    metrics.watch_bus(bus)
    samples = dict(
        line.rsplit(" ", 1)
        for line in metrics.render()[0].decode().splitlines()
        if line.startswith("fleet_trio_memory_")
    )
    assert float(samples["fleet_trio_memory_budget_bytes"]) == 10 * MB
    assert float(samples['fleet_trio_memory_evictions_total{kind="log"}']) == 1
    assert float(samples['fleet_trio_memory_evictions_total{kind="result"}']) == 0
    assert float(samples['fleet_trio_memory_retained_bytes{kind="result"}']) == 6 * MB
    assert float(samples['fleet_trio_memory_evicted_bytes_total{kind="log"}']) == 6 * MB


BIG = r"""
import json, sys
p = json.loads(sys.stdin.read())
sys.stdout.write('{"blob": "' + p["c"] * 700000 + '"}')
"""


async def test_a_node_over_its_budget_polls_the_oldest_result_as_evicted(tmp_path: Path) -> None:
    task = {"command": [sys.executable, "-c", BIG], "payload": {"c": {"type": "string"}}}
    # results kept in RAM: no journal (with one, results over inline_max live in its files)
    config = node_config(tmp_path, {"big": task}, memory_budget="2MiB", journal={"enabled": False})
    async with running_node(tmp_path, config) as h:
        for i, c in enumerate("abcd"):
            assert (await h.dispatch(f"j{i}", "big", {"c": c})).status_code == 202
            await h.wait_terminal(f"j{i}")
        first = (await h.poll("j0")).json()
        assert first["state"] == "error" and first["error"].startswith(EVICTED_PREFIX)
        assert "2MiB" in first["error"]
        last = (await h.poll("j3")).json()
        assert last["state"] == "done" and last["data"]["blob"] == "d" * 700000
        again = await h.dispatch("j0", "big", {"c": "a"})
        assert again.status_code == 409 and EVICTED_PREFIX in again.text
        text = (await h.client.get("/metrics")).text
        assert 'fleet_trio_memory_evictions_total{kind="result"}' in text


async def test_with_the_journal_big_results_live_in_files_and_are_not_evicted(
    tmp_path: Path,
) -> None:
    """The journal keeps results over ``inline_max`` in files beside it, not in RAM: they cost
    the memory budget nothing, so nothing is evicted and every result polls ``done``."""
    task = {"command": [sys.executable, "-c", BIG], "payload": {"c": {"type": "string"}}}
    config = node_config(tmp_path, {"big": task}, memory_budget="2MiB")
    async with running_node(tmp_path, config) as h:
        for i, c in enumerate("abcd"):
            assert (await h.dispatch(f"j{i}", "big", {"c": c})).status_code == 202
            await h.wait_terminal(f"j{i}")
        for i, c in enumerate("abcd"):
            polled = (await h.poll(f"j{i}")).json()
            assert polled["state"] == "done" and polled["data"]["blob"] == c * 700000


CHATTY = r"""
import sys, time
sys.stdin.read()
sys.stderr.write("l" * 1999 + "\n")
for _ in range(1000):
    sys.stderr.write("l" * 1999 + "\n")
sys.stderr.flush()
time.sleep(120)
"""
QUICK = "import sys; sys.stdin.read(); print('{\"v\": 7}')"


async def test_a_running_jobs_log_over_the_budget_never_evicts_a_fresh_result(
    tmp_path: Path,
) -> None:
    """A running job's log history alone is over the budget (running output cannot be
    evicted): a result published now is kept (the reserve: a quarter of the budget for ended
    entries, logs before results), so a dispatcher polling it at once gets it."""
    tasks = {
        "chatty": {"command": [sys.executable, "-c", CHATTY]},
        "quick": {"command": [sys.executable, "-c", QUICK]},
    }
    config = node_config(
        tmp_path,
        tasks,
        memory_budget="1MiB",
        journal={"enabled": False},
        timings={"drain_timeout": "100ms", "kill_grace": "100ms"},
    )
    async with running_node(tmp_path, config) as h:
        assert (await h.dispatch("chatty", "chatty", {})).status_code == 202

        async def retained_logs() -> bool:
            text = (await h.client.get("/metrics")).text
            line = next(x for x in text.splitlines() if x.startswith(RETAINED_LOG))
            return float(line.rsplit(" ", 1)[1]) > 1.5 * MB

        await wait_until(retained_logs, what="the running job's log history over the budget")
        for i in range(3):
            assert (await h.dispatch(f"q{i}", "quick", {})).status_code == 202
            assert await h.wait_terminal(f"q{i}") == {
                "job_id": f"q{i}",
                "state": "done",
                "data": {"v": 7},
            }
        for i in range(3):  # and still later: the reserve holds them all
            assert (await h.poll(f"q{i}")).json()["state"] == "done"
        assert (await h.poll("chatty")).json()["state"] == "running"


RETAINED_LOG = 'fleet_trio_memory_retained_bytes{kind="log"}'


MID = r"""
import sys
sys.stdin.read()
sys.stdout.write('{"blob": "' + "m" * 60000 + '"}')
"""


async def test_an_evicted_result_stays_evicted_after_a_restart(tmp_path: Path) -> None:
    """With the journal, a result up to ``inline_max`` is kept in RAM (and charged); its
    eviction is journaled, so the restarted node answers the same ``error`` — not ``done``."""
    config = node_config(
        tmp_path, {"mid": {"command": [sys.executable, "-c", MID]}}, memory_budget="1MiB"
    )
    async with running_node(tmp_path, config) as h:
        for i in range(22):
            assert (await h.dispatch(f"j{i}", "mid", {})).status_code == 202
            await h.wait_terminal(f"j{i}")
        before = (await h.poll("j0")).json()
        assert before["state"] == "error" and before["error"].startswith(EVICTED_PREFIX)
        assert (await h.poll("j21")).json()["state"] == "done"
    roomy = node_config(  # a restart with room for every result: nothing is evicted again
        tmp_path, {"mid": {"command": [sys.executable, "-c", MID]}}, memory_budget="64MiB"
    )
    async with running_node(tmp_path, roomy) as h:
        assert (await h.poll("j0")).json() == before
        assert (await h.poll("j21")).json()["state"] == "done"
