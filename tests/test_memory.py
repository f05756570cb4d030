"""The memory budget (issue 14, item 5): a plain sync class, checked as a state machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from fleet_trio.memory import Key, MemoryBudget, format_size, parse_size


class BudgetMachine(RuleBasedStateMachine):
    """Jobs charge log histories while they run and results when they end; the budget must
    never evict a running job's entry, must settle within its limit whenever ended entries
    beyond the reserve are left to evict, and must evict ended logs before ended results, the
    oldest ended first within a kind."""

    def __init__(self) -> None:
        super().__init__()
        self.limit = 1000
        self.budget = MemoryBudget(self.limit)
        self.sizes: dict[Key, int] = {}
        self.running: set[Key] = set()
        self.end_order: list[Key] = []  # ended, not yet evicted, oldest first
        self.evicted: set[Key] = set()
        self.held: dict[Key, int] = {}
        self.n = 0

    def _evict(self, key: Key) -> int:
        assert key not in self.running, f"evicted running {key}"
        logs = [k for k in self.end_order if k[0] == "log"]
        first = logs[0] if logs else self.end_order[0]  # logs before results, oldest first
        assert key == first, f"evicted {key}, not {first}"
        # only to fit, and never below the reserve
        assert sum(self.sizes.values()) > self.limit, "evicted while within the limit"
        ended = sum(self.sizes[k] for k in self.end_order)
        assert ended > self.budget.reserve, "evicted within the reserve"
        self.end_order.remove(key)
        self.evicted.add(key)
        self.sizes[key] = min(self.held[key], self.sizes[key])
        return self.held[key]

    @rule(size=st.integers(0, 600), held=st.integers(0, 50))
    def start_job(self, size: int, held: int) -> None:
        self.n += 1
        key: Key = ("log", f"j{self.n}")
        self.held[key] = held
        self.budget.charge(key, size, lambda: self._evict(key))
        self.sizes[key] = size
        self.running.add(key)
        self.budget.settle()

    @precondition(lambda self: bool(self.running))
    @rule(data=st.data(), size=st.integers(0, 600))
    def write(self, data: st.DataObject, size: int) -> None:
        key = data.draw(st.sampled_from(sorted(self.running)))
        self.budget.charge(key, size)
        self.sizes[key] = size
        self.budget.settle()

    @precondition(lambda self: bool(self.running))
    @rule(data=st.data(), result=st.integers(0, 700))
    def end_job(self, data: st.DataObject, result: int) -> None:
        key = data.draw(st.sampled_from(sorted(self.running)))
        self.running.discard(key)
        self.budget.end(key)
        self.end_order.append(key)
        if result:
            rkey: Key = ("result", key[1])
            self.held[rkey] = 0
            self.budget.charge(rkey, result, lambda: self._evict(rkey))
            self.sizes[rkey] = result
            self.budget.end(rkey)
            self.end_order.append(rkey)
        self.budget.settle()

    @precondition(lambda self: bool(self.sizes))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.sizes)))
        self.budget.release(key)
        del self.sizes[key]
        self.running.discard(key)
        if key in self.end_order:
            self.end_order.remove(key)

    @invariant()
    def total_is_the_sum(self) -> None:
        assert self.budget.total == sum(self.sizes.values())
        for key, size in self.sizes.items():
            assert self.budget.size(key) == size

    @invariant()
    def within_the_limit_unless_nothing_is_left_to_evict(self) -> None:
        if self.budget.total > self.limit:  # only running or held bytes, or the reserve, over
            assert sum(self.sizes[key] for key in self.end_order) <= self.budget.reserve

    @invariant()
    def running_entries_are_never_evicted(self) -> None:
        assert not (self.running & self.evicted)


TestBudgetMachine = BudgetMachine.TestCase
TestBudgetMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_oldest_ended_first_and_counted() -> None:
    budget = MemoryBudget(100)
    gone: list[str] = []

    def evict(name: str) -> int:
        gone.append(name)
        return 0

    for name in ("a", "b", "c"):
        budget.charge(("result", name), 40, lambda name=name: evict(name))  # type: ignore[misc]
        budget.end(("result", name))
    budget.charge(("log", "run"), 50, lambda: evict("run"))
    assert budget.settle() == [("result", "a"), ("result", "b")]
    assert gone == ["a", "b"] and budget.total == 90
    assert budget.evicted.entries == {"result": 2, "log": 0}
    assert budget.evicted.nbytes == {"result": 80, "log": 0}
    assert budget.is_evicted(("result", "a")) and not budget.is_evicted(("result", "c"))
    # a running entry over the limit on its own stays; an ended one above the reserve (25) goes
    budget.charge(("log", "run"), 500)
    budget.settle()
    assert gone == ["a", "b", "c"] and budget.total == 500


def test_ended_logs_go_before_results() -> None:
    """A job's result is published before its log ends: oldest-first alone would evict the
    result before its own, younger, log history."""
    budget = MemoryBudget(1000, reserve=0)
    gone: list[Key] = []
    for key, size in ((("result", "a"), 400), (("log", "a"), 500), (("result", "b"), 400)):
        budget.charge(key, size, lambda key=key: gone.append(key) or 0)  # type: ignore[misc]
        budget.end(key)
    assert budget.settle() == [("log", "a")] and budget.total == 800
    budget.charge(("log", "run"), 300, lambda: 0)
    assert budget.settle() == [("result", "a")]
    assert gone == [("log", "a"), ("result", "a")]


def test_a_just_ended_result_is_kept_within_the_reserve_while_running_output_fills_it() -> None:
    """Running output alone over the limit: the newest ended entries keep up to the reserve
    (a quarter of the limit), the oldest go first; the rest of the ended entries go."""
    budget = MemoryBudget(1000)
    assert budget.reserve == 250
    gone: list[str] = []

    def charge_ended(name: str, size: int) -> None:
        budget.charge(("result", name), size, lambda: gone.append(name) or 0)  # type: ignore[func-returns-value]
        budget.end(("result", name))
        budget.settle()

    budget.charge(("log", "run"), 1500, lambda: 0)  # a running job's history: over on its own
    budget.settle()
    charge_ended("a", 100)
    charge_ended("b", 100)
    assert gone == [] and budget.total == 1700  # the reserve holds both
    charge_ended("c", 100)
    assert gone == ["a"] and budget.total == 1700  # the oldest goes; the newest is kept
    charge_ended("d", 300)  # alone above the reserve: it cannot be kept
    assert gone == ["a", "b", "c", "d"] and budget.total == 1500
    budget.charge(("log", "run"), 100)  # the running output shrinks: all fits again
    charge_ended("e", 600)
    assert gone == ["a", "b", "c", "d"] and budget.total == 700


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1GiB", 1 << 30),
        ("512MiB", 512 << 20),
        ("512mi", 512 << 20),
        ("2G", 2_000_000_000),
        ("2GB", 2_000_000_000),
        ("1500000", 1_500_000),
        ("1.5GiB", 3 << 29),
        ("64KiB", 65536),
        ("10B", 10),
    ],
)
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "GiB", "-1GiB", "1 XB", "1e400", "nan", "9" * 40, "1PiB"])
def test_parse_size_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        parse_size(text)


def test_format_size() -> None:
    assert [format_size(n) for n in (1 << 30, 3 << 20, 1000)] == ["1GiB", "3MiB", "1000B"]


def test_the_flag_is_a_usage_error_when_bad(capsys: pytest.CaptureFixture[str]) -> None:
    from fleet_trio.cli import main

    for value in ("lots", "10KiB"):
        with pytest.raises(SystemExit) as info:
            main(["node", "--memory-budget", value])
        assert info.value.code == 2
        assert "--memory-budget" in capsys.readouterr().err


def test_worker_flag_overrides_the_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fleet_trio.cli import main

    cfg = tmp_path / "w.yaml"
    cfg.write_text("controller_url: http://c:1\ntoken: t\nhost: h\ndevices: [gpu0]\n")
    assert main(["worker", "-c", str(cfg), "--check"]) == 0
    assert json.loads(capsys.readouterr().out)["memory_budget"] == "1GiB"
    cfg.write_text(cfg.read_text() + "memory_budget: 512MiB\n")
    assert main(["worker", "-c", str(cfg), "--check"]) == 0
    assert json.loads(capsys.readouterr().out)["memory_budget"] == "512MiB"
    assert main(["worker", "-c", str(cfg), "--check", "--memory-budget", "2GiB"]) == 0
    assert json.loads(capsys.readouterr().out)["memory_budget"] == "2GiB"
