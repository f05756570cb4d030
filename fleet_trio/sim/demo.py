"""``fleet-trio demo``: a whole fleet on one box, no GPU, no configuration (docs/demo.md).

One process, one ``trio.run``: the simulated rc controller, a ``fleet-trio worker`` with two
fake devices, a ``fleet-trio node`` with two example task types, the simulated fleet
dispatcher, and fake GPUs (directories, see ``fleet_trio.gpu.fake``). Jobs are real child
processes. Everything the demo needs (node and worker YAML, task scripts, a verify script)
is generated into a fresh temporary directory, so it runs from an installed wheel.

A scripted story then runs step by step; each step states the outcome it expects, observes
what actually happened (through the controller's records, the dispatcher's polls, the node's
job table or ``/proc``) and the demo exits 1 when any observation differs. Live output of
every job is followed over the real websocket tails (the node's and the worker's
``tail_listen``) and printed with the job's name in front.

Heavy imports (the node, the worker, quart) happen inside :func:`run_demo`, so registering the
subcommand costs the CLI nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import math
import os
import re
import secrets
import shlex
import shutil
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import trio

if TYPE_CHECKING:
    from fleet_trio.node.server import RunningNode
    from fleet_trio.sim.controller import SimController
    from fleet_trio.sim.dispatcher import DispatchRecord, SimDispatcher
    from fleet_trio.worker.worker import Worker

PROG = "fleet-trio demo"
HOST = "demo-box"
"""The worker's host name: its devices are ``demo-box:gpu0`` and ``demo-box:gpu1``."""
NODE_ID = "demo-node"
RUN_MARKER = "FLEET_TRIO_DEMO_RUN"
"""Set in every job's environment (node and worker): the end-of-story leftover check looks
for live processes carrying it."""
LEAK_GIB = 6.0
VERIFY_LIMIT_GIB = 1.0
EXIT_OK = 0
EXIT_MISMATCH = 1
EXIT_INTERRUPTED = 130
SHUTDOWN_BOUND = 30.0
"""Seconds the whole fleet gets to shut down at the end (node drain + worker drain)."""

# -- generated files --------------------------------------------------------------------------

COUNT_PY = r"""
import sys, time
n, delay, code, word = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
i = 0
while n == 0 or i < n:
    i += 1
    print(f"{word} {i}" + (f"/{n}" if n else ""), flush=True)
    time.sleep(delay)
if code:
    print(f"{word}: giving up with exit status {code}", file=sys.stderr, flush=True)
sys.exit(code)
"""

ESCAPE_PY = r"""
import os, subprocess, sys
child = subprocess.Popen(
    [sys.executable, "-c", "import time; time.sleep(600)"],
    start_new_session=True,
    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
)
print(f"started a helper, pid {child.pid}, in a session of its own", flush=True)
print("exiting without stopping it (it escaped the job's process group)", flush=True)
os._exit(0)
"""

LEAK_PY = r"""
import json, os, sys
path = os.path.join(os.environ["FLEET_TRIO_FAKE_GPU_DIR"], "device.json")
with open(path, encoding="utf-8") as f:
    dev = json.load(f)
dev["base_used_gib"] = float(dev.get("base_used_gib", 0)) + float(sys.argv[1])
with open(path + ".tmp", "w", encoding="utf-8") as f:
    json.dump(dev, f)
os.replace(path + ".tmp", path)
print(f"loaded {sys.argv[1]} GiB of weights onto the fake GPU", flush=True)
print("exiting without freeing them (memory the driver never gets back)", flush=True)
"""

VERIFY_PY = r"""
import json, os, re, sys
root, limit = sys.argv[1], float(sys.argv[2])
index = os.environ.get("CUDA_VISIBLE_DEVICES", "")
directory = os.path.join(root, "gpu" + index)
with open(os.path.join(directory, "device.json"), encoding="utf-8") as f:
    used = float(json.load(f).get("base_used_gib", 0))
units = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
for name in os.listdir(directory):  # one file per holding process, named after its pid
    if not (name.isdigit() and os.path.exists(f"/proc/{name}")):
        continue
    try:
        with open(os.path.join(directory, name), encoding="utf-8") as f:
            m = re.fullmatch(r"\s*([0-9.]+)\s*([KMGT]?)(?:i?B)?\s*", f.read(), re.I)
    except OSError:
        continue
    if m:
        used += float(m.group(1)) * units[m.group(2).upper()] / 2**30
if used > limit:
    print(f"fake gpu{index}: {used:.1f} GiB still in use after the job "
          f"(limit {limit:g} GiB)", file=sys.stderr)
    sys.exit(1)
"""

RENDER_PY = r"""
import json, os, sys, time
payload = json.loads(sys.stdin.read() or "{}")
steps = int(payload.get("steps", 3))
hold = payload.get("hold") or ""
holder = None
started = time.time()
device = os.environ.get("CUDA_VISIBLE_DEVICES", "")
fake_dir = os.environ.get("FLEET_TRIO_FAKE_GPU_DIR")
if fake_dir and not os.path.exists(os.path.join(fake_dir, "device.json")):
    # a multi-GPU fake: one directory per device; ours is the one the node pinned us to
    for name in sorted(os.listdir(fake_dir)):
        with open(os.path.join(fake_dir, name, "device.json"), encoding="utf-8") as f:
            if json.load(f).get("uuid") == device:
                fake_dir = os.path.join(fake_dir, name)
                break
if fake_dir and hold:
    holder = os.path.join(fake_dir, str(os.getpid()))
    with open(holder, "w", encoding="utf-8") as f:
        f.write(hold)
    where = f" on {device}" if device else ""
    print(f"render: holding {hold} of fake VRAM{where}", file=sys.stderr, flush=True)
try:
    for i in range(1, steps + 1):
        print(f"denoise step {i}/{steps}", file=sys.stderr, flush=True)
        time.sleep(0.25)
    if payload.get("fail"):
        print("render: the decoder ran out of memory (scripted failure)", file=sys.stderr,
              flush=True)
        sys.exit(2)
finally:
    if holder is not None:
        os.unlink(holder)
out = os.path.join(os.environ.get("FLEET_WORK_DIR", "."), "out.png")
print(json.dumps({"image": out, "steps": steps, "device": device,
                  "started": started, "ended": time.time()}))
"""

TRAIN_PY = r"""
import json, signal, sys, time
payload = json.loads(sys.stdin.read() or "{}")
epochs = int(payload.get("epochs", 100))

def on_term(signum, frame):
    print("train: SIGTERM received, writing a checkpoint before exiting", file=sys.stderr,
          flush=True)
    time.sleep(0.5)
    sys.exit(143)

signal.signal(signal.SIGTERM, on_term)
for i in range(1, epochs + 1):
    print(f"epoch {i}/{epochs}", file=sys.stderr, flush=True)
    time.sleep(0.25)
print(json.dumps({"epochs": epochs}))
"""


@attrs.frozen
class DemoFiles:
    """Where the generated files are (all under ``root``)."""

    root: str
    run_id: str
    token: str
    python: str

    @property
    def fake_gpus(self) -> str:
        return os.path.join(self.root, "fake-gpu")

    def fake_gpu(self, name: str) -> str:
        return os.path.join(self.fake_gpus, name)

    def script(self, name: str) -> str:
        return os.path.join(self.root, "jobs", name)

    @property
    def node_yaml(self) -> str:
        return os.path.join(self.root, "node.yaml")

    @property
    def worker_yaml(self) -> str:
        return os.path.join(self.root, "worker.yaml")

    @property
    def verify_dir(self) -> str:
        return os.path.join(self.root, "verify.d")

    @property
    def work_root(self) -> str:
        return os.path.join(self.root, "work")

    @property
    def empty_dir(self) -> str:
        """An empty directory: the worker's probe_dir, sheet_dir and nvidia-smi search path."""
        return os.path.join(self.root, "empty")


def _write(path: str, text: str, mode: int = 0o644) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(path, mode)


def write_fake_gpu(directory: str, name: str, total_gib: float = 24.0, uuid: str = "") -> None:
    """(Re)create a fake GPU with nothing in use (blocking)."""
    os.makedirs(directory, exist_ok=True)
    device: dict[str, Any] = {"name": name, "total_gib": total_gib, "base_used_gib": 0.0}
    if uuid:
        device["uuid"] = uuid
    _write(os.path.join(directory, "device.json"), json.dumps(device) + "\n")


NODE_GPUS = 2
"""The demo node is a multi-GPU node: two fake devices, one pinned GPU job on each."""


def node_yaml(files: DemoFiles) -> dict[str, Any]:
    env = {"FLEET_TRIO_FAKE_GPU_DIR": files.fake_gpu("node"), RUN_MARKER: files.run_id}
    return {
        "node": {
            "listen": "127.0.0.1:0",
            "node_id": NODE_ID,
            "sampler": "auto",
            "footprints": {"path": "footprints.json", "margin": 1.2},
            "timings": {
                "health_sample_interval": "500ms",
                "render_sample_interval": "100ms",
                "drain_timeout": "2s",
                "kill_grace": "2s",
            },
        },
        "tasks": {
            "render": {
                "family": "demo-diffusion",
                "footprint": {"family": "demo-diffusion", "quant": ""},
                "command": [files.python, files.script("render.py")],
                "env": env,
                "timeout": "30s",
                "gpu": True,
                "payload": {
                    "steps": {"type": "integer"},
                    "hold": {"type": "string"},
                    "fail": {"type": "boolean"},
                },
            },
            "train": {
                "family": "demo-trainer",
                "command": [files.python, files.script("train.py")],
                "env": env,
                "timeout": "2m",
                "payload": {"epochs": {"type": "integer", "required": True}},
            },
        },
    }


def worker_yaml(files: DemoFiles, controller_url: str) -> dict[str, Any]:
    return {
        "controller_url": controller_url,
        "token": files.token,
        "host": HOST,
        "devices": ["gpu0", "gpu1"],
        "heartbeat_interval": "1s",
        "poll_wait": "10s",
        "probe_dir": files.empty_dir,
        "probe_interval": "1h",
        "verify_dir": files.verify_dir,
        "verify_timeout": "10s",
        "sheet_dir": files.empty_dir,
        "tail_listen": "127.0.0.1:0",
    }


def _dump_yaml(path: str, data: dict[str, Any], header: str) -> None:
    import yaml

    _write(path, header + yaml.safe_dump(data, sort_keys=False, default_flow_style=False))


def prepare_files(root: str, python: str = sys.executable) -> DemoFiles:
    """Generate the task scripts, the verify script, the fake GPUs and the node YAML into
    ``root`` (blocking; before the event loop starts). The worker YAML needs the controller's
    URL and is written once it listens (:func:`write_worker_yaml`)."""
    files = DemoFiles(
        root=root, run_id=secrets.token_hex(6), token=secrets.token_hex(16), python=python
    )
    for name, text in (
        ("count.py", COUNT_PY),
        ("escape.py", ESCAPE_PY),
        ("leak.py", LEAK_PY),
        ("verify.py", VERIFY_PY),
        ("render.py", RENDER_PY),
        ("train.py", TRAIN_PY),
    ):
        _write(files.script(name), text.lstrip())
    quoted = " ".join(
        shlex.quote(a)
        for a in (python, files.script("verify.py"), files.fake_gpus, f"{VERIFY_LIMIT_GIB:g}")
    )
    _write(
        os.path.join(files.verify_dir, "10-fake-vram-free"),
        f"#!/bin/sh\n# fail when the job's fake GPU still has memory in use\nexec {quoted}\n",
        0o755,
    )
    os.makedirs(files.empty_dir, exist_ok=True)
    os.makedirs(files.work_root, exist_ok=True)
    from fleet_trio.gpu.fake import device_dirs, fake_uuid

    for i, path in enumerate(device_dirs(files.fake_gpu("node"), NODE_GPUS)):
        write_fake_gpu(path, f"Fake GPU {i} (demo node)", uuid=fake_uuid(path))
    write_fake_gpu(files.fake_gpu("gpu0"), "Fake GPU 0 (demo worker)")
    write_fake_gpu(files.fake_gpu("gpu1"), "Fake GPU 1 (demo worker)")
    _dump_yaml(
        files.node_yaml, node_yaml(files), "# fleet-trio node config, written by fleet-trio demo\n"
    )
    return files


def write_worker_yaml(files: DemoFiles, controller_url: str) -> None:
    _dump_yaml(
        files.worker_yaml,
        worker_yaml(files, controller_url),
        "# rc worker.yaml, written by fleet-trio demo\n",
    )


# -- the terminal -----------------------------------------------------------------------------

COLOURS = {
    "bold": "1",
    "dim": "2",
    "red": "31",
    "green": "32",
    "yellow": "33",
    "blue": "34",
    "magenta": "35",
    "cyan": "36",
}
TAIL_COLOURS = ("cyan", "magenta", "blue", "yellow", "green")


def want_colour(stream: Any) -> bool:
    """Colours only on a terminal (and not with ``NO_COLOR`` or ``TERM=dumb``)."""
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class Console:
    """Lines to our stdout, written in order by one task (writes go through a thread, so a
    slow terminal never blocks the event loop). ``say`` never blocks and never fails."""

    def __init__(self, fd: int, *, colour: bool) -> None:
        self.fd = fd
        self.colour = colour
        self.started = trio.current_time()
        self.broken = False
        send, recv = trio.open_memory_channel[bytes](math.inf)
        self._send = send
        self._recv = recv

    def paint(self, text: str, *styles: str) -> str:
        if not self.colour or not styles:
            return text
        codes = ";".join(COLOURS[s] for s in styles)
        return f"\x1b[{codes}m{text}\x1b[0m"

    def elapsed(self) -> float:
        return trio.current_time() - self.started

    def say(self, text: str = "") -> None:
        with contextlib.suppress(trio.ClosedResourceError, trio.BrokenResourceError):
            self._send.send_nowait((text + "\n").encode("utf-8", errors="replace"))

    def close(self) -> None:
        self._send.close()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        limiter = trio.CapacityLimiter(1)
        task_status.started()
        async with self._recv:
            async for data in self._recv:
                batch = [data]
                while True:
                    try:
                        batch.append(self._recv.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                if self.broken:
                    continue
                try:
                    await trio.to_thread.run_sync(
                        _write_all, self.fd, b"".join(batch), limiter=limiter
                    )
                except OSError:
                    self.broken = True  # our reader went away: the fleet still shuts down


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


@contextlib.asynccontextmanager
async def open_console(fd: int, *, colour: bool) -> AsyncIterator[Console]:
    """A :class:`Console` whose last line is written before this block is left."""
    con = Console(fd, colour=colour)
    async with trio.open_nursery() as nursery:
        await nursery.start(con.serve)
        try:
            yield con
        finally:
            con.close()


# -- live tails -------------------------------------------------------------------------------


TAIL_PATIENCE = 3.0
"""Seconds a live tail keeps trying to (re)connect without receiving anything."""


def ws_tail_url(base: str, job_id: str, start: int | str = "start") -> str:
    from urllib.parse import quote

    base = base.rstrip("/")
    for http, ws in (("http://", "ws://"), ("https://", "wss://")):
        if base.startswith(http):
            base = ws + base[len(http) :]
    return f"{base}/fleet/jobs/{quote(job_id, safe='')}/tail?from={start}"


@attrs.define
class Tail:
    """One job's live output as the demo follows it (and what the story looks for in it)."""

    label: str
    colour: str
    lines: list[str] = attrs.Factory(list)
    end_state: str | None = None
    problem: str | None = None
    finished: trio.Event = attrs.Factory(trio.Event)
    _changed: trio.Event = attrs.Factory(trio.Event)

    def poke(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_line(self, pattern: str, timeout: float = 15.0) -> re.Match[str] | None:  # noqa: ASYNC109
        """The first line matching ``pattern`` (a regex), waiting for it; ``None`` when the
        tail ended (or ``timeout`` passed) without one."""
        rx = re.compile(pattern)
        with trio.move_on_after(timeout):
            while True:
                for line in self.lines:
                    m = rx.search(line)
                    if m is not None:
                        return m
                if self.finished.is_set():
                    return None
                await self._changed.wait()
        return None


async def follow(
    con: Console,
    tail: Tail,
    base_url: str,
    job_id: str,
    *,
    ready: Callable[[], Awaitable[object]] | None = None,
    gone: Callable[[], bool] | None = None,
) -> None:
    """Follow ``job_id``'s tail on ``base_url`` from its first byte to its ``end``, printing
    each line as ``  label | line``.

    ``ready`` is awaited before connecting (a worker job's log exists once the worker has
    started the job; it may raise ``trio.TooSlowError``). A dropped connection is resumed
    from the last offset received, unless ``gone()`` says the server has shut down. Never
    raises: a tail that cannot be followed is reported in the output and in
    ``tail.problem``."""
    from trio_websocket import ConnectionClosed, HandshakeError, open_websocket_url

    from fleet_trio.logbus.bus import End, Output, Skipped
    from fleet_trio.logbus.tail import MSG_UNKNOWN_JOB, TailProtocolError, loads

    partial: dict[str, str] = {}
    prefix = con.paint(f"    {tail.label:<14}|", tail.colour)

    def emit(text: str, stream: str) -> None:
        tail.lines.append(text)
        shown = con.paint(text, "dim") if stream == "note" else text
        con.say(f"{prefix} {shown}")
        tail.poke()

    def feed(stream: str, data: str) -> None:
        text = partial.pop(stream, "") + data
        *complete, rest = text.split("\n")
        for line in complete:
            emit(line.rstrip("\r"), stream)
        if rest:
            partial[stream] = rest

    position: int | str = "start"
    try:
        if ready is not None:
            with contextlib.suppress(trio.TooSlowError):
                await ready()
        give_up = trio.current_time() + TAIL_PATIENCE
        while True:
            try:
                async with open_websocket_url(
                    ws_tail_url(base_url, job_id, position),
                    connect_timeout=5,
                    disconnect_timeout=2,
                ) as ws:
                    while True:
                        event = loads(await ws.get_message())
                        give_up = trio.current_time() + TAIL_PATIENCE
                        if isinstance(event, Output):
                            feed(event.stream, event.data.decode("utf-8", errors="replace"))
                            position = event.offset + len(event.data)
                        elif isinstance(event, Skipped):
                            emit(f"({event.nbytes} bytes skipped)", "note")
                            position = event.offset + event.nbytes
                        elif isinstance(event, End):
                            for stream in list(partial):
                                emit(partial.pop(stream), stream)
                            tail.end_state = event.state
                            return
                        elif event.message == MSG_UNKNOWN_JOB:
                            problem = event.message  # not opened yet: try again shortly
                            break
                        else:
                            raise TailProtocolError(event.message)
            except (HandshakeError, ConnectionClosed, OSError) as exc:
                problem = str(exc) or type(exc).__name__
                if gone is not None and gone():
                    tail.problem = "the server has shut down"
                    emit("(live tail closed: the node has shut down)", "note")
                    return
            if trio.current_time() >= give_up:
                raise TailProtocolError(problem)
            await trio.sleep(0.1)
    except TailProtocolError as exc:
        tail.problem = str(exc)
        emit(f"(live tail stopped: {exc})", "note")
    finally:
        tail.finished.set()
        tail.poke()


# -- the story --------------------------------------------------------------------------------


@attrs.define
class Step:
    """One scripted step: what is expected, what was observed."""

    name: str
    where: str
    what: str
    expected: str
    observed: str = "not run"
    ok: bool = False
    status: str = "not run"
    """``ok`` | ``MISMATCH`` | ``skipped`` | ``not run``."""
    notes: list[str] = attrs.Factory(list)


@attrs.define
class Fleet:
    """The running fleet, as the story drives it."""

    files: DemoFiles
    ctrl: SimController
    worker: Worker
    node: RunningNode
    node_done: trio.Event
    disp: SimDispatcher
    nursery: trio.Nursery

    @property
    def worker_tail(self) -> str:
        assert self.worker.tail_url is not None
        return self.worker.tail_url

    def device(self, name: str) -> str:
        return f"{HOST}:{name}"


TERMINAL_RC = ("succeeded", "failed", "killed", "lost")


@attrs.define
class RcOutcome:
    job_id: str
    state: str
    exit_code: int | None
    reason: str
    tail: Tail


class Story:
    """The scripted steps, in order. Each ``step_*`` coroutine fills in its :class:`Step`."""

    def __init__(self, con: Console, fleet: Fleet, *, keep_running: bool) -> None:
        self.con = con
        self.fleet = fleet
        self.keep_running = keep_running
        self._colour = 0
        self.steps: list[Step] = []
        self.plan: list[tuple[Step, Callable[[Step], Any]]] = []
        add = self._add
        add("render-ok", "node", "a node job that succeeds", "done", self.step_render_ok)
        add(
            "footprint",
            "node",
            "its measured VRAM peak is advertised in health",
            "demo-diffusion >= 2 GiB",
            self.step_footprint,
        )
        add(
            "two-gpus",
            "node",
            "two render jobs at once on the two-GPU node",
            "both done, on 2 devices, at once",
            self.step_two_gpus,
        )
        add(
            "render-fail",
            "node",
            "a node job that fails",
            "error, exit status 2",
            self.step_render_fail,
        )
        add(
            "train-ok",
            "worker gpu0",
            "an rc job that succeeds",
            "succeeded, exit 0",
            self.step_rc_ok,
        )
        add(
            "train-fail", "worker gpu1", "an rc job that fails", "failed, exit 3", self.step_rc_fail
        )
        add(
            "kill",
            "worker gpu0",
            "an rc job killed by `rc kill`",
            "killed: cancelled",
            self.step_kill,
        )
        add(
            "timeout",
            "worker gpu1",
            "an rc job past its max_runtime of 2 s",
            "killed: max_runtime exceeded",
            self.step_timeout,
        )
        add(
            "escape",
            "worker gpu0",
            "an rc job whose helper escapes its process group",
            "succeeded, escapee swept",
            self.step_escape,
        )
        add(
            "leak",
            "worker gpu1",
            "an rc job that leaks fake VRAM; verify fails",
            "gpu1 unhealthy (fault)",  # quarantined: the controller says unhealthy
            self.step_leak,
        )
        add(
            "clear",
            "worker gpu1",
            "free the memory, `rc clear`, run a job again",
            "gpu1 ready, job succeeded",
            self.step_clear,
        )
        add(
            "drain",
            "node",
            "node shutdown with a job in flight",
            "error: interrupted",
            self.step_drain,
        )
        add(
            "late-dispatch",
            "node",
            "a dispatch sent during that drain",
            "refused: 503 node draining",
            self.step_late_dispatch,
        )
        add(
            "no-leftovers",
            "host",
            "no process of any demo job is left",
            "none",
            self.step_leftovers,
        )
        self._drain_record: DispatchRecord | None = None
        self._late_record: DispatchRecord | None = None
        self._drain_window = False

    def _add(
        self, name: str, where: str, what: str, expected: str, fn: Callable[[Step], Any]
    ) -> None:
        step = Step(name=name, where=where, what=what, expected=expected)
        self.steps.append(step)
        self.plan.append((step, fn))

    def next_colour(self) -> str:
        self._colour += 1
        return TAIL_COLOURS[self._colour % len(TAIL_COLOURS)]

    # -- running ------------------------------------------------------------------------------

    async def run(self) -> None:
        con = self.con
        total = len(self.plan)
        for index, (step, fn) in enumerate(self.plan, 1):
            if self.keep_running and step.name in ("drain", "late-dispatch"):
                step.status, step.observed = "skipped", "skipped (--keep-running)"
                step.ok = True
                continue
            head = con.paint(f"[{con.elapsed():5.1f}s]", "dim")
            title = con.paint(f"{index:>2}/{total} {step.name}", "bold")
            con.say(f"{head} {title}  {step.what} ({step.where})")
            step.status = step.observed = "interrupted"  # unless it gets to the end
            try:
                await fn(step)
            except trio.TooSlowError:
                step.observed = "timed out" if step.observed == "interrupted" else step.observed
                step.ok = False
            except Exception as exc:  # a step that broke is a mismatch, not a crash
                step.observed = f"error: {_short(repr(exc), 60)}"
                step.ok = False
            step.status = "ok" if step.ok else "MISMATCH"
            self._report(step)

    def note(self, step: Step, text: str) -> None:
        """A line about what the step did or saw, printed now and kept on the step."""
        text = one_line(text)
        step.notes.append(text)
        self.con.say(f"      {self.con.paint(text, 'dim')}")

    def _report(self, step: Step) -> None:
        con = self.con
        if step.ok:
            verdict = con.paint("ok", "green", "bold")
            con.say(f"      -> {step.observed}  {verdict}")
        else:
            verdict = con.paint("MISMATCH", "red", "bold")
            con.say(f"      -> {step.observed}  {verdict} (expected: {step.expected})")

    # -- helpers -------------------------------------------------------------------------------

    async def rc_job(
        self,
        label: str,
        device: str,
        command: Sequence[str],
        *,
        max_runtime: int = 0,
        env: dict[str, str] | None = None,
        during: Callable[[str, Tail], Any] | None = None,
    ) -> RcOutcome:
        """Submit an rc job, follow its tail, run ``during(job_id, tail)`` alongside, and
        return the terminal report the controller accepted."""
        f = self.fleet
        full_env = {
            RUN_MARKER: f.files.run_id,
            "FLEET_TRIO_FAKE_GPU_DIR": f.files.fake_gpu(device),
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        job_id = f.ctrl.submit(
            f.device(device),
            list(command),
            env=full_env,
            max_runtime_seconds=max_runtime,
            submitter="demo@fleet-trio",
        )
        self.con.say(
            f"      {self.con.paint(f'rc run -d on {f.device(device)}: job {job_id}', 'dim')}"
        )
        tail = Tail(label, self.next_colour())
        try:
            with trio.fail_after(30):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(
                        functools.partial(
                            follow,
                            self.con,
                            tail,
                            f.worker_tail,
                            job_id,
                            ready=functools.partial(
                                f.ctrl.wait_for,
                                lambda: f.worker.bus.get(job_id) is not None,
                                timeout=20,
                            ),
                        )
                    )
                    if during is not None:
                        nursery.start_soon(during, job_id, tail)
                    await f.ctrl.wait_for(
                        lambda: any(s in TERMINAL_RC for s in f.ctrl.statuses(job_id)),
                        timeout=25,
                    )
                    with trio.move_on_after(5):
                        await tail.finished.wait()
                    nursery.cancel_scope.cancel()
        except trio.TooSlowError:
            f.ctrl.kill(job_id)  # do not leave it running into the next steps
            raise
        report = f.ctrl.status_reports(job_id)[-1]
        return RcOutcome(job_id, report.state, report.exit_code, report.reason, tail)

    def count(self, n: int, delay: float, code: int, word: str) -> list[str]:
        return [
            self.fleet.files.python,
            self.fleet.files.script("count.py"),
            str(n),
            f"{delay:g}",
            str(code),
            word,
        ]

    async def node_job(
        self,
        job_id: str,
        task_type: str,
        payload: dict[str, Any],
        *,
        family: str | None = None,
        during: Callable[[DispatchRecord, Tail], Any] | None = None,
        wait: bool = True,
    ) -> tuple[DispatchRecord, Tail]:
        f = self.fleet
        rec = await f.disp.submit(task_type, model_family=family, payload=payload, job_id=job_id)
        tail = Tail(job_id, self.next_colour())
        if rec.state == "unplaced":
            tail.finished.set()
            return rec, tail
        self.con.say("      " + self.con.paint(f"dispatched to {rec.node}: 202 accepted", "dim"))
        f.nursery.start_soon(
            functools.partial(follow, self.con, tail, f.node.url, job_id, gone=f.node_done.is_set)
        )
        if during is not None:
            await during(rec, tail)
        if wait:
            await f.disp.wait(job_id, timeout=30)
            with trio.move_on_after(5):
                await tail.finished.wait()
        return rec, tail

    # -- the steps --------------------------------------------------------------------------

    async def step_render_ok(self, step: Step) -> None:
        rec, _ = await self.node_job(
            "render-ok", "render", {"steps": 4, "hold": "2G"}, family="demo-diffusion"
        )
        step.observed = rec.state if rec.state != "error" else f"error: {rec.error}"
        step.ok = rec.state == "done"

    async def step_footprint(self, step: Step) -> None:
        f = self.fleet
        url = f.node.url.rstrip("/")

        def advertised() -> float | None:
            body = f.disp.health(url) or {}
            for entry in body.get("model_footprints") or ():
                if entry.get("model_family") == "demo-diffusion":
                    peak = entry.get("vram_peak_gb")
                    if isinstance(peak, int | float):
                        return float(peak)
            return None

        try:
            peak: float | None = await f.disp.wait_for(advertised, timeout=5)
        except trio.TooSlowError:
            peak = None
        if peak is None:
            step.observed = "no footprint advertised"
            step.ok = False
            return
        step.observed = f"demo-diffusion {peak:g} GiB"
        self.note(
            step,
            "render-ok held 2 GiB of fake VRAM; health advertises the peak x1.2, and the "
            "dispatcher now sends demo-diffusion jobs only where that much is free",
        )
        step.ok = peak >= 2.0

    async def step_two_gpus(self, step: Step) -> None:
        f = self.fleet
        payload = {"steps": 6, "hold": "1G"}
        recs: list[DispatchRecord] = []

        async def one(job_id: str) -> None:
            rec, _ = await self.node_job(job_id, "render", payload, family="demo-diffusion")
            recs.append(rec)

        async with trio.open_nursery() as nursery:
            for job_id in ("render-gpu-a", "render-gpu-b"):
                nursery.start_soon(one, job_id)
        results = [r.result for r in recs if r.state == "done" and isinstance(r.result, dict)]
        if len(results) != 2:
            states = ", ".join(f"{r.job_id}: {r.state} {r.error or ''}".strip() for r in recs)
            step.observed = f"not both done ({states})"
            step.ok = False
            return
        devices = {str(r.get("device", "")) for r in results}
        overlap = max(float(r["started"]) for r in results) < min(
            float(r["ended"]) for r in results
        )
        health = f.disp.health(f.node.url.rstrip("/")) or {}
        listed = [d.get("uuid") for d in health.get("gpu_devices") or ()]
        self.note(step, f"health lists gpu_devices {listed}")
        self.note(
            step,
            "each job ran with CUDA_VISIBLE_DEVICES set to its own device's UUID: "
            + ", ".join(sorted(devices)),
        )
        step.observed = f"both done, on {len(devices - {''})} devices" + (
            ", at once" if overlap else ", one after the other"
        )
        step.ok = len(devices - {""}) == 2 and devices <= set(listed) and overlap

    async def step_render_fail(self, step: Step) -> None:
        rec, _ = await self.node_job(
            "render-fail", "render", {"steps": 2, "fail": True}, family="demo-diffusion"
        )
        error = rec.error or ""
        step.observed = rec.state if rec.state != "error" else f"error, {_short(error)}"
        if "exit status 2" in error:
            step.observed = "error, exit status 2"
        self.note(step, f"error: {error}")
        step.ok = rec.state == "error" and "exit status 2" in error

    async def step_rc_ok(self, step: Step) -> None:
        out = await self.rc_job("train-ok", "gpu0", self.count(4, 0.2, 0, "batch"))
        step.observed = f"{out.state}, exit {out.exit_code}"
        step.ok = (out.state, out.exit_code) == ("succeeded", 0)

    async def step_rc_fail(self, step: Step) -> None:
        out = await self.rc_job("train-fail", "gpu1", self.count(2, 0.2, 3, "batch"))
        step.observed = f"{out.state}, exit {out.exit_code}"
        step.ok = (out.state, out.exit_code) == ("failed", 3)

    async def step_kill(self, step: Step) -> None:
        ctrl = self.fleet.ctrl

        async def kill_after_output(job_id: str, tail: Tail) -> None:
            if await tail.wait_line(r"^tick 3") is not None:
                self.note(step, "rc kill after the third line of output")
            else:
                self.note(step, "rc kill (the third line of output did not show up)")
            ctrl.kill(job_id)

        out = await self.rc_job(
            "kill", "gpu0", self.count(0, 0.2, 0, "tick"), during=kill_after_output
        )
        step.observed = f"{out.state}: {out.reason}" if out.reason else out.state
        step.ok = out.state == "killed" and out.reason == "cancelled"

    async def step_timeout(self, step: Step) -> None:
        out = await self.rc_job("timeout", "gpu1", self.count(0, 0.3, 0, "tick"), max_runtime=2)
        step.observed = f"{out.state}: {out.reason}" if out.reason else out.state
        step.ok = out.state == "killed" and out.reason.startswith("max_runtime exceeded")

    async def step_escape(self, step: Step) -> None:
        from fleet_trio.proc.procfs import pid_alive

        files = self.fleet.files
        out = await self.rc_job("escape", "gpu0", [files.python, files.script("escape.py")])
        m = None
        for line in out.tail.lines:
            m = re.search(r"pid (\d+)", line)
            if m is not None:
                break
        if m is None:
            step.observed = f"{out.state}; escapee pid not seen in the output"
            step.ok = False
            return
        pid = int(m.group(1))
        gone = not pid_alive(pid)
        if gone:
            self.note(
                step, f"pid {pid} was gone when the job's report arrived (the RC_JOB_ID sweep)"
            )
        else:
            self.note(step, f"pid {pid} was still alive when the job's report arrived")
        step.observed = f"{out.state}, escapee " + ("swept" if gone else "still alive")
        step.ok = out.state == "succeeded" and gone

    async def step_leak(self, step: Step) -> None:
        f = self.fleet
        files = f.files
        device = f.device("gpu1")
        out = await self.rc_job(
            "leak", "gpu1", [files.python, files.script("leak.py"), f"{LEAK_GIB:g}"]
        )
        dev = f.ctrl.device(device)
        faults = f.ctrl.faults(device)
        if faults:
            self.note(step, f"fault: {faults[-1]}")
        self.note(step, f"the job itself ended {out.state} (exit {out.exit_code})")
        step.observed = f"gpu1 {dev.state}" + (f" ({dev.reason})" if dev.reason else "")
        step.ok = (
            out.state == "succeeded"
            and dev.state == "unhealthy"
            and dev.reason == "fault"
            and any(r.startswith("verify failed: ") for r in faults)
        )

    async def step_clear(self, step: Step) -> None:
        f = self.fleet
        device = f.device("gpu1")
        await trio.to_thread.run_sync(
            write_fake_gpu, f.files.fake_gpu("gpu1"), "Fake GPU 1 (demo worker)"
        )
        self.note(step, "operator freed the leaked memory, then ran `rc clear demo-box:gpu1`")
        try:
            f.ctrl.clear(device)
        except Exception as exc:  # SimError: the device was not clearable
            step.observed = f"rc clear refused: {exc}"
            step.ok = False
            return
        cleared = f.ctrl.device(device).state
        out = await self.rc_job("after-clear", "gpu1", self.count(2, 0.2, 0, "batch"))
        dev = f.ctrl.device(device)
        step.observed = f"gpu1 {dev.state}, job {out.state}"
        step.ok = cleared == "ready" and dev.state == "ready" and out.state == "succeeded"

    async def step_drain(self, step: Step) -> None:
        f = self.fleet

        async def drain_when_running(rec: DispatchRecord, tail: Tail) -> None:
            await tail.wait_line(r"^epoch 4/")
            self.note(
                step, "node shutdown requested while the job runs (drain_timeout 2s, kill_grace 2s)"
            )
            self._drain_window = True
            f.node.request_shutdown("fleet-trio demo: node drain")

        rec, tail = await self.node_job(
            "train-drain",
            "train",
            {"epochs": 400},
            family="demo-trainer",
            during=drain_when_running,
            wait=False,
        )
        self._drain_record = rec
        # the late dispatch belongs to the drain window: it runs right away, reported next
        self._late_record = await f.disp.submit(
            "render", model_family="demo-diffusion", payload={"steps": 1}, job_id="render-late"
        )
        with trio.fail_after(20):
            await f.node_done.wait()
        with trio.move_on_after(3):
            await tail.finished.wait()
        view = f.node.store.get("train-drain")
        table = "gone" if view is None else view.state.value
        if view is not None and view.error:
            table += f": {view.error}"
        seen = " -> ".join(rec.states_seen) or "nothing"
        if rec.terminal:
            self.note(step, f"dispatcher polls saw: {seen}; its record: {rec.state}: {rec.error}")
        else:
            self.note(
                step,
                f"dispatcher polls saw: {seen}; the node was gone before a poll could see "
                "the final state (the node's own table shows it)",
            )
        self.note(step, f"node's job table after exit: {table}")
        step.observed = table
        step.ok = view is not None and view.state.value == "error" and view.error == "interrupted"
        if rec.terminal and rec.error != "interrupted":
            step.ok = False
            step.observed += f" (dispatcher saw {rec.state}: {rec.error})"

    async def step_late_dispatch(self, step: Step) -> None:
        rec = self._late_record
        if rec is None:
            step.observed = "not dispatched (the drain step did not run)"
            step.ok = False
            return
        refusals = [(status, reason) for _node, status, reason in rec.attempts]
        self.note(step, f"dispatcher record: {rec.error or rec.state}")
        step.observed = (
            f"refused: {refusals[0][0]} {refusals[0][1]}" if refusals else f"{rec.state}"
        )
        step.ok = rec.state == "unplaced" and (503, "node draining") in refusals

    async def step_leftovers(self, step: Step) -> None:
        pids = await trio.to_thread.run_sync(marked_processes, self.fleet.files.run_id)
        step.observed = "none" if not pids else f"{len(pids)} left: {pids}"
        step.ok = not pids


def one_line(text: str, width: int = 200) -> str:
    """``text`` on one line (line breaks shown as `` / ``), cut at ``width`` characters."""
    text = " / ".join(part.strip() for part in text.strip().splitlines() if part.strip())
    return text if len(text) <= width else text[: width - 3] + "..."


def _short(text: str, width: int = 40) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def marked_processes(run_id: str) -> list[int]:
    """Live processes whose environment carries this run's marker (blocking: walks /proc)."""
    from fleet_trio.proc.procfs import list_pids, pid_alive, read_proc_file

    needle = f"{RUN_MARKER}={run_id}".encode()
    found = []
    for pid in list_pids() or []:
        if pid == os.getpid():
            continue
        try:
            env = read_proc_file(f"/proc/{pid}/environ")
        except OSError:
            continue
        if needle in env.split(b"\0") and pid_alive(pid):
            found.append(pid)
    return found


def story_status(steps: Sequence[Step]) -> int:
    """0 when every step went as expected (or was skipped), else 1."""
    bad = [s for s in steps if s.status not in ("ok", "skipped")]
    return EXIT_MISMATCH if bad else EXIT_OK


def summary(con: Console, steps: Sequence[Step]) -> list[str]:
    """The final table, one line per step (the lines are returned too, uncoloured)."""
    head = ("#", "step", "where", "expected", "observed", "")
    rows = [
        (str(i), s.name, s.where, _short(s.expected), _short(s.observed), s.status)
        for i, s in enumerate(steps, 1)
    ]
    widths = [max(len(r[c]) for r in [head, *rows]) for c in range(5)]

    def fmt(row: tuple[str, ...]) -> str:
        cells = [row[0].rjust(widths[0])] + [row[c].ljust(widths[c]) for c in range(1, 5)]
        return "  ".join(cells) + "  " + row[5]

    lines = [fmt(head).rstrip()]
    con.say("")
    con.say(con.paint(lines[0], "bold"))
    for row in rows:
        line = fmt(row)
        lines.append(line)
        status = row[5]
        style = "green" if status == "ok" else "yellow" if status == "skipped" else "red"
        con.say(line[: -len(status)] + con.paint(status, style, "bold"))
    return lines


# -- the fleet --------------------------------------------------------------------------------


@attrs.frozen
class DemoOptions:
    keep_running: bool = False
    no_story: bool = False
    verbose: bool = False


async def _run_node(
    files: DemoFiles,
    done: trio.Event,
    *,
    task_status: trio.TaskStatus[RunningNode] = trio.TASK_STATUS_IGNORED,
) -> None:
    from fleet_trio.node.config import load_config
    from fleet_trio.node.server import NodeOptions, serve_node

    try:
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
    finally:
        done.set()


async def _run_worker(
    worker: Worker,
    done: trio.Event,
    *,
    task_status: trio.TaskStatus[Worker] = trio.TASK_STATUS_IGNORED,
) -> None:
    from fleet_trio.worker.worker import serve_worker

    try:
        await serve_worker(worker, task_status=task_status)
    finally:
        done.set()


def _make_worker(files: DemoFiles) -> Worker:
    from fleet_trio.worker.client import Timings
    from fleet_trio.worker.config import load_worker_config
    from fleet_trio.worker.hooks import HostHooks
    from fleet_trio.worker.probes import Prober
    from fleet_trio.worker.worker import Worker, WorkerTimings

    config = load_worker_config(files.worker_yaml)
    return Worker(
        config,
        timings=WorkerTimings(
            idle_poll_floor=0.05,
            poll_error_delay=0.5,
            shutdown_drain=5.0,
            kill_grace=2.0,
            hurry_budget=2.0,
            register_backoff=(0.2, 0.5, 1.0),
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
            node: RunningNode = await infra.start(_run_node, files, node_done)
            con.say(
                f"  node {NODE_ID:<22} {node.url}  tasks: render, train "
                f"({NODE_GPUS} fake GPUs, 24 GiB each)"
            )

            worker = await trio.to_thread.run_sync(_make_worker, files)
            worker_done = trio.Event()
            await infra.start(_run_worker, worker, worker_done)
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
                    con.say(
                        con.paint(
                            f"{len(failed)} step(s) did not go as expected: {', '.join(failed)}",
                            "red",
                            "bold",
                        )
                    )
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


# -- the command ------------------------------------------------------------------------------

DESCRIPTION = (
    "Start a whole fleet in this one process, with no GPU and no configuration: the "
    "simulated rc controller, a fleet-trio worker with two fake devices "
    f"({HOST}:gpu0, {HOST}:gpu1) and its live tail listener, a fleet-trio node with two "
    "example task types (render, train) on a fake GPU, and the simulated fleet dispatcher. "
    "Then run a short scripted story with real child processes: node jobs that succeed and "
    "fail, the node's measured VRAM footprint, rc jobs that succeed, fail, get killed, time "
    "out, and escape their process group (swept), a verify failure that quarantines a "
    "device and an `rc clear` that returns it, and a node drain with a job in flight that "
    "ends 'interrupted'. Every job's live output is shown, prefixed with its name. Each step "
    "checks its outcome; the final table marks any step that did not go as expected. Takes "
    "about 20 seconds. Exit status: 0 when every step went as expected, 1 otherwise, 130 "
    "when interrupted. Configs and scripts are generated into a temporary directory, removed "
    "at exit."
)


def add_parser(sub: Any) -> None:
    """Register ``fleet-trio demo`` on the CLI's subparsers."""
    p = sub.add_parser(
        "demo",
        help="a whole fleet on one box: controller, worker, node, dispatcher, real jobs",
        description=DESCRIPTION,
        epilog="See docs/demo.md.",
    )
    p.add_argument(
        "--keep-running",
        action="store_true",
        help="after the story, leave the fleet up (the node drain step is skipped so the "
        "node stays up), print the URLs of the node's and the worker's browser tail pages "
        "(/fleet/ui) and wait for Ctrl-C, which shuts everything down cleanly (exit 0)",
    )
    p.add_argument(
        "--no-story",
        action="store_true",
        help="start the fleet but run no story (with --keep-running: a fleet to try "
        "commands against)",
    )
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="also show the components' own log lines on stderr (hidden by default, "
        "because the demo narrates what happens; an explicit --log-level shows them too)",
    )
    p.set_defaults(handler=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    options = DemoOptions(
        keep_running=bool(args.keep_running),
        no_story=bool(args.no_story),
        verbose=bool(args.verbose)
        or getattr(args, "log_level", None) is not None
        or bool(os.environ.get("FLEET_TRIO_LOG_LEVEL")),
    )
    return main(options)


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


__all__ = [
    "DemoFiles",
    "DemoOptions",
    "Step",
    "Story",
    "add_parser",
    "cmd_demo",
    "main",
    "marked_processes",
    "prepare_files",
    "run_demo",
]
