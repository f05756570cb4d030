"""The live log tail of a node over real websockets (docs/tail.md), and ``fleet-trio tail``."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import trio
from trio_websocket import (
    ConnectionRejected,
    open_websocket_url,
)

from fleet_trio.cli import tail_exit_status
from fleet_trio.errors import ConfigError
from fleet_trio.logbus.bus import End, Output, Skipped
from fleet_trio.logbus.tail import (
    CLOSE_BAD_REQUEST,
    CLOSE_NORMAL,
    CLOSE_UNKNOWN_JOB,
    MAX_FRAME_DATA,
    TailError,
    TailEvent,
    TailProtocolError,
    dumps,
    encode_event,
    loads,
    parse_query,
)
from fleet_trio.logbus.tail_client import tail_url
from tests.helpers import (
    LINES_SCRIPT,
    assert_contiguous,
    collect,
    logged,
    run_tail_cli,
    wait_until,
)
from tests.node.conftest import PY
from tests.node.harness import Harness, node_config, running_node


def expected_stderr(lines: int) -> bytes:
    return "".join(f"line {i} \u00e9\n" for i in range(lines)).encode()


def config(tmp_path: Path) -> Any:
    return node_config(tmp_path, {"lines": {"command": [PY, "-c", LINES_SCRIPT]}})


def ws_url(h: Harness, job_id: str, **params: str) -> str:
    return tail_url(h.node.url, job_id, params)


def split(events: list[TailEvent]) -> dict[str, bytes]:
    """Per-stream bytes; checks the offsets are contiguous in the log's byte sequence."""
    out: dict[str, bytes] = {"stdout": b"", "stderr": b""}
    for ev in events:
        if isinstance(ev, Output):
            out[ev.stream] += ev.data
    return out


async def dispatch(h: Harness, job_id: str, **payload: Any) -> None:
    r = await h.dispatch(job_id, "lines", payload)
    assert r.status_code == 202, r.text


async def test_tail_from_start_every_byte_then_end(tmp_path: Path) -> None:
    async with running_node(tmp_path, config(tmp_path)) as h:
        await dispatch(h, "j1", lines=20, pause=0.01)
        events, code = await collect(ws_url(h, "j1"))
        assert code == CLOSE_NORMAL
        assert_contiguous(events)
        end = events[-1]
        assert isinstance(end, End) and (end.state, end.exit_code, end.reason) == ("done", 0, "")
        streams = split(events)
        assert streams["stderr"] == expected_stderr(20)
        assert json.loads(streams["stdout"]) == {"ok": True, "n": 20}
        # the poll agrees, and a replay of the ended log gives the same bytes and end (in
        # fewer, larger frames: a reader that is behind gets a stream's chunks joined)
        assert (await h.poll("j1")).json()["state"] == "done"
        again, code = await collect(ws_url(h, "j1"))
        assert code == CLOSE_NORMAL
        assert_contiguous(again)
        assert split(again) == streams and again[-1] == end
        assert len(again) <= len(events)


async def test_tail_failed_job_and_raw_bytes(tmp_path: Path) -> None:
    async with running_node(tmp_path, config(tmp_path)) as h:
        await dispatch(h, "bad", lines=2, exit=3, bad_utf8=True)
        events, code = await collect(ws_url(h, "bad"))
        assert code == CLOSE_NORMAL
        assert_contiguous(events)
        end = events[-1]
        assert isinstance(end, End) and (end.state, end.exit_code) == ("error", 3)
        assert "exit status 3" in end.reason
        assert (await h.poll("bad")).json()["error"] == end.reason
        assert split(events)["stderr"] == expected_stderr(2) + b"\xff\xfe raw\n"


async def test_the_tail_ends_only_once_the_poll_agrees(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the job journal, an outcome is visible to polls only after its commit; the log's
    ``end`` waits for it, so a client that polls right after the tail ended never reads
    ``running`` (a slow disk: every commit takes 0.3 s)."""
    from fleet_trio.node.journal import Journal

    original = Journal.apply

    def slow_apply(self: Journal, records: Any) -> None:
        time.sleep(0.3)
        original(self, records)

    monkeypatch.setattr(Journal, "apply", slow_apply)
    async with running_node(tmp_path, config(tmp_path)) as h:
        await dispatch(h, "slow-disk", lines=1, exit=3)
        events, code = await collect(ws_url(h, "slow-disk"))
        assert code == CLOSE_NORMAL and isinstance(events[-1], End)
        polled = (await h.poll("slow-disk")).json()
        assert polled["state"] == "error" and polled["error"] == events[-1].reason


async def test_tail_from_offset_and_stream_filter(tmp_path: Path) -> None:
    async with running_node(tmp_path, config(tmp_path)) as h:
        await dispatch(h, "j2", lines=5)
        events, _ = await collect(ws_url(h, "j2"))
        full = b"".join(ev.data for ev in events if isinstance(ev, Output))
        n = 13  # in the middle of a line
        tail, code = await collect(ws_url(h, "j2", **{"from": str(n)}))
        assert code == CLOSE_NORMAL
        assert_contiguous(tail, start=n)
        assert b"".join(ev.data for ev in tail if isinstance(ev, Output)) == full[n:]
        only_out, _ = await collect(ws_url(h, "j2", streams="stdout"))
        assert {ev.stream for ev in only_out if isinstance(ev, Output)} == {"stdout"}
        assert json.loads(split(only_out)["stdout"])["ok"] is True
        past, code = await collect(ws_url(h, "j2", **{"from": "now"}))
        assert code == CLOSE_NORMAL and len(past) == 1 and isinstance(past[0], End)


async def test_unknown_job_and_bad_query(tmp_path: Path) -> None:
    async with running_node(tmp_path, config(tmp_path)) as h:
        events, code = await collect(ws_url(h, "nope"))
        assert events == [TailError("unknown job")] and code == CLOSE_UNKNOWN_JOB
        await dispatch(h, "j3", lines=1)
        events, code = await collect(ws_url(h, "j3", **{"from": "-1"}))
        assert code == CLOSE_BAD_REQUEST
        assert len(events) == 1 and isinstance(events[0], TailError)
        assert "from" in events[0].message


async def test_token_required(tmp_path: Path) -> None:
    async with running_node(tmp_path, config(tmp_path), token="s3cret") as h:
        h.client.headers["Authorization"] = "Bearer s3cret"
        await dispatch(h, "j4", lines=2)
        for headers, params in (
            ([], {}),
            ([(b"Authorization", b"Bearer wrong")], {}),
            ([], {"token": "wrong"}),
        ):
            with pytest.raises(ConnectionRejected) as info:
                await collect(ws_url(h, "j4", **params), headers)
            assert info.value.status_code == 401
            assert json.loads(info.value.body or b"{}") == {
                "status": "error",
                "error": "unauthorized",
            }
        ok, code = await collect(ws_url(h, "j4"), [(b"Authorization", b"Bearer s3cret")])
        assert code == CLOSE_NORMAL and isinstance(ok[-1], End)
        ok, code = await collect(ws_url(h, "j4", token="s3cret"))
        assert code == CLOSE_NORMAL and isinstance(ok[-1], End)


async def test_two_subscribers_see_the_same_log(tmp_path: Path) -> None:
    async with running_node(tmp_path, config(tmp_path)) as h:
        await dispatch(h, "j5", lines=15, pause=0.02)
        results: list[list[TailEvent]] = [[], []]

        async def one(i: int) -> None:
            events, code = await collect(ws_url(h, "j5"))
            assert code == CLOSE_NORMAL
            results[i] = events

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one, 0)
            nursery.start_soon(one, 1)
        a, b = (b"".join(e.data for e in r if isinstance(e, Output)) for r in results)
        assert a == b and expected_stderr(15) in b"".join(
            e.data for e in results[0] if isinstance(e, Output) and e.stream == "stderr"
        )
        assert results[0][-1] == results[1][-1]


# -- the CLI ---------------------------------------------------------------------------------


async def test_cli_tail_prints_and_exits_with_the_job_code(tmp_path: Path) -> None:
    async with running_node(tmp_path, config(tmp_path)) as h:
        await dispatch(h, "ok", lines=10, pause=0.02)
        done = await run_tail_cli("--url", h.node.url, "ok")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == {"ok": True, "n": 10}
        assert done.stderr == expected_stderr(10)

        await dispatch(h, "fail", lines=3, exit=5)
        failed = await run_tail_cli("--url", h.node.url.replace("http://", "ws://"), "fail")
        assert failed.returncode == 5
        assert failed.stdout == b""
        assert failed.stderr.startswith(expected_stderr(3))
        assert b"fleet-trio tail: job fail ended error: lines failed: exit status 5" in (
            failed.stderr
        )

        only = await run_tail_cli("--url", h.node.url, "--streams", "stderr", "--from", "7", "ok")
        assert only.returncode == 0 and only.stdout == b""
        assert only.stderr == expected_stderr(10)[7:]

        unknown = await run_tail_cli("--url", h.node.url, "missing")
        assert unknown.returncode == 2
        assert b"fleet-trio tail: error: unknown job" in unknown.stderr


async def test_cli_tail_token_and_usage(tmp_path: Path) -> None:
    async with running_node(tmp_path, config(tmp_path), token="tok") as h:
        h.client.headers["Authorization"] = "Bearer tok"
        await dispatch(h, "t", lines=1)
        refused = await run_tail_cli("--url", h.node.url, "t")
        assert refused.returncode == 2 and b"refused: HTTP 401" in refused.stderr
        ok = await run_tail_cli("--url", h.node.url, "--token", "tok", "t")
        assert ok.returncode == 0 and ok.stderr == expected_stderr(1)
    bad = await run_tail_cli("--from", "later", "x")
    assert bad.returncode == 2 and b"from must be" in bad.stderr


# -- the protocol ----------------------------------------------------------------------------


def test_round_trip_and_query() -> None:
    for ev in (
        Output("stdout", 5, "é\n".encode(), 1.5),
        Output("stderr", 0, b"\xff\x00", 0.0),
        Skipped(3, 10),
        End("error", None, "interrupted", 42),
        End("done", 0, "", 0),
    ):
        (msg,) = encode_event(ev)
        assert loads(dumps(msg)) == ev
    (lossy,) = encode_event(Output("stderr", 0, b"a\xff", 0.0))
    assert lossy["data"] == "a\ufffd" and lossy["b64"] == "Yf8="
    (clean,) = encode_event(Output("stdout", 0, b"ok", 0.0))
    assert "b64" not in clean
    big = encode_event(Output("stdout", 100, b"x" * (2 * MAX_FRAME_DATA + 10), 0.0))
    assert [m["offset"] for m in big] == [100, 100 + MAX_FRAME_DATA, 100 + 2 * MAX_FRAME_DATA]
    assert parse_query({}).start == "start"
    assert parse_query({"from": "12", "streams": "stderr"}).start == 12
    for bad in ({"from": "x"}, {"from": "-3"}, {"streams": "stdin"}, {"streams": ","}):
        with pytest.raises(TailProtocolError):
            parse_query(bad)
    with pytest.raises(TailProtocolError):
        loads('{"type": "nope"}')


def test_exit_status_mapping() -> None:
    assert tail_exit_status("done", 0) == 0
    assert tail_exit_status("error", 7) == 7
    assert tail_exit_status("succeeded", 0) == 0  # a worker job
    assert tail_exit_status("error", None) == 1
    assert tail_exit_status("error", 0) == 1
    assert tail_exit_status("killed", 300) == 1


async def test_a_node_shutdown_sends_open_tails_their_end(tmp_path: Path) -> None:
    """A drain that outlasts a job: the job ends `interrupted`, and a tail that is open gets
    the `end` frame (and a normal close) before the HTTP server goes; never a silent cut."""
    cfg = node_config(
        tmp_path,
        {"lines": {"command": [PY, "-c", LINES_SCRIPT]}},
        timings={"drain_timeout": "200ms", "kill_grace": "200ms"},
    )
    got: list[tuple[list[TailEvent], int | None]] = []
    async with running_node(tmp_path, cfg) as h:
        await dispatch(h, "long", lines=10_000, pause=0.05)

        async def tail() -> None:
            got.append(await collect(ws_url(h, "long")))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(tail)
            bus = h.node.context.bus
            await wait_until(lambda: bus.stats().subscribers == 1, what="the tail is open")
            nbytes = len(expected_stderr(2))
            await wait_until(lambda: logged(bus, "long", nbytes), what="a few lines printed")
            h.node.request_shutdown("test: drain with a job and a tail open")
    ((events, code),) = got
    assert code == CLOSE_NORMAL
    assert_contiguous(events)
    end = events[-1]
    assert isinstance(end, End)
    assert (end.state, end.reason) == ("error", "interrupted")
    assert split(events)["stderr"].startswith(expected_stderr(2))


# -- caps on live tails (docs/tail.md "Many tails") ------------------------------------------


async def hold_tails(urls: list[str], held: list[object], stop: trio.Event) -> None:
    """Open a websocket tail to each of ``urls`` and keep them open (not reading) until
    ``stop``; ``held`` gets one entry per open socket."""

    async def hold(url: str) -> None:
        async with open_websocket_url(url) as ws:
            held.append(ws)
            await stop.wait()

    async with trio.open_nursery() as nursery:
        for url in urls:
            nursery.start_soon(hold, url)


async def refused(url: str) -> tuple[int, Any]:
    with pytest.raises(ConnectionRejected) as info:
        async with open_websocket_url(url):
            pass
    return info.value.status_code, json.loads(info.value.body or b"{}")


TOO_MANY = {"status": "error", "error": "too many tails"}


async def test_the_33rd_tail_of_a_job_is_refused_until_one_leaves(tmp_path: Path) -> None:
    async with running_node(tmp_path, config(tmp_path)) as h:
        await dispatch(h, "watched", lines=3000, pause=0.01)  # runs on through the test
        held: list[object] = []
        stop = trio.Event()
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(hold_tails, [ws_url(h, "watched")] * 32, held, stop)
                await wait_until(lambda: len(held) == 32, what="32 tails open")
                assert await refused(ws_url(h, "watched")) == (503, TOO_MANY)
                tails = h.node.context.tails
                assert tails.count("watched") == 32
                stop.set()  # the 32 clients go away
            await wait_until(lambda: tails.open_count == 0, what="every slot given back")
            async with open_websocket_url(ws_url(h, "watched")) as ws:  # a new tail is served
                first = loads(await ws.get_message())
                assert isinstance(first, Output)


async def test_max_tails_caps_the_tails_of_all_jobs(tmp_path: Path) -> None:
    cfg = node_config(
        tmp_path, {"lines": {"command": [PY, "-c", LINES_SCRIPT]}}, max_tails=2, max_tails_per_job=2
    )
    async with running_node(tmp_path, cfg) as h:
        for job in ("a", "b", "c"):
            await dispatch(h, job, lines=3000, pause=0.01)
        held: list[object] = []
        stop = trio.Event()
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                urls = [ws_url(h, "a"), ws_url(h, "b")]
                nursery.start_soon(hold_tails, urls, held, stop)
                await wait_until(lambda: len(held) == 2, what="2 tails open")
                assert await refused(ws_url(h, "c")) == (503, TOO_MANY)
                assert await refused(ws_url(h, "no-such-job")) == (503, TOO_MANY)
                stop.set()
            await wait_until(lambda: h.node.context.tails.open_count == 0, what="slots back")
            async with open_websocket_url(ws_url(h, "c")) as ws:
                assert isinstance(loads(await ws.get_message()), Output)


def test_tail_caps_are_checked_in_the_node_config(tmp_path: Path) -> None:
    for key, value in (("max_tails", 0), ("max_tails_per_job", -1), ("max_tails", "many")):
        with pytest.raises(ConfigError) as info:
            node_config(tmp_path, {}, **{key: value})
        assert info.value.key == f"node.{key}"
    assert node_config(tmp_path, {}).node.max_tails_per_job == 32
    assert node_config(tmp_path, {}).node.max_tails == 256
