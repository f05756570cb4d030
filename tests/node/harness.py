"""Node test harnesses.

* A node started in-process on 127.0.0.1 (port 0) with a fake GPU, and an httpx client
  (:func:`running_node`, :class:`Harness`, :class:`FakeSampler`, :class:`FakeFootprints`).
* A node context over a given job store with a runner that answers ``{}`` (:func:`make_ctx`).
* A node with one ``colour`` task printing ANSI-coloured lines (:func:`colour_config`,
  :func:`colour_dispatch`), for the browser page tests.
* A real ``fleet-trio node`` process with the job journal on, to kill and restart
  (:class:`Node`; its ``sleeper`` task records its pid under ``pids/``).
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from fleet_trio.gpu.fake import init_device
from fleet_trio.node.app import NodeContext
from fleet_trio.node.config import NodeConfig, config_from_mapping, load_config
from fleet_trio.node.jobs import Done, JobStore
from fleet_trio.node.server import GpuServices, NodeOptions, RunningNode, serve_node
from fleet_trio.node.tasks import TaskRegistry
from fleet_trio.sim.fleet import free_port
from tests.helpers import LINES_SCRIPT, healthy, wait_until
from tests.node.conftest import PY, TASK_SCRIPT

REPO = Path(__file__).resolve().parents[2]
REFERENCE_YAML = REPO / "examples" / "node-reference.yaml"


@attrs.define
class FakeSnapshot:
    total_gb: float
    used_gb: float
    free_gb: float
    taken_at: float
    wall_time: float = 0.0


class FakeSampler:
    """Quacks like ``GlobalSampler``: ``serve`` publishes ``initial`` (if any) at start."""

    def __init__(self, total: float | None = 16.0, used: float = 3.5) -> None:
        self.total = total
        self.used = used
        self.snap: FakeSnapshot | None = None
        self.max_age = 30.0

    def publish(self, total: float, used: float, *, age: float = 0.0) -> None:
        now = trio.current_time()
        self.snap = FakeSnapshot(total, used, total - used, now - age)

    def status(self, now: float) -> tuple[FakeSnapshot | None, str | None]:
        if self.snap is None:
            return None, "no vram snapshot yet"
        if now - self.snap.taken_at > self.max_age:
            return None, "vram snapshot stale"
        return self.snap, None

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        if self.total is not None:
            self.publish(self.total, self.used)
        task_status.started()
        await trio.sleep_forever()


@attrs.define
class FakeEntry:
    wire: dict[str, Any]

    def to_wire(self) -> dict[str, Any]:
        return dict(self.wire)


class FakeFootprints:
    def __init__(self, entries: Sequence[dict[str, Any]] = ()) -> None:
        self._entries = [FakeEntry(dict(e)) for e in entries]
        self.reloads = 0

    async def reload_if_changed(self) -> bool:
        self.reloads += 1
        await trio.lowlevel.checkpoint()
        return False

    def entries(self) -> list[FakeEntry]:
        return list(self._entries)


def echo_task(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    """A task running the test script (see conftest.TASK_SCRIPT); counts runs per job id."""
    script = tmp_path / "task.py"
    script.write_text(
        TASK_SCRIPT + "\n"  # the counter is written at the end only for successful runs, so:
    )
    counter = tmp_path / "runs"
    counter.mkdir(exist_ok=True)
    env = {"RUNS_DIR": str(counter), **extra.pop("env", {})}
    return {
        "command": [PY, "-c", _COUNTING_PRELUDE, str(script), "{work_dir}"],
        "env": env,
        **extra,
    }


_COUNTING_PRELUDE = (
    "import os, runpy, sys; "
    "d = os.environ['RUNS_DIR']; j = os.environ['FLEET_JOB_ID'].replace('/', '_'); "
    "open(os.path.join(d, j), 'a').write('x'); "
    "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


def runs(tmp_path: Path, job_id: str) -> int:
    path = tmp_path / "runs" / job_id.replace("/", "_")
    return len(path.read_text()) if path.exists() else 0


def reference_config(tmp_path: Path, only: Sequence[str] | None = None) -> NodeConfig:
    """The five reference tasks with their commands replaced by the echo task."""
    ref = load_config(REFERENCE_YAML)
    tasks = {}
    for task in ref.tasks:
        if only is not None and task.name not in only:
            continue
        tasks[task.name] = {
            **echo_task(tmp_path),
            "family": task.family,
            "payload": {
                k: {
                    "type": v.type,
                    "required": v.required,
                    "non_empty": v.non_empty,
                    "hint": v.hint,
                }
                for k, v in task.payload.items()
            },
            "materialize": dict(task.materialize),
        }
    return node_config(tmp_path, tasks)


def node_config(tmp_path: Path, tasks: dict[str, Any], **node: Any) -> NodeConfig:
    timings = {
        "drain_timeout": "2s",
        "kill_grace": "500ms",
        "poll_linger": "1s",
        **node.pop("timings", {}),
    }
    journal = {"path": str(tmp_path / "journal.sqlite"), **node.pop("journal", {})}
    raw = {
        "node": {"listen": "127.0.0.1:0", "timings": timings, "journal": journal, **node},
        "tasks": tasks,
    }
    return config_from_mapping(raw, path=str(tmp_path / "node.yaml"), base_dir=str(tmp_path))


@attrs.define
class Harness:
    node: RunningNode
    client: httpx.AsyncClient
    sampler: FakeSampler
    footprints: FakeFootprints
    tmp_path: Path

    async def dispatch(
        self, job_id: str, task_type: str, payload: Any = None, **extra: Any
    ) -> httpx.Response:
        body: dict[str, Any] = {"job_id": job_id, "task_type": task_type, **extra}
        if payload is not None:
            body["payload"] = payload
        return await self.client.post("/fleet/dispatch", content=json.dumps(body).encode())

    async def state_is(self, job_id: str, state: str) -> bool:
        """The job's polled state is ``state`` (a predicate for ``wait_until``)."""
        return bool((await self.poll(job_id)).json().get("state") == state)

    async def poll(self, job_id: str) -> httpx.Response:
        return await self.client.get(f"/fleet/jobs/{job_id}")

    async def wait_terminal(self, job_id: str, within: float = 10.0) -> dict[str, Any]:
        async def terminal() -> dict[str, Any] | None:
            body: dict[str, Any] = (await self.poll(job_id)).json()
            return body if body.get("state") in ("done", "error") else None

        return await wait_until(terminal, timeout=within, interval=0.02, what=f"{job_id} terminal")


@asynccontextmanager
async def running_node(
    tmp_path: Path,
    config: NodeConfig,
    *,
    node_id: str = "node-a",
    arch: str = "blackwell",
    sampler: FakeSampler | None = None,
    footprints: FakeFootprints | None = None,
    signals: Sequence[signal.Signals] = (),
    token: str | None = None,
) -> AsyncIterator[Harness]:
    sampler = sampler if sampler is not None else FakeSampler()
    footprints = footprints if footprints is not None else FakeFootprints()
    gpu = GpuServices(sampler=sampler, footprints=footprints, arch=arch)
    work_root = tmp_path / "work"
    work_root.mkdir(exist_ok=True)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            start = functools.partial(
                serve_node,
                config,
                NodeOptions(node_id=node_id, token=token),
                gpu=gpu,
                signals=signals,
                work_root=str(work_root),
                announce=lambda line: None,
            )
            node: RunningNode = await nursery.start(start)
            async with httpx.AsyncClient(base_url=node.url, timeout=10) as client:
                yield Harness(node, client, sampler, footprints, tmp_path)
            node.request_shutdown("test over")


def work_dirs(tmp_path: Path) -> list[str]:
    root = tmp_path / "work"
    return sorted(os.listdir(root)) if root.exists() else []


def make_ctx(tmp_path: Path, store: JobStore) -> NodeContext:
    cfg = config_from_mapping({"tasks": {"t": {"command": ["true"]}}})
    sampler = FakeSampler()
    sampler.publish(16, 1)
    return NodeContext(
        node_id="n",
        gpu_arch="nvidia",
        registry=TaskRegistry(cfg.tasks, work_root=str(tmp_path)),
        store=store,
        runner=_Runner(),  # type: ignore[arg-type]
        sampler=sampler,  # type: ignore[arg-type]
    )


class _Runner:
    bus = None
    metrics = None

    def __init__(self) -> None:
        self.runs: list[str] = []

    async def execute(self, job: Any) -> Done:
        self.runs.append(job.job_id)
        job.cleanup()
        return Done(b"{}")

    def reserve(self, job: Any) -> None:
        """No GPU placement here."""

    def discard(self, job: Any) -> None:
        job.cleanup()


SLEEPER = (
    "import os, sys, time; sys.stdin.read(); "
    "open(os.path.join(os.environ['PIDS'], os.environ['FLEET_JOB_ID']), 'w')"
    ".write(str(os.getpid())); time.sleep(120)"
)


QUICK = "import sys; sys.stdin.read(); print('{\"v\": 7}')"


def _config(tmp_path: Path) -> Path:
    pids = tmp_path / "pids"
    pids.mkdir(exist_ok=True)
    cfg = tmp_path / "node.yaml"
    raw = {
        "node": {"timings": {"drain_timeout": "500ms", "kill_grace": "500ms"}},
        "tasks": {
            "sleeper": {"command": [sys.executable, "-c", SLEEPER], "env": {"PIDS": str(pids)}},
            "quick": {"command": [sys.executable, "-c", QUICK]},
        },
    }
    cfg.write_text(json.dumps(raw))  # JSON is YAML
    return cfg


class Node:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        gpu_dir = tmp_path / "gpu"
        init_device(str(gpu_dir))
        self.port = free_port()
        self.work = tmp_path / "work"
        self.work.mkdir(exist_ok=True)
        self.argv = [
            sys.executable, "-m", "fleet_trio", "node", "-c", str(_config(tmp_path)),
            "--gpu", "fake", "--fake-gpu-dir", str(gpu_dir),
            "--listen", f"127.0.0.1:{self.port}", "--footprints", str(tmp_path / "fp.json"),
        ]  # fmt: skip
        self.proc: trio.Process | None = None
        self.log: Path | None = None
        """When set, each start appends the node's stderr (its log) to this file."""

    async def start(self) -> None:
        env = {**os.environ, "TMPDIR": str(self.work)}
        if self.log is None:
            self.proc = await trio.lowlevel.open_process(self.argv, env=env)
        else:
            with self.log.open("ab") as stderr:
                self.proc = await trio.lowlevel.open_process(self.argv, env=env, stderr=stderr)
        async with httpx.AsyncClient(base_url=self.url) as client:
            proc = self.proc

            async def up() -> bool:
                assert proc.returncode is None, "the node exited at start"
                return await healthy(client)

            await wait_until(up, what="the node's health answering 200")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()

    async def close(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


# Each line the task prints (LINES_SCRIPT's format): colours, and markup that must stay text.
COLOUR_LINE = "\x1b[31mred {i}\x1b[0m plain \x1b[1;32mbold green {i}\x1b[0m <b>&amp;\n"


def colour_config(tmp_path: Path) -> Any:
    """A node whose one task ``colour`` prints ``COLOUR_LINE`` (payload: ``lines``, ``pause``,
    ``exit``)."""
    return node_config(tmp_path, {"colour": {"command": [PY, "-c", LINES_SCRIPT, COLOUR_LINE]}})


async def colour_dispatch(
    h: Harness, job_id: str, headers: dict[str, str] | None = None, **p: Any
) -> None:
    body = json.dumps({"job_id": job_id, "task_type": "colour", "payload": p}).encode()
    r = await h.client.post("/fleet/dispatch", content=body, headers=headers or {})
    assert r.status_code == 202, r.text
