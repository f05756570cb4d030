"""Starting the fleet, running the story, shutting the fleet down (:func:`main`).

Heavy imports (the node, the worker, quart) happen inside the functions, so importing the
command's parser costs the CLI nothing."""

from __future__ import annotations

import contextlib
import functools
import logging
import shutil
import signal
import sys
import tempfile
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import attrs
import trio

from fleet_trio.sim.demo.console import Console, open_console, want_colour
from fleet_trio.sim.demo.files import DemoFiles, prepare_files, write_worker_yaml
from fleet_trio.sim.demo.model import (
    EXIT_INTERRUPTED,
    EXIT_MISMATCH,
    EXIT_OK,
    HOST,
    NODE_GPUS,
    NODE_ID,
    PROG,
    SHUTDOWN_BOUND,
    DemoOptions,
    Fleet,
)
from fleet_trio.sim.demo.report import marked_processes, story_status, summary
from fleet_trio.sim.demo.story import Story

if TYPE_CHECKING:
    from fleet_trio.node.server import RunningNode
    from fleet_trio.worker.worker import Worker


async def _until_done(
    serve: Callable[..., Awaitable[object]],
    done: trio.Event,
    *,
    task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED,
) -> None:
    """``serve(task_status=...)``; ``done`` is set once it has returned or failed."""
    try:
        await serve(task_status=task_status)
    finally:
        done.set()


async def _serve_node(
    files: DemoFiles, *, task_status: trio.TaskStatus[RunningNode] = trio.TASK_STATUS_IGNORED
) -> None:
    from fleet_trio.node.config import load_config
    from fleet_trio.node.server import NodeOptions, serve_node

    config = await trio.to_thread.run_sync(load_config, files.node_yaml)
    options = NodeOptions(gpu="fake", fake_gpu_dir=files.fake_gpu("node"), fake_gpus=NODE_GPUS)
    await serve_node(
        config,
        options,
        signals=(),
        announce=lambda line: None,
        work_root=files.work_root,
        task_status=task_status,
    )


def _make_worker(files: DemoFiles) -> Worker:
    from fleet_trio.sim.harness import TEST_WORKER_TIMINGS
    from fleet_trio.worker.client import Timings
    from fleet_trio.worker.config import load_worker_config
    from fleet_trio.worker.hooks import HostHooks
    from fleet_trio.worker.probes import Prober
    from fleet_trio.worker.worker import Worker

    config = load_worker_config(files.worker_yaml)
    return Worker(
        config,
        timings=attrs.evolve(  # the harness's quick lifecycle, the reference's re-registration
            TEST_WORKER_TIMINGS,
            poll_error_delay=0.5,
            register_backoff=(0.2, 0.5, 1.0),
            reregister_jitter=30.0,
            reregister_pacing=60.0,
        ),
        client_timings=Timings(report_backoff=(0.1, 0.2, 0.4), log_flush_delay=0.2),
        hooks=HostHooks(config, grace=1.0),
        prober=Prober(config, pass_budget=5.0, path=files.empty_dir),
    )


async def _signals(con: Console, interrupt: Callable[[], None], hard: trio.CancelScope) -> None:
    """First SIGINT/SIGTERM: stop the story and shut the fleet down cleanly; a second one:
    stop waiting for that."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        count = 0
        async for signum in signals:
            count += 1
            name = signal.Signals(signum).name
            if count == 1:
                con.say(con.paint(f"\n{name}: shutting the fleet down", "yellow"))
                interrupt()
            else:
                con.say(con.paint(f"{name} again: not waiting any longer", "yellow"))
                hard.cancel()


async def run_demo(options: DemoOptions, files: DemoFiles, con: Console) -> int:
    """Start the fleet, run the story, print the summary; returns the exit status."""
    from fleet_trio.sim.controller import SimController, serve_controller
    from fleet_trio.sim.dispatcher import SimDispatcher, serve_dispatcher
    from fleet_trio.worker.worker import serve_worker

    con.say(con.paint("fleet-trio demo: a whole fleet on one box (no GPU, no config)", "bold"))
    con.say(con.paint(f"  generated files: {files.root}", "dim"))
    interrupted = False
    cut_short = False
    story: Story | None = None
    story_scope = trio.CancelScope()
    keep_scope = trio.CancelScope()
    status = EXIT_OK
    with trio.CancelScope() as hard:

        def interrupt() -> None:
            nonlocal interrupted
            interrupted = True
            story_scope.cancel()
            keep_scope.cancel()

        async with trio.open_nursery() as infra:
            infra.start_soon(_signals, con, interrupt, hard)
            ctrl = SimController(
                token=files.token,
                tokens={f"client-{files.token}": "client"},  # sim submit (--keep-running)
                reaper_interval=1.0,
                startup_grace=0.0,
            )
            ctrl_url = await infra.start(serve_controller, ctrl)
            await trio.to_thread.run_sync(write_worker_yaml, files, ctrl_url)
            con.say(f"  rc controller (simulated)   {ctrl_url}")

            node_done = trio.Event()
            serve = functools.partial(_serve_node, files)
            node: RunningNode = await infra.start(_until_done, serve, node_done)
            con.say(
                f"  node {NODE_ID:<22} {node.url}  tasks: render, train "
                f"({NODE_GPUS} fake GPUs, 24 GiB each)"
            )

            worker = await trio.to_thread.run_sync(_make_worker, files)
            worker_done = trio.Event()
            await infra.start(_until_done, functools.partial(serve_worker, worker), worker_done)
            con.say(
                f"  worker {HOST:<20} devices {HOST}:gpu0, {HOST}:gpu1; live tail {worker.tail_url}"
            )

            disp = SimDispatcher([node.url], health_interval=0.5, poll_interval=0.2)
            await infra.start(serve_dispatcher, disp)
            con.say("  dispatcher (simulated)      1 node; health every 0.5 s, polls every 0.2 s")
            con.say("")
            fleet = Fleet(files, ctrl, worker, node, node_done, disp, infra)
            story = Story(con, fleet, keep_running=options.keep_running)

            with story_scope:
                if not options.no_story:
                    await story.run()
            cut_short = interrupted
            if not options.no_story and not cut_short:
                summary(con, story.steps)
                status = story_status(story.steps)
                failed = [s.name for s in story.steps if s.status not in ("ok", "skipped")]
                if failed:
                    text = f"{len(failed)} step(s) did not go as expected: {', '.join(failed)}"
                    con.say(con.paint(text, "red", "bold"))
                else:
                    con.say(con.paint("every step went as expected", "green", "bold"))

            if options.keep_running and not interrupted:
                await _keep_running(con, fleet, keep_scope)

            await _shutdown(con, fleet, worker_done)
            infra.cancel_scope.cancel()
        if cut_short:
            status = EXIT_INTERRUPTED
            if story is not None and not options.no_story:
                summary(con, story.steps)
            left = await trio.to_thread.run_sync(marked_processes, files.run_id)
            con.say(f"leftover job processes after the shutdown: {left or 'none'}")
    if hard.cancelled_caught:
        return EXIT_INTERRUPTED
    return status


async def _keep_running(con: Console, fleet: Fleet, scope: trio.CancelScope) -> None:
    node_url = fleet.node.url.rstrip("/")
    con.say("")
    con.say(con.paint("the fleet stays up (--keep-running); Ctrl-C shuts it down", "bold"))
    con.say(f"  node tail page:    {node_url}/fleet/ui")
    con.say(f"  worker tail page:  {fleet.worker_tail.rstrip('/')}/fleet/ui")
    con.say(f"  try:  curl -s {node_url}/fleet/health")
    con.say(
        f"        curl -s -XPOST {node_url}/fleet/dispatch -H 'Content-Type: application/json'"
        ' -d \'{"job_id":"j1","task_type":"render","payload":{"steps":8}}\''
    )
    con.say(f"        fleet-trio tail --url {node_url} j1")
    ctrl = fleet.ctrl
    client = next((t for t, role in ctrl.tokens.items() if role == "client"), "")
    worker = next((t for t, role in ctrl.tokens.items() if role == "worker"), "")
    con.say(f"  rc controller:     {ctrl.base_url} (worker token {worker}, client token {client})")
    con.say(
        f"  try:  fleet-trio sim submit --url {ctrl.base_url} --token {client} "
        "-- sh -c 'echo hi from $RC_DEVICE'"
    )
    with scope:
        await trio.sleep_forever()


async def _shutdown(con: Console, fleet: Fleet, worker_done: trio.Event) -> None:
    """Node first (drain), then the worker (drain), bounded; the controller and the
    dispatcher are cancelled by the caller."""
    con.say(con.paint(f"[{con.elapsed():5.1f}s] shutting down", "dim"))
    with trio.move_on_after(SHUTDOWN_BOUND) as bound:
        if not fleet.node_done.is_set():
            fleet.node.request_shutdown("fleet-trio demo: over")
        fleet.worker.request_shutdown("fleet-trio demo: over")
        await fleet.node_done.wait()
        await worker_done.wait()
    if bound.cancelled_caught:
        con.say(con.paint("shutdown took too long; cancelling", "red"))
    else:
        con.say(con.paint(f"[{con.elapsed():5.1f}s] fleet stopped", "dim"))


def main(options: DemoOptions, *, stdout: Any = None) -> int:
    """Run the demo (blocking); returns the exit status."""
    out = stdout if stdout is not None else sys.stdout
    with contextlib.suppress(Exception):
        out.flush()
    root = tempfile.mkdtemp(prefix="fleet-trio-demo-")
    quiet = logging.getLogger("fleet_trio")
    level = quiet.level
    if not options.verbose:
        quiet.setLevel(logging.CRITICAL)
    try:
        files = prepare_files(root)

        async def body() -> int:
            async with open_console(out.fileno(), colour=want_colour(out)) as con:
                return await run_demo(options, files, con)

        return trio.run(body)
    except KeyboardInterrupt:  # before the signal handler was in place
        return EXIT_INTERRUPTED
    except Exception as exc:
        import traceback

        traceback.print_exc()
        print(f"{PROG}: failed: {exc}", file=sys.stderr, flush=True)
        return EXIT_MISMATCH
    finally:
        quiet.setLevel(level)
        shutil.rmtree(root, ignore_errors=True)
