"""The files the demo generates into its temporary directory: the job scripts (shipped as
package data in ``jobs/``), the verify hook, the fake GPUs, the node and worker YAML."""

from __future__ import annotations

import os
import secrets
import shlex
import sys
from importlib import resources
from typing import Any

import attrs

from fleet_trio.sim.demo.model import HOST, NODE_GPUS, NODE_ID, RUN_MARKER, VERIFY_LIMIT_GIB

JOB_SCRIPTS = ("count.py", "escape.py", "leak.py", "verify.py", "render.py", "train.py")
"""The files of ``fleet_trio/sim/demo/jobs/``, copied into the run's ``jobs/``."""
GPU_GIB = 24.0
"""Every fake GPU of the demo; (re)writing one clears its base use (the leak step's)."""


class _Under:
    """A fixed name under the owner's ``root``, read as an attribute."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, files: DemoFiles, owner: type | None = None) -> str:
        return os.path.join(files.root, self.name)


@attrs.frozen
class DemoFiles:
    """Where the generated files are (all under ``root``)."""

    root: str
    run_id: str
    token: str
    python: str

    fake_gpus = _Under("fake-gpu")

    def fake_gpu(self, name: str) -> str:
        return os.path.join(self.fake_gpus, name)

    def script(self, name: str) -> str:
        return os.path.join(self.root, "jobs", name)

    node_yaml = _Under("node.yaml")
    worker_yaml = _Under("worker.yaml")
    verify_dir = _Under("verify.d")
    work_root = _Under("work")
    empty_dir = _Under("empty")
    """An empty directory: the worker's probe_dir, sheet_dir and nvidia-smi search path."""


def _write(path: str, text: str, mode: int = 0o644) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(path, mode)


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
    shipped = resources.files("fleet_trio.sim.demo") / "jobs"
    for name in JOB_SCRIPTS:
        _write(files.script(name), (shipped / name).read_text(encoding="utf-8"))
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
    from fleet_trio.gpu.fake import device_dirs, fake_uuid, init_device

    for i, path in enumerate(device_dirs(files.fake_gpu("node"), NODE_GPUS)):
        init_device(path, f"Fake GPU {i} (demo node)", GPU_GIB, uuid=fake_uuid(path))
    for gpu in ("gpu0", "gpu1"):
        init_device(files.fake_gpu(gpu), f"Fake GPU {gpu[-1]} (demo worker)", GPU_GIB)
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
