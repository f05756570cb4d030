"""Controller answers are outside input: a hostile poll answer is never an exit or a
traceback, and the ids it carries are checked before use. An answer that is not JSON, or not
an object with arrays, is skipped whole (the worker polls again); otherwise it is decoded item
by item: a bad assignment or kill id is logged and skipped alone, the rest is honoured."""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet_trio.errors import WireError
from fleet_trio.worker.client import (
    MAX_ANSWER_SECONDS,
    ControllerClient,
    ControllerError,
    Refused,
    Registration,
    decode_answer,
    make_converter,
)
from fleet_trio.worker.job import PRE_KILLED_REASON
from fleet_trio.worker.relay import FrameError, decode_frame
from tests.helpers import PY, dev, json_values, running, started, until_terminal

CONV = make_converter()


def assignment(**over: Any) -> dict[str, Any]:
    return {"job_id": "j-1", "device_id": "gpubox:gpu0", "command": ["true"], **over}


def body(*assignments: dict[str, Any], **extra: Any) -> bytes:
    return json.dumps({"assignments": list(assignments), **extra}).encode()


WHOLE: dict[str, bytes] = {
    "max_runtime 1e400": b'{"assignments": [{"job_id": "j", "device_id": "h:g", '
    b'"command": ["true"], "max_runtime_seconds": 1e400}]}',
    "idle NaN": b'{"assignments": [{"job_id": "j", "device_id": "h:g", "idle_timeout_seconds": '
    b"NaN}]}",
    "5000-digit int": b'{"assignments": [{"job_id": "j", "device_id": "h:g", '
    b'"max_runtime_seconds": ' + b"9" * 5000 + b"}]}",
    "env 3000 deep": b'{"assignments": [{"job_id": "j", "device_id": "h:g", "env": '
    + b'{"a":' * 3000
    + b"1"
    + b"}" * 3000
    + b"}]}",
    "not utf-8": b'{"assignments": [{"job_id": "\xff"}]}',
    "not an object": b"[1, 2]",
    "assignments not an array": b'{"assignments": {"job_id": "j"}}',
    "kills not an array": b'{"kills": "j-1"}',
}
"""Answers refused whole: not JSON (or past the decoder's bounds), or not the answer's shape."""

ITEMS: dict[str, bytes] = {
    "max_runtime huge int": body(assignment(max_runtime_seconds=10**30)),
    "max_runtime negative": body(assignment(max_runtime_seconds=-1)),
    "max_runtime over the cap": body(assignment(max_runtime_seconds=MAX_ANSWER_SECONDS + 1)),
    "max_runtime float": body(assignment(max_runtime_seconds=1.5)),
    "max_runtime string": body(assignment(max_runtime_seconds="5")),
    "max_runtime bool": body(assignment(max_runtime_seconds=True)),
    "env value object": body(assignment(env={"A": {"b": "c"}})),
    "env value number": body(assignment(env={"A": 1})),
    "command not strings": body(assignment(command=["echo", 3])),
    "job id newline": body(assignment(job_id="j\nFORGED line")),
    "job id NUL": body(assignment(job_id="j\x00")),
    "job id surrogate": b'{"assignments": [{"job_id": "j\\ud800", "device_id": "h:g"}]}',
    "job id slash": body(assignment(job_id="../../etc")),
    "job id empty": body(assignment(job_id="")),
    "job id number": body(assignment(job_id=7)),
    "job id too long": body(assignment(job_id="a" * 300)),
    "device id escape": body(assignment(device_id="h:\x1b[2Jgpu0")),
    "device id missing": body({"job_id": "j", "command": ["true"]}),
    "kill id newline": body(kills=["k\nx"]),
    "kill id number": body(kills=[3]),
    "cwd number": body(assignment(cwd=3)),
    "assignment not an object": body("j-1"),  # type: ignore[arg-type]
}
"""Answers with one bad item (an assignment or a kill id): that item is set aside alone."""

HOSTILE = {**WHOLE, **ITEMS}


@pytest.mark.parametrize("raw", WHOLE.values(), ids=WHOLE.keys())
def test_a_hostile_answer_is_a_wire_error_with_a_safe_message(raw: bytes) -> None:
    with pytest.raises(WireError) as info:
        decode_answer(CONV, raw)
    message = str(info.value)
    assert message and message.isprintable()
    assert len(message) < 400


@pytest.mark.parametrize("raw", ITEMS.values(), ids=ITEMS.keys())
def test_a_hostile_item_is_set_aside_with_a_safe_message(raw: bytes) -> None:
    answer = decode_answer(CONV, raw)
    assert answer.assignments == () and answer.kills == ()
    reasons = [r.reason for r in answer.refused] + list(answer.bad_kills)
    assert len(reasons) == 1
    assert all(r and r.isprintable() and len(r) < 400 for r in reasons)
    for r in answer.refused:  # a job id is kept only when it is itself valid
        assert r.job_id in (None, "j-1", "j")


def test_one_bad_assignment_leaves_the_rest_of_the_answer_standing() -> None:
    """The review's answer: one assignment out of range, one valid, a kill; before, the whole
    answer was dropped (the kill lost, the valid job never run and later ``lost``)."""
    raw = body(
        assignment(job_id="j-long", max_runtime_seconds=10_000_000_000),
        assignment(job_id="j-other"),
        {"device_id": "h:g"},
        kills=["j-run", "bad\nid", 7, "j-long"],
    )
    answer = decode_answer(CONV, raw)
    assert [a.job_id for a in answer.assignments] == ["j-other"]
    assert answer.kills == ("j-run", "j-long")
    assert [r.job_id for r in answer.refused] == ["j-long", None]
    assert "max_runtime_seconds out of range" in answer.refused[0].reason
    assert "job_id must be a string" in answer.refused[1].reason
    assert len(answer.bad_kills) == 2
    assert all(k.startswith("kills: invalid job id ") for k in answer.bad_kills)
    assert isinstance(answer.refused[0], Refused)


def test_lone_surrogates_in_an_answer_become_u_fffd_as_in_go() -> None:
    """Valid UTF-8 can still escape a lone surrogate (``"\\ud800"``); Go's decoder makes it
    U+FFFD, Python keeps it, and no argv, environment or path takes it (``surrogates not
    allowed`` from the OS layer): the worker reads such strings as Go does."""
    raw = (
        b'{"assignments": [{"job_id": "j-1", "device_id": "gpubox:gpu0", '
        b'"command": ["tr\\ud800ue", "\\ud83d\\ude00"], "env": {"K\\udc80": "v\\uDFFF"}, '
        b'"cwd": "/d\\ud800"}]}'
    )
    (a,) = decode_answer(CONV, raw).assignments
    assert a.command == ("tr\ufffdue", "\U0001f600")  # a real pair stays one character
    assert a.env == {"K\ufffd": "v\ufffd"}
    assert a.cwd == "/d\ufffd"
    with pytest.raises(FrameError, match="not base64"):  # a relay frame: refused, no traceback
        decode_frame(b'{"t": "d", "b": "\\ud800"}')


def test_a_good_answer_decodes() -> None:
    answer = decode_answer(
        CONV,
        body(
            assignment(
                env={"A": "b"}, max_runtime_seconds=14400, idle_timeout_seconds=600, cwd="/src"
            ),
            kills=["8a2e-1"],
        ),
    )
    (a,) = answer.assignments
    assert (a.job_id, a.device_id, a.env, a.max_runtime_seconds, a.idle_timeout_seconds) == (
        "j-1",
        "gpubox:gpu0",
        {"A": "b"},
        14400,
        600,
    )
    assert answer.kills == ("8a2e-1",)


async def test_the_client_turns_it_into_a_controller_error() -> None:
    answers = iter(WHOLE.values())

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/register"):
            return httpx.Response(200, json={"worker_id": "w\n1"})
        return httpx.Response(200, content=next(answers))

    async with ControllerClient(
        "http://ctrl", "t", transport=httpx.MockTransport(handler)
    ) as client:
        with pytest.raises(ControllerError) as info:
            await client.register(Registration("h"))
        assert "invalid worker_id" in str(info.value) and "\n" not in str(info.value)
        for _ in WHOLE:
            with pytest.raises(ControllerError) as info:
                await client.poll("w1", 0.01)
            assert str(info.value).startswith("poll: undecodable answer: ")
            assert str(info.value).isprintable()


async def test_the_worker_skips_hostile_answers_and_keeps_working(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    with trio.fail_after(40):
        async with running() as (ctrl, worker):
            for raw in HOSTILE.values():
                ctrl.fail_next("assignments", status=200, body=raw)
            n = len(ctrl.polls())
            await ctrl.wait_for(lambda: len(ctrl.polls()) >= n + len(HOSTILE) + 1, timeout=30)
            job = ctrl.submit(dev("gpu0"), [PY, "-c", "print('still here')"])
            assert await until_terminal(ctrl, job) == ["running", "succeeded"]
            await ctrl.wait_for(lambda: worker.supervised() == [], timeout=5)
    skipped = [
        r for r in caplog.records if r.getMessage().startswith(("poll failed: ", "poll answer: "))
    ]
    assert len(skipped) >= len(HOSTILE)
    assert all(r.exc_info is None for r in caplog.records)
    assert all(r.getMessage().isprintable() for r in skipped)  # no forged line, no escape


async def test_one_bad_assignment_does_not_cost_the_kills_or_the_other_jobs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The review's case against a controller: one answer kills a running job and hands out
    one assignment out of range and one valid. The kill is honoured, the valid job runs, and
    the refused one is reported ``failed`` with the reason, so its device stays ``ready``
    instead of waiting for the lease to expire (job ``lost``, device ``lease_expired``)."""
    caplog.set_level(logging.INFO)
    with trio.fail_after(40):
        async with running(devices=("gpu0", "gpu1", "gpu2")) as (ctrl, _):
            j_run = await started(ctrl, dev("gpu0"), ["sleep", "30"])
            # no checkpoint between these: the sim puts all three in one poll answer
            ctrl.kill(j_run)
            j_long = ctrl.submit(dev("gpu1"), ["true"], max_runtime_seconds=10_000_000_000)
            j_other = ctrl.submit(dev("gpu2"), [PY, "-c", "print('ran')"])
            assert await until_terminal(ctrl, j_run) == ["running", "killed"]
            assert await until_terminal(ctrl, j_other) == ["running", "succeeded"]
            assert await until_terminal(ctrl, j_long) == ["failed"]
            (report,) = ctrl.status_reports(j_long)
            assert report.reason.startswith("assignment refused by the worker: assignment ")
            assert "max_runtime_seconds out of range (0 to 9223372036)" in report.reason
            await ctrl.wait_for(lambda: ctrl.device(dev("gpu1")).state == "ready")
            j_next = ctrl.submit(dev("gpu1"), [PY, "-c", "pass"])
            assert await until_terminal(ctrl, j_next) == ["running", "succeeded"]
    lines = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("poll answer: assignment skipped: assignment " + j_long) for m in lines)
    assert not any(m.startswith("poll failed: ") for m in lines)


async def test_a_refused_assignment_killed_in_the_same_answer_is_reported_killed() -> None:
    with trio.fail_after(30):
        async with running(devices=("gpu0",)) as (ctrl, _):
            job = ctrl.submit(dev("gpu0"), ["true"], max_runtime_seconds=10_000_000_000)
            ctrl.kill(job)  # no checkpoint since the submit: one answer holds both
            assert await until_terminal(ctrl, job) == ["killed"]
            (report,) = ctrl.status_reports(job)
            assert report.reason == PRE_KILLED_REASON
            await ctrl.wait_for(lambda: ctrl.device(dev("gpu0")).state == "ready")


# --- fuzz -------------------------------------------------------------------------------------

_values = json_values(digits=40, text=12, items=3, keys=6, leaves=12)
_assignment = st.fixed_dictionaries(
    {},
    optional={
        k: _values | st.text(max_size=12)
        for k in (
            "job_id",
            "device_id",
            "command",
            "cwd",
            "env",
            "max_runtime_seconds",
            "idle_timeout_seconds",
            "submitter",
            "kind",
            "stdio",
        )
    },
)
_answer = st.fixed_dictionaries(
    {},
    optional={"assignments": st.lists(_assignment, max_size=3) | _values, "kills": _values},
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_answer | _values)
def test_fuzz_answer_shapes(data: object) -> None:
    try:
        answer = decode_answer(CONV, json.dumps(data).encode())
    except WireError as exc:
        assert str(exc).isprintable()
        return
    for a in answer.assignments:
        assert a.job_id.isprintable() and a.device_id.isprintable()
        assert 0 <= a.max_runtime_seconds <= MAX_ANSWER_SECONDS
        assert all(isinstance(v, str) for v in a.env.values())


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(["1e400", "-1e400", "NaN", "Infinity", "[" * 100, '"\\udc00"', "9" * 5000]),
    st.integers(min_value=0, max_value=60),
    st.binary(max_size=20),
)
def test_fuzz_answer_bytes(token: str, cut: int, tail: bytes) -> None:
    good = body(assignment(max_runtime_seconds=5))
    raw = good[:cut] + token.encode() + tail
    try:
        decode_answer(CONV, raw)
    except WireError as exc:
        assert str(exc).isprintable()


# --- relay frames (the controller's E9 stream) ------------------------------------------------

HOSTILE_FRAMES = [
    b"[" * 5000 + b"]" * 5000,
    b'{"t": "r", "rows": 1e400}',
    b'{"t": "r", "rows": NaN}',
    b'{"t": "d", "b": ' + b"[" * 3000 + b"]" * 3000 + b"}",
    b'{"t": "r", "rows": ' + b"9" * 5000 + b"}",
    b'{"t": "d", "b": "\xff"}',
]


@pytest.mark.parametrize("line", HOSTILE_FRAMES)
def test_a_hostile_relay_frame_is_a_frame_error(line: bytes) -> None:
    with pytest.raises(FrameError) as info:
        decode_frame(line)
    assert str(info.value).startswith(("malformed frame", "frame field"))


async def test_an_assignment_for_a_device_this_worker_does_not_have_is_refused(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The controller hands out only the devices a worker registered; an assignment for
    another (``otherhost:gpu7``) ran here, with ``CUDA_VISIBLE_DEVICES=7``. It is refused: never
    run, reported ``failed`` with the reason."""
    caplog.set_level(logging.INFO)
    ran = tmp_path / "ran"
    raw = body(
        assignment(job_id="j-other-host", device_id="otherhost:gpu7", command=["touch", str(ran)])
    )
    with trio.fail_after(30):
        async with running(devices=("gpu0",)) as (ctrl, worker):
            ctrl.fail_next("assignments", status=200, body=raw)
            await ctrl.wait_for(
                lambda: any("j-other-host" in r.path for r in ctrl.requests("status")),
                timeout=20,
            )
            (request,) = [r for r in ctrl.requests("status") if "j-other-host" in r.path][:1]
            sent = json.loads(request.body)
            assert sent["state"] == "failed"
            assert sent["reason"] == (
                "assignment refused by the worker: device otherhost:gpu7 is not one of this "
                "worker's devices"
            )
            assert "j-other-host" not in worker.jobs
            job = ctrl.submit(dev("gpu0"), [PY, "-c", "pass"])
            assert await until_terminal(ctrl, job) == ["running", "succeeded"]
    assert not ran.exists()
