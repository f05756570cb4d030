"""The controller client against the simulated controller over real HTTP, and the contact
tracker as a Hypothesis state machine."""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Awaitable, Callable

import pytest
import trio
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from fleet_trio.worker.client import (
    INSTANCE_HEADER,
    MAX_LOG_CHUNK,
    ContactTracker,
    ControllerClient,
    ControllerError,
    DeviceDecl,
    LogShipper,
    Registration,
    StatusReport,
    Timings,
)
from tests.helpers import CLIENT_FAST as FAST
from tests.helpers import HOST, REG, controller, scenario_pause, wait_until

# --------------------------------------------------------------------------------------------
# Wire shapes
# --------------------------------------------------------------------------------------------


async def test_register_body_headers_and_worker_id() -> None:
    with trio.fail_after(10):
        async with controller() as (ctrl, client):
            worker_id = await client.register(REG)
            assert worker_id
            record = ctrl.requests("register")[0]
            assert record.path == "/v1/workers/register"
            headers = {k.lower(): v for k, v in record.headers.items()}
            assert headers["authorization"] == "Bearer wtok"
            assert headers["content-type"] == "application/json"
            body = record.json()
            assert body == {
                "host": HOST,
                "boot_id": "b-1",
                "recovery": {"survivors_checked": True},
                "devices": [{"name": "gpu0", "max_runtime_seconds": 3600}, {"name": "gpu1"}],
                "labels": {"": {"cpus": "2"}, "gpu0": {}, "gpu1": {}},
                "declared_labels": {"gpu0": {"rack": "r3"}, "gpu1": None},
                "sheet": "",
                "device_sheets": {"gpu0": "", "gpu1": ""},
            }
            assert ctrl.device(f"{HOST}:gpu0").state == "ready"


async def test_register_failure_is_an_error_and_bad_token_401() -> None:
    with trio.fail_after(10):
        async with controller() as (_, client):
            bad = ControllerClient(client.base_url, "nope", timings=FAST)
            async with bad:
                with pytest.raises(ControllerError) as info:
                    await bad.register(REG)
            assert info.value.status == 401
            assert bad.tracker.instance  # a 401 is contact, with the instance header


async def test_heartbeat_poll_and_status_shapes() -> None:
    with trio.fail_after(10):
        async with controller() as (ctrl, client):
            wid = await client.register(REG)
            assert await client.heartbeat(wid, [])
            assert await client.heartbeat(wid, ["a", "b"])
            assert ctrl.heartbeats() == [{}, {"running_job_ids": ["a", "b"]}]
            empty = await client.poll(wid, 0.05)
            assert empty.assignments == () and empty.kills == ()
            poll = ctrl.polls()[0]
            assert poll.query == "wait=50ms"
            assert poll.path == f"/v1/workers/{wid}/assignments"
            job = ctrl.submit(f"{HOST}:gpu1", ["echo", "hi"], env={"A": "b"}, submitter="me")
            answer = await client.poll(wid, 1.0)
            (a,) = answer.assignments
            assert (a.job_id, a.device_id, a.command, a.env, a.submitter, a.kind) == (
                job,
                f"{HOST}:gpu1",
                ("echo", "hi"),
                {"A": "b"},
                "me",
                "job",
            )
            assert await client.report_running(job, wid)
            ok = await client.report_terminal(job, StatusReport(wid, "failed", 7))
            assert ok
            assert ctrl.statuses(job) == ["running", "failed"]
            bodies = [r.json() for r in ctrl.requests("status")]
            assert bodies == [
                {"worker_id": wid, "state": "running"},
                {"worker_id": wid, "state": "failed", "exit_code": 7},
            ]


async def test_kills_only_poll() -> None:
    with trio.fail_after(10):
        async with controller() as (ctrl, client):
            wid = await client.register(REG)
            job = ctrl.submit(f"{HOST}:gpu0", ["sleep", "9"])
            await client.poll(wid, 1.0)
            ctrl.kill(job)
            answer = await client.poll(wid, 1.0)
            assert answer.assignments == () and answer.kills == (job,)


async def test_poll_error_status_raises() -> None:
    with trio.fail_after(10):
        async with controller() as (ctrl, client):
            wid = await client.register(REG)
            ctrl.fail_next("assignments", status=500)
            with pytest.raises(ControllerError):
                await client.poll(wid, 0.05)


# --------------------------------------------------------------------------------------------
# Retries
# --------------------------------------------------------------------------------------------


async def test_terminal_report_retried_through_500s() -> None:
    with trio.fail_after(10):
        async with controller() as (ctrl, client):
            wid = await client.register(REG)
            job = ctrl.submit(f"{HOST}:gpu0", ["true"])
            await client.poll(wid, 1.0)
            ctrl.fail_next("status", status=500, count=7)
            assert await client.report_terminal(job, StatusReport(wid, "succeeded", 0))
            assert ctrl.statuses(job) == ["succeeded"]
            assert len(ctrl.requests("status")) == 8


async def test_terminal_report_4xx_given_up_after_five() -> None:
    with trio.fail_after(10):
        async with controller() as (ctrl, client):
            wid = await client.register(REG)
            assert not await client.report_terminal("nope", StatusReport(wid, "succeeded", 0))
            assert len(ctrl.requests("status")) == 5


async def test_backoff_sequence_between_attempts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The delays the client asks for are the configured sequence, the last one repeating;
    the wire shows each was waited out (lower bounds only: a loaded machine adds to them)."""
    timings = Timings(report_attempt_timeout=5.0, report_backoff=(0.1, 0.2, 0.4), patience=30)
    with trio.fail_after(20):
        async with controller(timings) as (ctrl, client):
            asked: list[float] = []
            backoff = client._backoff

            def recorded(index: int) -> float:
                asked.append(backoff(index))
                return asked[-1]

            monkeypatch.setattr(client, "_backoff", recorded)
            wid = await client.register(REG)
            job = ctrl.submit(f"{HOST}:gpu0", ["true"])
            await client.poll(wid, 1.0)
            ctrl.fail_next("status", status=503, count=4)
            assert await client.report_terminal(job, StatusReport(wid, "succeeded", 0))
            assert asked == [0.1, 0.2, 0.4, 0.4]
            at = [r.at for r in ctrl.requests("status")]
            gaps = [b - a for a, b in itertools.pairwise(at)]
            assert len(gaps) == len(asked)
            for gap, want in zip(gaps, asked, strict=True):
                assert gap >= want


async def test_blackholed_controller_gives_up_in_bounded_time() -> None:
    timings = Timings(report_attempt_timeout=0.2, report_backoff=(0.05,), patience=1.0)
    with trio.fail_after(10):
        async with controller(timings) as (ctrl, client):
            ctrl.latency("status", 30.0)
            t0 = trio.current_time()
            assert not await client.report_terminal("j", StatusReport("w", "succeeded", 0))
            assert trio.current_time() - t0 < 3.0


# --------------------------------------------------------------------------------------------
# Instance tracking
# --------------------------------------------------------------------------------------------


async def test_instance_tracking_over_restart() -> None:
    with trio.fail_after(10):
        async with controller() as (ctrl, client):
            wid = await client.register(REG)
            first = client.tracker.instance
            assert first == ctrl.instances[0]
            assert not client.tracker.owed
            ctrl.restart()
            await scenario_pause(0.05, why="the cut connections close before the next request")
            for _ in range(3):
                if await client.heartbeat(wid, []):
                    break
            assert client.tracker.instance == ctrl.instances[-1] != first
            assert client.tracker.owed


async def test_dropped_connection_is_not_contact() -> None:
    with trio.fail_after(10):
        async with controller() as (ctrl, client):
            wid = await client.register(REG)
            seen = client.tracker.last_contact
            ctrl.drop_next("heartbeat")
            assert not await client.heartbeat(wid, [])
            assert client.tracker.last_contact == seen


# --------------------------------------------------------------------------------------------
# Log batching and the kept outbox
# --------------------------------------------------------------------------------------------


async def test_log_batching_by_size_and_delay() -> None:
    with trio.fail_after(10):
        async with controller() as (ctrl, client):
            shipper = LogShipper(lambda c: client.send_log_chunk("j1", c), flush_delay=0.2)
            async with trio.open_nursery() as nursery:
                await nursery.start(shipper.serve)
                await shipper.write(b"x" * 70000)  # over 64 KiB: flushed at once
                await ctrl.wait_for(lambda: ctrl.log_chunks("j1"), timeout=2)
                assert [len(c) for c in ctrl.log_chunks("j1")] == [70000]
                t0 = trio.current_time()
                await shipper.write(b"a")
                await shipper.write(b"b")
                await ctrl.wait_for(lambda: len(ctrl.log_chunks("j1")) == 2, timeout=2)
                assert trio.current_time() - t0 >= 0.19
                await shipper.write(b"c" * (3 * MAX_LOG_CHUNK))
                await shipper.close()
            chunks = ctrl.log_chunks("j1")
            assert chunks[1] == b"ab"
            assert all(len(c) <= MAX_LOG_CHUNK for c in chunks)
            assert ctrl.logs("j1") == b"x" * 70000 + b"ab" + b"c" * (3 * MAX_LOG_CHUNK)


async def test_outbox_survives_an_outage_in_order() -> None:
    timings = Timings(report_attempt_timeout=0.3, report_backoff=(0.05, 0.1), patience=30.0)
    with trio.fail_after(15):
        async with controller(timings) as (ctrl, client):
            wid = await client.register(REG)
            job = ctrl.submit(f"{HOST}:gpu0", ["true"])
            await client.poll(wid, 1.0)
            shipper = LogShipper(lambda c: client.send_log_chunk(job, c), flush_delay=0.05)
            async with trio.open_nursery() as nursery:
                await nursery.start(shipper.serve)
                await shipper.write(b"before\n")
                await ctrl.wait_for(lambda: ctrl.logs(job) == b"before\n", timeout=2)
                # the answer is in: no ambiguous resend
                await wait_until(lambda: shipper.sent_chunks >= 1, what="the chunk's answer")
                ctrl.restart(down_for=1.0)
                for i in range(5):
                    await shipper.write(f"during {i}\n".encode())
                    await scenario_pause(0.1, why="one line per 100 ms through the outage")
                await shipper.close()
            assert await client.report_terminal(job, StatusReport(wid, "succeeded", 0))
            expected = b"before\n" + b"".join(f"during {i}\n".encode() for i in range(5))
            assert ctrl.logs(job) == expected
            assert ctrl.statuses(job)[-1] == "succeeded"


async def test_outbox_limit_drops_excess() -> None:
    sent: list[bytes] = []

    async def send(chunk: bytes) -> bool:
        sent.append(chunk)
        return True

    shipper = LogShipper(send, limit=10)
    await shipper.write(b"0123456789abc")
    await shipper.close()
    assert b"".join(sent) == b"0123456789"
    assert shipper.dropped == 3


async def test_a_given_up_chunk_drops_the_backlog_and_later_output_gets_one_attempt() -> None:
    """``send`` gives up on the first chunk: every chunk queued behind it and the unflushed
    buffer go with it; output written after that goes through ``send_once``, and the first
    chunk accepted ends that."""
    calls: list[tuple[str, bytes]] = []
    answers = {"kept": [False], "once": [False]}

    def sender(kind: str) -> Callable[[bytes], Awaitable[bool]]:
        async def send(chunk: bytes) -> bool:
            await trio.lowlevel.checkpoint()
            calls.append((kind, chunk))
            return answers[kind].pop(0) if answers[kind] else True

        return send

    shipper = LogShipper(sender("kept"), send_once=sender("once"), flush_bytes=4)
    for data in (b"aaaa", b"bbbb", b"cccc", b"dd"):  # three chunks queued, "dd" batched
        await shipper.write(data)
    await shipper.close()
    assert calls == [("kept", b"aaaa")]
    assert shipper.given_up == 14 and shipper.failing
    shipper._closing = False  # (a test reuses the closed shipper as if the job went on)
    await shipper.write(b"eeeeff")
    await shipper.close()
    assert calls[1:] == [("once", b"eeeeff")]
    assert shipper.given_up == 20 and shipper.failing
    shipper._closing = False
    await shipper.write(b"gggg")
    await shipper.close()
    assert calls[-1] == ("once", b"gggg")
    assert not shipper.failing  # accepted: the normal rule is back
    shipper._closing = False
    await shipper.write(b"hhhh")
    await shipper.close()
    assert calls[-1] == ("kept", b"hhhh")


async def test_a_kept_fault_survives_more_5xx_than_the_reference_tries() -> None:
    """``keep=True``: a fault answered 503 more often than ``fault_attempts`` is still
    delivered; a 4xx stays final after one attempt (§3.7)."""
    with trio.fail_after(10):
        async with controller() as (ctrl, client):
            await client.register(REG)
            ctrl.fail_next("fault", status=503, count=FAST.fault_attempts + 2)
            assert not await client.report_fault(f"{HOST}:gpu0", "verify failed: x")
            assert await client.report_fault(f"{HOST}:gpu0", "verify failed: x", keep=True)
            assert ctrl.faults(f"{HOST}:gpu0") == ["verify failed: x"]
            ctrl.fail_next("fault", status=404, count=1)
            assert not await client.report_fault(f"{HOST}:gpu1", "verify failed: y", keep=True)
            assert [r.outcome for r in ctrl.requests("fault")][-1] == "injected"


async def test_log_chunks_get_one_attempt_once_log_retries_are_stopped() -> None:
    with trio.fail_after(10):
        async with controller() as (ctrl, client):
            ctrl.fail_next("logs", status=500, count=100)
            client.stop_log_retries()
            assert not await client.send_log_chunk("j1", b"x")
            assert len(ctrl.requests("logs")) == 1


def test_instance_header_name() -> None:
    assert INSTANCE_HEADER == "Rc-Controller-Instance"


def test_registration_encoding_omits_empty() -> None:
    from fleet_trio.worker.client import encode, make_converter

    reg = Registration(host="h", devices=(DeviceDecl("g"),), labels=None, sheet=None)
    assert json.loads(encode(make_converter(), reg)) == {
        "host": "h",
        "devices": [{"name": "g"}],
        "labels": None,
        "declared_labels": {},
    }


# --------------------------------------------------------------------------------------------
# The contact tracker: a Hypothesis state machine against a small model
# --------------------------------------------------------------------------------------------

SILENCE, JITTER, PACING = 300.0, 30.0, 60.0


class TrackerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tracker = ContactTracker(
            silence=SILENCE, jitter_window=JITTER, retry_pacing=PACING, rng=random.Random(7)
        )
        self.now = 0.0
        self.last: float | None = None
        self.instance = ""
        self.owed = False
        self.due_floor = 0.0

    @rule(dt=st.floats(min_value=0, max_value=600, allow_nan=False))
    def time_passes(self, dt: float) -> None:
        self.now += dt

    @rule(instance=st.sampled_from(["", "", "A", "B", "C"]))
    def exchange(self, instance: str) -> None:
        was_owed = self.tracker.owed
        before_due = self.tracker.due_at
        arms = (self.last is not None and self.now - self.last >= SILENCE) or (
            bool(instance) and bool(self.instance) and instance != self.instance
        )
        self.tracker.observe(self.now, instance)
        if instance:
            self.instance = instance
        self.last = self.now if self.last is None else max(self.last, self.now)
        if was_owed:
            assert self.tracker.due_at == before_due  # arming again never moves the due time
        elif arms:
            self.owed = True
            assert self.tracker.due_at is not None
            assert self.now <= self.tracker.due_at < self.now + JITTER + 1e-9
        else:
            assert not self.tracker.owed
        self.owed = self.tracker.owed

    @precondition(lambda self: self.owed)
    @rule(busy=st.booleans(), ok=st.booleans())
    def idle_poll_check(self, busy: bool, ok: bool) -> None:
        due = self.tracker.due(self.now, busy=busy)
        assert self.tracker.due_at is not None
        assert due == (not busy and self.now >= self.tracker.due_at)
        if not due:
            return
        self.tracker.attempt(self.now)
        if ok:
            self.tracker.succeeded()
            self.owed = False
        else:
            assert self.tracker.due_at == self.now + PACING

    @invariant()
    def model_agrees(self) -> None:
        assert self.tracker.owed == self.owed
        assert self.tracker.instance == self.instance
        assert self.tracker.last_contact == self.last


TestTrackerMachine = TrackerMachine.TestCase
TestTrackerMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


async def test_persistent_5xx_is_given_up() -> None:
    timings = Timings(report_attempt_timeout=0.5, report_backoff=(0.01,), report_attempts_5xx=4)
    with trio.fail_after(10):
        async with controller(timings) as (ctrl, client):
            assert not await client.send_log_chunk("bad$id", b"x")
            assert len(ctrl.requests("logs")) == 4


async def test_in_the_shutdown_a_failed_chunk_is_dropped_alone() -> None:
    """The reference drops a failed chunk and tries the next (§3.6); in the shutdown (one
    attempt each) a blip on one chunk no longer takes the chunks behind it along."""
    answers = [False]
    sent: list[bytes] = []

    async def send(chunk: bytes) -> bool:
        await trio.lowlevel.checkpoint()
        sent.append(chunk)
        return answers.pop(0) if answers else True

    shipper = LogShipper(send, single=lambda: True, flush_bytes=4)
    for data in (b"aaaa", b"bbbb", b"cccc", b"dddd", b"eeee"):
        await shipper.write(data)
    await shipper.close()
    assert sent == [b"aaaa", b"bbbb", b"cccc", b"dddd", b"eeee"]
    assert shipper.sent_chunks == 4 and shipper.given_up == 4 and not shipper.failing
