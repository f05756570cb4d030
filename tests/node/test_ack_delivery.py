"""Delivery-checked acks (docs/node.md "Delivery-checked acks"): a dispatch whose client is gone
before its 202 is written is not an ack, and a request past ``ack_deadline`` at its commit is
answered 503.

The checkpoints, each with its own test: before the ack is committed (right before
registration, and when the journal takes the ack for its commit), after the commit before the
202 is returned, and after the 202 was handed to the server before the job is released. The
connection is a scripted :class:`Peer` here (a real one is tested against real sockets below,
pipelined keep-alive requests included; a real frozen node in test_ack_delivery_real.py).
"""

from __future__ import annotations

import json
import logging
import select
import socket
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from fleet_trio.errors import ConfigError
from fleet_trio.logbus.bus import LogBus
from fleet_trio.logbus.tail import CLOSE_NORMAL, CLOSE_UNKNOWN_JOB, serve_tail
from fleet_trio.node.app import NodeContext, create_app
from fleet_trio.node.config import config_from_mapping
from fleet_trio.node.delivery import DEFAULT_ACK_DEADLINE, Delivery
from fleet_trio.node.jobs import RELEASE_BOUND, Ack, Done, JobStore
from fleet_trio.node.journal import Accept, Journal, JournalWriter, Start, Withdraw
from fleet_trio.nursery.peer import GONE_CLOSED, GONE_RESET, SCOPE_KEY, Peer
from tests.helpers import elapse, wait_until
from tests.node.harness import echo_task, make_ctx, node_config, running_node, runs
from tests.node.store_tree import store_in_tree

# -- the dispatch path, with a scripted connection ----------------------------------------------


class ScriptedPeer(Peer):
    """A connection whose answers the test decides: ``gone`` answers one per call (then
    ``None``), ``reset`` always the same."""

    def __init__(self, gone: list[str | None] | None = None, reset: str | None = None) -> None:
        super().__init__(None)
        self.gone_answers = list(gone or [])
        self.reset_answer = reset
        self.calls: list[str] = []

    def gone(self) -> str | None:
        self.calls.append("gone")
        return self.gone_answers.pop(0) if self.gone_answers else None

    def reset(self) -> str | None:
        self.calls.append("reset")
        return self.reset_answer


class WithPeer:
    """ASGI wrapper: each HTTP request's scope carries ``self.peer`` (when set), as the real
    server's does (fleet_trio.nursery.httpserve)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.peer: Peer | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and self.peer is not None:
            scope[SCOPE_KEY] = self.peer
        await self.app(scope, receive, send)


class GatedJournal(Journal):
    """A journal whose commit of an ``Accept`` of ``hold`` waits until the test opens
    ``gate`` (the writer is busy: later submissions queue behind it)."""

    hold = "busy"

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.gate = threading.Event()
        self.holding = threading.Event()

    def apply(self, records: Any) -> None:
        if any(isinstance(r, Accept) and r.job_id == self.hold for r in records):
            self.holding.set()
            self.gate.wait(30)
        super().apply(records)


class Setup:
    def __init__(
        self, store: JobStore, ctx: NodeContext, client: httpx.AsyncClient, wrapper: WithPeer
    ) -> None:
        self.store = store
        self.ctx = ctx
        self.client = client
        self.wrapper = wrapper
        self.journal = store.journal

    async def dispatch(self, job_id: str, peer: Peer | None = None) -> httpx.Response:
        self.wrapper.peer = peer
        body = {"job_id": job_id, "task_type": "t"}
        try:
            return await self.client.post("/fleet/dispatch", content=json.dumps(body))
        finally:
            self.wrapper.peer = None

    @property
    def ran(self) -> list[str]:
        return self.ctx.runner.runs  # type: ignore[attr-defined,no-any-return]

    async def rows(self) -> list[str]:
        assert self.journal is not None
        rows = await self.journal.run_sync(self.journal.journal.load)
        return [row.job_id for row in rows]  # type: ignore[attr-defined]


@asynccontextmanager
async def setup(tmp_path: Path, journal: Journal | None = None) -> AsyncIterator[Setup]:
    if journal is None:
        journal = Journal(str(tmp_path / "j.sqlite"))
    journal.open()
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    async with store_in_tree(journal=JournalWriter(journal), janitor=False) as (store, _tree):
        ctx = make_ctx(work, store)
        wrapper = WithPeer(create_app(ctx))
        transport = httpx.ASGITransport(app=wrapper)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            yield Setup(store, ctx, client, wrapper)


@contextmanager
def not_acked_lines(caplog: pytest.LogCaptureFixture, job_id: str) -> Iterator[list[str]]:
    lines: list[str] = []
    with caplog.at_level(logging.WARNING):
        yield lines
    lines.extend(
        r.getMessage() for r in caplog.records if f"job {job_id}: not acked" in r.getMessage()
    )


async def _fresh_ack_runs_once(s: Setup, job_id: str) -> None:
    """A re-dispatch of a withdrawn id is a fresh ack (not a 409) and runs once."""
    again = await s.dispatch(job_id)
    assert again.status_code == 202, again.text
    await wait_until(lambda: s.ran.count(job_id) == 1, timeout=10, what=f"{job_id} run")
    body = (await s.client.get(f"/fleet/jobs/{job_id}")).json()
    assert body["state"] in ("accepted", "running", "done"), body  # (its Start may be in flight)
    assert s.ran.count(job_id) == 1


async def test_checkpoint_1_a_client_gone_before_registration_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with setup(tmp_path) as s:
        with not_acked_lines(caplog, "g1") as lines:
            r = await s.dispatch("g1", ScriptedPeer(gone=[GONE_RESET]))
        assert r.status_code == 503
        assert r.json() == {"status": "error", "error": "client gone"}
        assert (await s.client.get("/fleet/jobs/g1")).status_code == 404
        assert "g1" not in s.store.table
        assert await s.rows() == []
        assert not list((tmp_path / "work").iterdir())  # its prepared files are gone
        await _fresh_ack_runs_once(s, "g1")
    assert len(lines) == 1 and GONE_RESET in lines[0], lines


async def test_checkpoint_1_a_client_gone_when_the_commit_comes_up_is_never_committed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with setup(tmp_path) as s:
        peer = ScriptedPeer(gone=[None, GONE_CLOSED])  # there at registration, gone at commit
        with not_acked_lines(caplog, "g2") as lines:
            r = await s.dispatch("g2", peer)
        assert peer.calls == ["gone", "gone"]  # the second: the journal's veto
        assert r.status_code == 503 and r.json()["error"] == "client gone"
        assert (await s.client.get("/fleet/jobs/g2")).status_code == 404
        assert await s.rows() == []  # never written, so never recovered as acked
        await wait_until(lambda: not list((tmp_path / "work").iterdir()), timeout=10)
        assert "g2" not in s.ran
        await _fresh_ack_runs_once(s, "g2")
    assert len(lines) == 1 and "before its ack was committed" in lines[0], lines


async def test_checkpoint_2_a_client_gone_after_the_commit_withdraws_the_ack(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with setup(tmp_path) as s:
        peer = ScriptedPeer(gone=[None, None, GONE_CLOSED])  # gone right before the 202
        with not_acked_lines(caplog, "g3") as lines:
            r = await s.dispatch("g3", peer)
        assert r.status_code == 503 and r.json()["error"] == "client gone"
        assert (await s.client.get("/fleet/jobs/g3")).status_code == 404
        # committed, then durably withdrawn: a restart never reads it as acked
        await wait_until(lambda: _rows_without(s, "g3"), timeout=10, what="g3's row withdrawn")
        await wait_until(lambda: not list((tmp_path / "work").iterdir()), timeout=10)
        assert "g3" not in s.ran
        await _fresh_ack_runs_once(s, "g3")
    assert len(lines) == 1 and "before its 202 was written" in lines[0], lines


async def _rows_without(s: Setup, job_id: str) -> bool:
    return job_id not in await s.rows()


async def test_checkpoint_3_a_reset_after_the_202_was_handed_over_withdraws_before_the_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with setup(tmp_path) as s:
        peer = ScriptedPeer(reset=GONE_RESET)  # the 202 went out; the connection was reset
        with not_acked_lines(caplog, "g4") as lines:
            r = await s.dispatch("g4", peer)
            assert r.status_code == 202  # (the test client reads what a reset peer could not)
            await wait_until(lambda: _rows_without(s, "g4"), timeout=10)
        assert "reset" in peer.calls
        assert (await s.client.get("/fleet/jobs/g4")).status_code == 404
        await wait_until(lambda: not list((tmp_path / "work").iterdir()), timeout=10)
        assert "g4" not in s.ran
        await _fresh_ack_runs_once(s, "g4")
    assert len(lines) == 1 and "before its 202 could be read" in lines[0], lines


async def test_an_eof_after_the_202_is_a_delivered_ack(tmp_path: Path) -> None:
    """A client that read its 202 and closed: delivered (only a reset is a loss then)."""
    async with setup(tmp_path) as s:
        peer = ScriptedPeer(gone=[None, None, None, GONE_CLOSED, GONE_CLOSED])
        r = await s.dispatch("g5", peer)
        assert r.status_code == 202
        await wait_until(lambda: "g5" in s.ran, timeout=10, what="g5 run")
        assert peer.calls == ["gone", "gone", "gone", "reset"]


async def test_ack_deadline_a_commit_that_comes_up_late_is_refused_with_503(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    journal = GatedJournal(str(tmp_path / "j.sqlite"))
    async with setup(tmp_path, journal) as s:
        s.ctx.ack_deadline = 0.2
        answers: dict[str, httpx.Response] = {}

        async def send(job_id: str) -> None:
            answers[job_id] = await s.dispatch(job_id)

        with not_acked_lines(caplog, "late") as lines:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(send, "busy")  # its commit holds the writer
                assert await trio.to_thread.run_sync(journal.holding.wait, 10)
                sent_at = trio.current_time()
                nursery.start_soon(send, "late")
                await wait_until(lambda: s.store.table.pending("late"), timeout=10)
                # the fact waited for: more than ack_deadline has passed since "late" arrived
                await wait_until(lambda: trio.current_time() - sent_at > 0.3, timeout=10)
                journal.gate.set()
        assert answers["busy"].status_code == 202
        late = answers["late"]
        assert late.status_code == 503
        assert late.json() == {"status": "error", "error": "ack deadline passed"}
        assert (await s.client.get("/fleet/jobs/late")).status_code == 404
        assert await s.rows() == ["busy"]  # never committed
        assert "late" not in s.ran
    assert len(lines) == 1 and "past ack_deadline 0.2 s" in lines[0], lines


async def test_a_duplicate_waiting_on_a_refused_registration_is_acked_itself(
    tmp_path: Path,
) -> None:
    """The dispatcher's retry to the same node arrives while the first request (its client
    gone) is still being committed: the first is refused at its commit, the retry is a new
    ack (not a 503) and the job runs once."""
    journal = GatedJournal(str(tmp_path / "j.sqlite"))
    async with setup(tmp_path, journal) as s:
        answers: dict[str, httpx.Response] = {}

        async def send(name: str, job_id: str, peer: Peer | None = None) -> None:
            answers[name] = await s.dispatch(job_id, peer)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send, "busy", "busy")
            assert await trio.to_thread.run_sync(journal.holding.wait, 10)
            nursery.start_soon(send, "first", "dup", ScriptedPeer(gone=[None, GONE_CLOSED]))
            await wait_until(lambda: s.store.table.pending("dup"), timeout=10)
            nursery.start_soon(send, "retry", "dup")
            await trio.testing.wait_all_tasks_blocked()  # the retry waits on the first's commit
            assert "retry" not in answers
            journal.gate.set()
        assert answers["first"].status_code == 503
        assert answers["retry"].status_code == 202, answers["retry"].text
        await wait_until(lambda: "dup" in s.ran, timeout=10, what="dup run")
        assert s.ran.count("dup") == 1


# -- the store: withdraw, at each state -----------------------------------------------------------


async def test_withdraw_refuses_once_the_job_started_or_a_duplicate_was_acked(
    tmp_path: Path,
) -> None:
    journal = Journal(str(tmp_path / "j.sqlite"))
    journal.open()
    async with store_in_tree(journal=JournalWriter(journal), janitor=False) as (store, _tree):
        go = trio.Event()

        async def work() -> Done:
            await go.wait()
            return Done(b"{}")

        started = Ack("s", release=trio.Event())
        store.register("s", work, ack=started)
        assert await store.wait_ack(started) is None
        store.release(started)
        await wait_until(lambda: started.started, timeout=10)
        assert not store.withdraw(started, "too late")
        held = Ack("h", release=trio.Event())
        store.register("h", work, ack=held)
        assert await store.wait_ack(held) is None
        store.hold("h")
        assert not store.withdraw(held, "a duplicate was acked")
        store.release(held)
        go.set()
        await wait_until(lambda: store.table.queue_depth == 0, timeout=10)


async def test_withdraw_while_the_ack_is_being_written_is_undone_in_the_journal(
    tmp_path: Path,
) -> None:
    """The request ends (its client gone) while its ack is inside the commit: the commit's
    row is taken back by a Withdraw; nothing runs; the id is free again."""
    journal = GatedJournal(str(tmp_path / "j.sqlite"))
    journal.hold = "w"
    journal.open()
    writer = JournalWriter(journal)
    ran: list[str] = []

    async def work() -> Done:
        ran.append("w")
        return Done(b"{}")

    async with store_in_tree(journal=writer, janitor=False) as (store, _tree):
        ack = Ack("w", release=trio.Event())
        store.register("w", work, ack=ack)
        assert await trio.to_thread.run_sync(journal.holding.wait, 10)  # inside the commit
        assert store.withdraw(ack, "the request ended before its 202 was written")
        journal.gate.set()
        assert await store.wait_ack(ack) is not None
        await wait_until(lambda: "w" not in store.table, timeout=10)

        async def no_row() -> bool:
            rows = await writer.run_sync(journal.load)
            return not rows

        await wait_until(no_row, timeout=10, what="the withdrawal committed")
        assert ran == []
        fresh = Ack("w")
        store.register("w", work, ack=fresh)
        assert await store.wait_ack(fresh) is None
        await wait_until(lambda: ran == ["w"], timeout=10)


async def test_a_release_that_waited_its_bound_starts_the_job_only_if_its_client_is_there(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """The 202 is not written within RELEASE_BOUND (the node was frozen between the commit and
    the write, or the client reads nothing): the job starts then — unless its client is gone."""
    ran: list[str] = []

    def work(job_id: str) -> Any:
        async def run() -> Done:
            ran.append(job_id)
            return Done(b"{}")

        return run

    async with store_in_tree(janitor=False) as (store, _tree):
        with caplog.at_level(logging.WARNING):
            gone = Ack("gone", gone=lambda: GONE_CLOSED, release=trio.Event())
            there = Ack("there", gone=lambda: None, release=trio.Event())
            store.register("gone", work("gone"), ack=gone)
            store.register("there", work("there"), ack=there)
            await wait_until(lambda: ran == ["there"], timeout=RELEASE_BOUND + 5)
            await wait_until(lambda: gone.withdrawn, timeout=RELEASE_BOUND + 5)
        assert store.get("gone") is None and "gone" not in store.table
        assert "job gone: not acked: the client closed its connection" in caplog.text


def test_after_the_202_is_returned_only_a_reset_counts_at_the_release_bound() -> None:
    """Once the handler returned the 202, its bytes may have reached the client, which may
    have read them and closed: an EOF then is no loss, a reset is."""
    eof = Delivery(ScriptedPeer(gone=[GONE_CLOSED, GONE_CLOSED]), 0.0, 2.0)
    assert eof.gone_before_202() == GONE_CLOSED
    eof.answered = True
    assert eof.gone_before_202() is None
    reset = Delivery(ScriptedPeer(reset=GONE_RESET), 0.0, 2.0)
    reset.answered = True
    reason = reset.gone_before_202()
    assert reason is not None and GONE_RESET in reason


def test_the_journal_withdraws_only_an_accepted_row(tmp_path: Path) -> None:
    journal = Journal(str(tmp_path / "j.sqlite"))
    journal.open()
    journal.apply([Accept("a", 1.0), Accept("r", 1.0), Start("r")])
    journal.apply([Withdraw("a"), Withdraw("r")])
    assert [(row.job_id, row.state) for row in journal.load()] == [("r", "running")]
    journal.apply([Withdraw("x"), Withdraw("y")])  # a run of them: one statement each
    journal.apply([Withdraw("r"), Accept("a", 2.0)])  # a re-dispatch after its withdrawal
    assert sorted(row.job_id for row in journal.load()) == ["a", "r"]


# -- ack_deadline: the boundary and the config ----------------------------------------------------


async def test_the_deadline_counts_from_arrival_and_is_inclusive(
    autojump_clock: trio.abc.Clock,
) -> None:
    delivery = Delivery(None, trio.current_time(), 2.0)
    await elapse(2.0)
    assert delivery.before_commit() is None  # exactly the deadline: still acked
    await elapse(0.001)
    reason = delivery.before_commit()
    assert reason is not None and "past ack_deadline 2 s" in reason
    assert delivery.refused == "ack deadline passed"


def test_ack_deadline_defaults_to_2s_and_is_configurable() -> None:
    assert config_from_mapping({}).node.timings.ack_deadline == DEFAULT_ACK_DEADLINE == 2.0
    cfg = config_from_mapping({"node": {"timings": {"ack_deadline": "750ms"}}})
    assert cfg.node.timings.ack_deadline == 0.75


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0s", "must be > 0"),
        ("-1s", "must not be negative"),
        ("2", "missing unit"),
        (2, "expected a Go duration"),
        ("soon", "invalid duration"),
    ],
)
def test_a_bad_ack_deadline_names_the_key_and_file(value: object, message: str) -> None:
    raw = {"node": {"timings": {"ack_deadline": value}}}
    with pytest.raises(ConfigError) as exc:
        config_from_mapping(raw, path="node.yaml")
    text = str(exc.value)
    assert "node.yaml" in text and "node.timings.ack_deadline" in text, text
    assert message in text, text


# -- the connection check against real sockets ----------------------------------------------------


@contextmanager
def tcp_pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """(server side, client side) of a real loopback TCP connection."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
    try:
        yield server, client
    finally:
        server.close()
        client.close()


def test_a_real_connection_is_there_idle_and_with_a_pipelined_request_unread() -> None:
    with tcp_pair() as (server, client):
        peer = Peer(server)
        assert peer.gone() is None
        client.sendall(b"GET /fleet/health HTTP/1.1\r\nHost: x\r\n\r\n")  # pipelined: data
        assert peer.gone() is None
        assert peer.reset() is None
        assert server.recv(100).startswith(b"GET")  # nothing was consumed by the checks


def test_a_real_connection_closed_by_its_client_is_gone_even_with_data_unread() -> None:
    with tcp_pair() as (server, client):
        peer = Peer(server)
        client.sendall(b"GET / HTTP/1.1\r\n\r\n")
        client.shutdown(socket.SHUT_WR)  # EOF after a request: the timed-out client's close
        kernel_reports(server, select.POLLRDHUP)
        assert peer.gone() == GONE_CLOSED
        assert peer.reset() is None  # after a written answer an EOF is a normal close
        assert server.recv(100).startswith(b"GET")


def test_a_real_connection_reset_by_its_client_is_gone_before_and_after_the_answer() -> None:
    with tcp_pair() as (server, client):
        peer = Peer(server)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        client.close()  # linger 0: an RST
        kernel_reports(server, select.POLLERR | select.POLLHUP)
        assert peer.reset() == GONE_RESET
        assert peer.gone() == GONE_RESET


LINGER_0 = b"\x01\x00\x00\x00\x00\x00\x00\x00"
"""``SO_LINGER`` on, 0 s: the client's close is an RST (an abortive close)."""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="TCP_INFO counts: Linux")
def test_a_reset_after_the_client_read_its_202_is_not_a_lost_answer() -> None:
    """A client that read its 202 and closed abortively (an RST right after reading, as
    clients with ``SO_LINGER`` 0 and some proxies do): the 202 reached it, the ack stands."""
    with tcp_pair() as (server, client):
        peer = Peer(server)
        peer.answering()  # right before the 202 is written
        server.sendall(b"HTTP/1.1 202 \r\ncontent-length: 2\r\n\r\n{}")
        assert client.recv(100).endswith(b"{}")
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_0)
        client.close()
        kernel_reports(server, select.POLLERR | select.POLLHUP)
        assert peer.reset() is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="TCP_INFO counts: Linux")
def test_a_reset_before_the_202_reached_the_client_is_a_lost_answer() -> None:
    """The client closed before the 202 arrived (its timeout): its kernel answers the 202
    with an RST, never acknowledging it — the 202 was not read, the ack is taken back."""
    with tcp_pair() as (server, client):
        peer = Peer(server)
        client.close()
        kernel_reports(server, select.POLLRDHUP)
        peer.answering()
        server.sendall(b"HTTP/1.1 202 \r\ncontent-length: 2\r\n\r\n{}")
        kernel_reports(server, select.POLLERR | select.POLLHUP)
        assert peer.reset() == GONE_RESET


def test_a_socket_the_server_closed_is_gone_but_its_written_answer_is_not_lost() -> None:
    with tcp_pair() as (server, _client):
        peer = Peer(server)
        server.close()
        assert peer.gone() == GONE_CLOSED
        assert peer.reset() is None


def kernel_reports(sock: socket.socket, events: int) -> None:
    """Block until the kernel reports one of ``events`` on ``sock`` (a FIN: ``POLLRDHUP``; an
    RST: ``POLLERR``), at most 10 s: a wait on the fact, not on time."""
    poller = select.poll()
    poller.register(sock, events)
    ready = poller.poll(10_000)
    assert ready and ready[0][1] & events, "the client's close never reached the server side"


# -- a real server: pipelined keep-alive requests are not EOF -------------------------------------


async def test_a_pipelined_request_on_a_keep_alive_connection_is_not_taken_for_a_gone_client(
    tmp_path: Path,
) -> None:
    config = node_config(tmp_path, {"echo": echo_task(tmp_path)})
    async with running_node(tmp_path, config) as h:
        host, port = h.node.url.removeprefix("http://").rsplit(":", 1)
        body = json.dumps({"job_id": "p1", "task_type": "echo", "payload": {}}).encode()
        dispatch = (
            b"POST /fleet/dispatch HTTP/1.1\r\nHost: " + host.encode() + b"\r\n"
            b"Content-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )
        poll = b"GET /fleet/jobs/p1 HTTP/1.1\r\nHost: " + host.encode() + b"\r\n\r\n"
        with trio.fail_after(20):
            stream = await trio.open_tcp_stream(host, int(port))
            async with stream:
                await stream.send_all(dispatch + poll)  # both at once: the poll is unread data
                seen = b""
                while seen.count(b"HTTP/1.1 ") < 2:
                    chunk = await stream.receive_some(65536)
                    assert chunk, seen
                    seen += chunk
        assert seen.startswith(b"HTTP/1.1 202"), seen
        assert b'{"job_id":"p1","status":"accepted"}' in seen
        done = await h.wait_terminal("p1")
        assert done["state"] == "done"
        assert runs(tmp_path, "p1") == 1


# -- the live log of a withdrawn ack ------------------------------------------------------------


async def test_a_withdrawn_ack_leaves_no_live_log_a_tail_would_wait_on_forever(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The 202 went out (the job's live log opened with it), then the reset withdrew the ack:
    the id is unknown, so a tail of it is answered ``unknown job`` at once — never left
    waiting on a log no job will ever write or end — and a re-dispatch of the id gets a
    fresh log."""
    async with setup(tmp_path) as s:
        assert s.ctx.runner.bus is s.ctx.bus  # the dispatch opens each job's log at its ack
        r = await s.dispatch("g6", ScriptedPeer(reset=GONE_RESET))
        assert r.status_code == 202
        await wait_until(lambda: "g6" not in s.store.table, timeout=10, what="g6 withdrawn")
        sent: list[str] = []

        async def send_text(text: str) -> None:
            sent.append(text)

        with trio.fail_after(10):
            code = await serve_tail(s.ctx.bus, "g6", send_text, {})
        assert code == CLOSE_UNKNOWN_JOB, sent
        assert s.ctx.bus.get("g6") is None
        await _fresh_ack_runs_once(s, "g6")
        fresh = s.ctx.bus.get("g6")
        assert fresh is not None and fresh.ended is None


async def test_a_tail_waiting_on_a_withdrawn_ack_gets_its_end() -> None:
    """A tail that subscribed between the 202 and the withdrawal: the log is dropped from the
    bus and its readers get an ``end`` (the job never ran), not a wait without end."""
    bus = LogBus()
    bus.open("w1")
    sent: list[str] = []

    async def send_text(text: str) -> None:
        sent.append(text)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            codes: list[int] = []

            async def tail() -> None:
                codes.append(await serve_tail(bus, "w1", send_text, {}))

            nursery.start_soon(tail)
            await trio.testing.wait_all_tasks_blocked()
            assert bus.discard_unwritten("w1")
    assert codes == [CLOSE_NORMAL]
    assert bus.get("w1") is None
    assert bus.open("w1").ended is None  # the id's next log is a new one
