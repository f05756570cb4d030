"""The Unconfirmed tracker (worker-process.md §6.6) and the labels wire map
(worker-protocol.md §9.1, items 134–136 at the function level).

The state machine drives :class:`UnconfirmedTracker` the way :class:`Prober` does (builtin,
nvidia-smi, drop-ins or an unlistable directory, end of pass) and checks it against a model
written from the spec's wording rather than from the implementation's carried memory:

* a source speaks for the devices it named in its **last successful run**, provided it has been
  present (run, failed, or covered by an unlistable directory) in every pass since; a source that
  was absent for a pass is forgotten; one that never succeeded speaks for no device;
* nvidia-smi, when broken (or gone after being seen at startup), speaks for the devices it last
  reported, else every declared ``gpu<N>`` device; gone and never seen → nothing;
* an unreadable probe dir fails every drop-in present in the previous pass;
* a device is unconfirmed iff some source that failed this pass speaks for it;
* the "clearing" warning is due for a failing drop-in that speaks for no device, once per
  episode: not again until the source succeeds or disappears for a pass.
"""

from __future__ import annotations

import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from fleet_trio.worker.config import DeviceConfig, WorkerConfig
from fleet_trio.worker.probes import (
    BUILTIN,
    NVIDIA,
    Prober,
    ProbeResult,
    UnconfirmedTracker,
    labels_payload,
)

DEVICES = ("gpu0", "gpu1", "a100-0")
GPU_DEVICES = frozenset({"gpu0", "gpu1"})
DROPINS = ("/p/05-a", "/p/10-b", "/p/20-c")

named_sets = st.frozensets(st.sampled_from(DEVICES))
dropin_actions = st.one_of(
    st.just(("absent", frozenset[str]())),
    st.just(("skipped", frozenset[str]())),
    st.just(("fail", frozenset[str]())),
    st.tuples(st.just("ok"), named_sets),
)
nvidia_actions = st.one_of(
    st.just(("absent", frozenset[str]())),
    st.just(("broken", frozenset[str]())),
    st.tuples(st.just("ok"), st.frozensets(st.sampled_from(sorted(GPU_DEVICES)))),
)


class TrackerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tracker = UnconfirmedTracker(DEVICES)
        # The model.
        self.last_named: dict[str, frozenset[str]] = {}
        """Source → devices named in its last success (while continuously present)."""
        self.present: set[str] = set()
        """Sources present in the previous pass."""
        self.seen_at_startup: bool | None = None
        self.episode_warned: set[str] = set()
        # What the last pass produced (for the invariants).
        self.unconfirmed: dict[str, tuple[str, ...]] = {}
        self.failed_this_pass: dict[str, frozenset[str]] = {}
        self.warnings: list[str] = []
        self.passes = 0

    @rule(
        nvidia=nvidia_actions,
        dropins=st.tuples(*(dropin_actions for _ in DROPINS)),
        list_error=st.booleans(),
    )
    def run_pass(
        self,
        nvidia: tuple[str, frozenset[str]],
        dropins: tuple[tuple[str, frozenset[str]], ...],
        list_error: bool,
    ) -> None:
        t = self.tracker
        t.begin_pass()
        t.merge(BUILTIN, ())
        now_present: set[str] = {BUILTIN}
        failed: dict[str, frozenset[str]] = {}
        warnings: list[str] = []
        expected_warnings: list[str] = []

        # -- nvidia-smi
        kind, named = nvidia
        if self.seen_at_startup is None:
            self.seen_at_startup = kind != "absent"
        if kind == "ok":
            t.nvidia(found=True, broken=False, named=named)
            self.last_named[NVIDIA] = named
            now_present.add(NVIDIA)
        else:
            t.nvidia(found=kind != "absent", broken=kind == "broken")
            if kind == "broken" or self.seen_at_startup:
                failed[NVIDIA] = self.last_named.get(NVIDIA) or GPU_DEVICES
                now_present.add(NVIDIA)

        def fail(source: str) -> bool:
            scope = (
                self.last_named.get(source, frozenset()) if source in self.present else frozenset()
            )
            failed[source] = scope
            now_present.add(source)
            due = not scope and source not in self.episode_warned
            if due:
                self.episode_warned.add(source)
                expected_warnings.append(source)
            return due

        # -- drop-ins
        if list_error:
            for source, due in t.list_failed():
                if due:
                    warnings.append(source)
            for source in sorted(self.present - {BUILTIN, NVIDIA}):
                fail(source)
        else:
            for source, (action, named_) in zip(DROPINS, dropins, strict=True):
                if action == "ok":
                    t.merge(source, named_)
                    self.last_named[source] = named_
                    self.episode_warned.discard(source)
                    now_present.add(source)
                elif action == "fail":
                    if t.dropin_failed(source):
                        warnings.append(source)
                    fail(source)
        self.unconfirmed = t.end_pass()

        # -- model bookkeeping: whoever was absent is forgotten
        for source in list(self.last_named):
            if source not in now_present:
                del self.last_named[source]
        self.episode_warned &= now_present
        self.present = now_present
        self.failed_this_pass = failed
        self.warnings = warnings
        self.passes += 1
        assert warnings == expected_warnings

    @invariant()
    def unconfirmed_is_exactly_what_failing_sources_speak_for(self) -> None:
        expected: set[str] = set()
        for scope in self.failed_this_pass.values():
            expected |= scope
        assert set(self.unconfirmed) == expected

    @invariant()
    def unconfirmed_devices_are_declared_and_attributed(self) -> None:
        for device, sources in self.unconfirmed.items():
            assert device in DEVICES
            assert sources
            for source in sources:
                assert device in self.failed_this_pass[source]

    @invariant()
    def memory_holds_exactly_the_present_sources(self) -> None:
        if self.passes:
            assert set(self.tracker.memory) == self.present

    @invariant()
    def nvidia_never_warns_about_clearing(self) -> None:
        assert NVIDIA not in self.warnings
        assert NVIDIA not in self.tracker.warned

    @invariant()
    def a_source_that_never_succeeded_speaks_for_nothing(self) -> None:
        for source in DROPINS:
            if source not in self.last_named:
                assert self.tracker.scope(source) == frozenset()

    @invariant()
    def warned_markers_only_for_present_sources(self) -> None:
        assert self.tracker.warned <= set(self.tracker.memory)
        assert self.tracker.warned == self.episode_warned


TestTracker = TrackerMachine.TestCase
TestTracker.settings = settings(max_examples=100, stateful_step_count=10, deadline=None)


def test_tracker_refuses_calls_outside_a_pass() -> None:
    t = UnconfirmedTracker(["gpu0"])
    with pytest.raises(RuntimeError):
        t.merge("x", ())
    t.begin_pass()
    t.merge("x", {"gpu0"})
    assert t.end_pass() == {}
    with pytest.raises(RuntimeError):
        t.end_pass()


def test_aborted_pass_keeps_the_previous_memory() -> None:
    t = UnconfirmedTracker(["gpu0", "gpu1"])
    t.begin_pass()
    t.merge("/p/a", {"gpu0"})
    t.end_pass()
    t.begin_pass()
    t.merge("/p/a", set())
    t.abort_pass()
    assert t.scope("/p/a") == frozenset({"gpu0"})
    t.begin_pass()
    assert t.dropin_failed("/p/a") is False
    assert t.end_pass() == {"gpu0": ("/p/a",)}


# -- the wire map (worker-protocol.md §9.1) ---------------------------------------------------


def result(
    host: dict[str, str] | None = None,
    device: dict[str, dict[str, str]] | None = None,
    unconfirmed: set[str] | None = None,
) -> ProbeResult:
    unc = frozenset(unconfirmed or ())
    return ProbeResult(
        host=host or {},
        device=device if device is not None else {"gpu0": {}, "gpu1": {}},
        unconfirmed=unc,
        unconfirmed_by={d: ("/p/x",) for d in sorted(unc)},
    )


def test_pass_with_no_facts_anywhere_is_null_and_with_facts_sends_everything() -> None:
    """Protocol item 134."""
    assert labels_payload(result()) is None
    assert labels_payload(result(unconfirmed={"gpu0"})) is None
    assert labels_payload(result(host={"cpus": "8"})) == {"": {"cpus": "8"}, "gpu0": {}, "gpu1": {}}
    assert labels_payload(result(device={"gpu0": {"vram": "80G"}, "gpu1": {}})) == {
        "gpu0": {"vram": "80G"},
        "gpu1": {},
    }


def test_only_unconfirmed_empty_devices_are_omitted_and_host_key_needs_host_facts() -> None:
    """Protocol item 135."""
    payload = labels_payload(
        result(
            host={"cpus": "8"},
            device={"gpu0": {}, "gpu1": {}, "gpu2": {"vram": "1M"}},
            unconfirmed={"gpu0", "gpu2"},
        )
    )
    assert payload == {"": {"cpus": "8"}, "gpu1": {}, "gpu2": {"vram": "1M"}}
    payload = labels_payload(
        result(device={"gpu0": {"vram": "80G"}, "gpu1": {}}, unconfirmed={"gpu1"})
    )
    assert payload == {"gpu0": {"vram": "80G"}}
    assert "" not in payload


facts_maps = st.dictionaries(st.sampled_from(["vram", "model", "rack"]), st.text(max_size=3))


@given(
    host=st.dictionaries(st.sampled_from(["cpus", "kernel"]), st.text(max_size=3)),
    device=st.fixed_dictionaries({d: facts_maps for d in DEVICES}),
    unconfirmed=st.frozensets(st.sampled_from(DEVICES)),
)
def test_wire_map_rules(
    host: dict[str, str], device: dict[str, dict[str, str]], unconfirmed: frozenset[str]
) -> None:
    payload = labels_payload(ProbeResult(host=host, device=device, unconfirmed=unconfirmed))
    if not host and not any(device.values()):
        assert payload is None
        return
    assert payload is not None
    assert ("" in payload) == bool(host)
    if host:
        assert payload[""] == host
    for d in DEVICES:
        if d in unconfirmed and not device[d]:
            assert d not in payload
        else:
            assert payload[d] == device[d]


def test_preserving_warning_once_per_episode(caplog: pytest.LogCaptureFixture) -> None:
    """Protocol item 136: logged once per episode, again only after recovery then failure."""
    caplog.set_level(logging.WARNING, logger="fleet_trio.worker.probes")
    prober = Prober(
        WorkerConfig(host="h", devices=[DeviceConfig(name="gpu0"), DeviceConfig(name="gpu1")])
    )

    def count() -> int:
        return sum(
            "preserving" in r.getMessage() and "gpu0" in r.getMessage() for r in caplog.records
        )

    failing = result(host={"cpus": "8"}, unconfirmed={"gpu0"})
    healthy = result(host={"cpus": "8"})
    payload = prober.wire_labels(failing)
    assert payload is not None and "gpu0" not in payload
    assert count() == 1
    record = next(r for r in caplog.records if "preserving" in r.getMessage())
    assert "/p/x" in record.getMessage()  # says why: the failing source
    prober.wire_labels(failing)
    prober.wire_labels(failing)
    assert count() == 1
    assert prober.wire_labels(healthy) == {"": {"cpus": "8"}, "gpu0": {}, "gpu1": {}}
    assert count() == 1
    prober.wire_labels(failing)
    assert count() == 2
