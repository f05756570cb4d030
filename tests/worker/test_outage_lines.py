"""A controller that is gone (issue 28 §8): the worker says what it tried and what to check,
in a few lines rather than one per try, and its shutdown does not wait its whole drain on it.
"""

from __future__ import annotations

import functools
import logging

import attrs
import pytest
import trio

from fleet_trio.worker.outage import FailureRun, RegistrationRun
from fleet_trio.worker.worker import Worker
from tests.helpers import FAST, FAST_CLIENT, config, dev, running, start_worker, wait_until

# --------------------------------------------------------------------------------------------
# The policies (sans-IO)
# --------------------------------------------------------------------------------------------


def test_a_run_of_failures_is_one_line_a_minute_with_the_count() -> None:
    run = FailureRun("heartbeat", every=60.0)
    assert run.failed(100.0, "refused") == "heartbeat failed: refused"
    assert [run.failed(100.0 + t, "refused") for t in (2, 4, 58)] == [None, None, None]
    line = run.failed(161.0, "refused")
    assert line == "heartbeat failed 4 more times (5 in a row over 61s); last: refused"
    assert run.failed(163.0, "refused") is None
    assert run.succeeded(170.0) == "heartbeat works again after 6 failures over 70s"
    assert run.succeeded(171.0) is None
    assert run.failed(200.0, "again") == "heartbeat failed: again"  # a new run
    assert run.total == 7


def test_registration_lines_back_off_and_the_hint_names_url_and_file() -> None:
    run = RegistrationRun("http://ctl:1/v1/workers/register", "/etc/rc/worker.yaml")
    lines = {n: run.failed(float(n), "ConnectError: refused", None, 1.0) for n in range(1, 100)}
    said = sorted(n for n, line in lines.items() if line is not None)
    assert said == [1, 3, 6, 12, 24, 48, 96]
    hint = lines[3]
    assert hint is not None
    assert "POST http://ctl:1/v1/workers/register failed 3 times" in hint
    assert "controller_url in /etc/rc/worker.yaml" in hint
    assert "running" in hint
    assert "96 times" in (lines[96] or "")


@pytest.mark.parametrize(
    ("status", "words"), [(401, "token"), (403, "token"), (503, "HTTP 503"), (None, "running")]
)
def test_the_hint_fits_the_failure(status: int | None, words: str) -> None:
    run = RegistrationRun("http://ctl:1/v1/workers/register", "w.yaml", hint_after=1)
    line = run.failed(0.0, "x", status, 1.0)
    assert line is not None and words in line


# --------------------------------------------------------------------------------------------
# The real worker
# --------------------------------------------------------------------------------------------


def _lines(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and text in r.getMessage()
    ]


async def test_a_worker_that_cannot_register_says_what_to_check_in_few_lines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A 'controller' that accepts connections and closes them: every registration fails."""
    caplog.set_level(logging.DEBUG, logger="fleet_trio.worker")
    tries = 0

    async def hang_up(stream: trio.SocketStream) -> None:
        nonlocal tries
        tries += 1
        await stream.aclose()

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            serve = functools.partial(trio.serve_tcp, hang_up, 0, host="127.0.0.1")
            (listener,) = await nursery.start(serve)
            url = f"http://127.0.0.1:{listener.socket.getsockname()[1]}"
            cfg = attrs.evolve(config(url), path="/etc/rc/worker.yaml")
            worker = Worker(cfg, timings=FAST, client_timings=FAST_CLIENT)
            start_worker(nursery, worker)
            await wait_until(lambda: tries >= 25, what="25 registration attempts", timeout=40)
            nursery.cancel_scope.cancel()
    failed = _lines(caplog, "register")
    assert 3 <= len(failed) <= 5, failed  # 1st, the hint (3rd), reminders at 6, 12, 24
    (hint,) = [line for line in failed if line.startswith("cannot register")]
    assert f"POST {url}/v1/workers/register" in hint
    assert "controller_url in /etc/rc/worker.yaml" in hint


async def test_heartbeat_failures_are_collapsed_and_the_drain_does_not_wait_on_a_gone_controller(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``kill %1 %2``: the controller goes first, with a job running; then the worker is
    stopped. Its job's report gets the reference's 5 tries, not the whole drain."""
    caplog.set_level(logging.INFO)
    timings = attrs.evolve(FAST, shutdown_drain=30.0, hurry_budget=10.0)
    with trio.fail_after(90):
        async with running(timings=timings) as (ctrl, worker):
            job = ctrl.submit(dev("gpu0"), ["sleep", "30"])
            await ctrl.wait_for(lambda: job in worker.supervised() and ctrl.statuses(job))
            ctrl.restart(down_for=10_000)  # gone: every connection is closed unanswered
            missed = worker.metrics.heartbeats_missed
            await wait_until(lambda: missed._value.get() >= 20, what="20 missed heartbeats")
            began = trio.current_time()
            worker.request_shutdown("test")
            await wait_until(lambda: not worker.jobs, timeout=60, what="the jobs' end")
            took = trio.current_time() - began
    assert took < 15.0, took  # the 30 s drain is not waited out
    assert len(_lines(caplog, "heartbeat failed")) <= 2, _lines(caplog, "heartbeat failed")
    assert _lines(caplog, "no answer from the controller to 5 tries since the shutdown")
