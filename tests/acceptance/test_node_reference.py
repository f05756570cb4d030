"""node.md §9, the [ref] and [opt] items: the five reference task definitions of
``examples/node-reference.yaml`` (items 63–72, 78–81, 96–98, 100).

The real renderers are not available, so each task's ``command`` is swapped for a stub run by
``sys.executable`` that keeps the rest of the reference argv (placeholders included), records
what it was given (argv, stdin, ``FLEET_*`` env, the materialized files' bytes) in its result,
and writes a non-empty output file so ``expect_file`` passes. Everything else (schemas,
footprint rules, materialization) is the reference YAML as shipped.

Items 78–81 are [opt]: fleet-trio does not normalize payloads, so those tests pin the raw
pass-through instead (the stub sees exactly the members dispatched, ``reserve_vram`` stays the
JSON number it was).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import trio
import yaml

from fleet_trio.gpu import FootprintKey, FootprintStore
from fleet_trio.node.config import NodeConfig
from fleet_trio.node.jobs import Done
from fleet_trio.node.server import GpuServices, footprint_hooks
from fleet_trio.node.tasks import PreparedJob, TaskRegistry, TaskRunner
from tests.node.conftest import PY
from tests.node.harness import REFERENCE_YAML, Harness, node_config, running_node, work_dirs

FIVE = ("image-gen", "video-gen", "stt", "audio-gen", "run-graph")

STUB = r"""
import json, os, sys
raw = sys.stdin.read()
files = {
    k[len("FLEET_FILE_"):].lower(): v
    for k, v in os.environ.items() if k.startswith("FLEET_FILE_")
}
contents = {}
for name, path in files.items():
    contents[name] = open(path, "rb").read().decode() if path else None
out = os.path.join(os.environ["FLEET_WORK_DIR"], "out.bin")
with open(out, "w") as f:
    f.write("rendered")
print(json.dumps({
    "argv": sys.argv[1:],
    "stdin": raw,
    "env": {k: v for k, v in os.environ.items() if k.startswith("FLEET_")},
    "files": files,
    "contents": contents,
    "image_path": out,
    "video_path": out,
    "audio_path": out,
}))
"""


def reference(
    tmp_path: Path,
    only: tuple[str, ...] | None = None,
    *,
    family: dict[str, str] | None = None,
    env: dict[str, dict[str, str]] | None = None,
) -> NodeConfig:
    """The reference YAML as shipped, each command swapped for the stub (see module doc).

    ``only``: the tasks bound on this machine (the others are left out); ``family``/``env``:
    per-task overrides of ``family:`` and ``env:``, as an operator would edit the file.
    """
    stub = tmp_path / "stub.py"
    stub.write_text(STUB)
    raw = yaml.safe_load(REFERENCE_YAML.read_text())
    tasks: dict[str, Any] = {}
    for name, body in raw["tasks"].items():
        if only is not None and name not in only:
            continue
        body = dict(body)
        body["command"] = [PY, str(stub), *body["command"][2:]]
        if family and name in family:
            body["family"] = family[name]
        if env and name in env:
            body["env"] = env[name]
        tasks[name] = body
    return node_config(tmp_path, tasks)


def registry(cfg: NodeConfig, tmp_path: Path) -> TaskRegistry:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return TaskRegistry(cfg.tasks, base_dir=cfg.base_dir, work_root=str(work))


async def dispatch_raw(h: Harness, job_id: str, task: str, payload: str) -> Any:
    """Dispatch with the payload member's exact bytes (not re-encoded by json.dumps)."""
    body = f'{{"job_id":{json.dumps(job_id)},"task_type":"{task}","payload":{payload}}}'
    return await h.client.post("/fleet/dispatch", content=body.encode())


async def run_done(h: Harness, job_id: str, task: str, payload: str) -> dict[str, Any]:
    r = await dispatch_raw(h, job_id, task, payload)
    assert r.status_code == 202, r.text
    body = await h.wait_terminal(job_id)
    assert body["state"] == "done", body
    data: dict[str, Any] = body["data"]
    return data


# -- 63, 64: what is advertised -----------------------------------------------------------


async def test_node_063_supported_tasks(tmp_path: Path) -> None:
    assert registry(reference(tmp_path, ()), tmp_path).supported == ()
    assert registry(reference(tmp_path), tmp_path).supported == FIVE
    for task in FIVE:
        assert registry(reference(tmp_path, (task,)), tmp_path).supported == (task,)
    # Voice and music are one audio-gen command here (the payload's kind picks); bound on its
    # own it advertises audio-gen, and acestep (spec §11 E).
    audio = registry(reference(tmp_path, ("audio-gen",)), tmp_path)
    assert (audio.supported, audio.families) == (("audio-gen",), ("acestep",))
    for only in ((), FIVE):
        async with running_node(tmp_path, reference(tmp_path, only)) as h:
            health = (await h.client.get("/fleet/health")).json()
            assert health["supported_task_types"] == list(only)


async def test_node_064_families(tmp_path: Path) -> None:
    assert registry(reference(tmp_path), tmp_path).families == (
        "sdxl",
        "wan2.2",
        "whisper",
        "acestep",
        "comfy-graph",
    )
    hidream = reference(tmp_path, ("image-gen",), family={"image-gen": "hidream-o1"})
    assert registry(hidream, tmp_path).families == ("hidream-o1",)
    both = reference(tmp_path, ("image-gen", "video-gen"), family={"image-gen": "wan2.2"})
    assert registry(both, tmp_path).families == ("wan2.2",)
    assert registry(reference(tmp_path, ()), tmp_path).families == ()
    async with running_node(tmp_path, reference(tmp_path)) as h:
        health = (await h.client.get("/fleet/health")).json()
        assert health["loadable_model_families"] == [
            "sdxl",
            "wan2.2",
            "whisper",
            "acestep",
            "comfy-graph",
        ]


# -- 65–68: required members ----------------------------------------------------------------


async def check_required_member(
    tmp_path: Path, task: str, member: str, payloads: list[dict[str, Any]]
) -> None:
    async with running_node(tmp_path, reference(tmp_path)) as h:
        for payload in payloads:
            r = await h.dispatch("j", task, payload)
            assert r.status_code == 400
            error = r.json()["error"]
            assert error.startswith(f"{task} payload: ") and member in error
            assert (await h.poll("j")).status_code == 404
    assert work_dirs(tmp_path) == []


async def test_node_065_image_without_prompt_is_400(tmp_path: Path) -> None:
    await check_required_member(tmp_path, "image-gen", "prompt", [{"width": 512}, {"prompt": ""}])


async def test_node_066_video_without_prompt_is_400(tmp_path: Path) -> None:
    await check_required_member(tmp_path, "video-gen", "prompt", [{"frames": 9}, {"prompt": None}])


async def test_node_067_stt_without_audio_is_400(tmp_path: Path) -> None:
    await check_required_member(tmp_path, "stt", "audio", [{"language": "en"}])


async def test_node_068_audio_without_text_is_400(tmp_path: Path) -> None:
    await check_required_member(tmp_path, "audio-gen", "text", [{"kind": "music"}])


# -- 69–72: run-graph -----------------------------------------------------------------------

GRAPH = '{ "3": {"class_type":"KSampler",  "inputs":{"seed": 1.50e0, "t":"\\u00e9\\n"}} }'
MANIFEST = '{"models": [ {"name":"flux1-dev.safetensors", "sha256" : "ab"} ]}'


async def test_node_069_run_graph_files_byte_identical_and_cleaned(tmp_path: Path) -> None:
    payload = (
        f'{{"graph": {GRAPH}, "manifest":{MANIFEST}, "out_dir": "/srv/out", "reserve_vram": "2.5"}}'
    )
    async with running_node(tmp_path, reference(tmp_path, ("run-graph",))) as h:
        data = await run_done(h, "rg", "run-graph", payload)
        files = data["files"]
        assert data["contents"] == {"graph": GRAPH, "manifest": MANIFEST}
        assert os.path.basename(files["graph"]) == "graph.json"
        assert os.path.basename(files["manifest"]) == "manifest.json"
        # passed to the command as placeholders, in the reference argv
        assert data["argv"] == [
            "--graph",
            files["graph"],
            "--manifest",
            files["manifest"],
            "--result-stdout",
        ]
        # out_dir and reserve_vram pass through (in the raw payload on stdin)
        assert data["stdin"] == payload
        sent = json.loads(data["stdin"])
        assert (sent["out_dir"], sent["reserve_vram"]) == ("/srv/out", "2.5")
        for path in files.values():
            assert not os.path.exists(path)
        assert work_dirs(tmp_path) == []


async def test_node_070_run_graph_model_family_passed_and_recorded(tmp_path: Path) -> None:
    store = await FootprintStore.open(str(tmp_path / "fp.json"), margin=1.2)
    runner = fixed_sample_runner(store, 3.0)
    reg = registry(reference(tmp_path, ("run-graph",)), tmp_path)
    payload = f'{{"graph": {GRAPH}, "model_family": "flux-dev"}}'
    job = reg.prepare("run-graph", payload, "rg-flux")
    with trio.fail_after(10):
        outcome = await runner.execute(job)
    assert isinstance(outcome, Done)
    data = json.loads(outcome.data)
    assert data["env"]["FLEET_FAMILY"] == "flux-dev"
    assert json.loads(data["stdin"])["model_family"] == "flux-dev"
    rec = store.get(FootprintKey("flux-dev", "", "run-graph"))
    assert rec is not None and rec.entry().vram_peak_gb == 3.6
    assert store.get(FootprintKey("comfy-graph", "", "run-graph")) is None


async def test_node_071_run_graph_without_manifest(tmp_path: Path) -> None:
    payload = f'{{"graph": {GRAPH}, "out_dir": "", "reserve_vram": ""}}'
    async with running_node(tmp_path, reference(tmp_path, ("run-graph",))) as h:
        data = await run_done(h, "rg", "run-graph", payload)
        assert data["files"]["manifest"] == ""
        assert data["contents"] == {"graph": GRAPH, "manifest": None}
        assert data["argv"][2:4] == ["--manifest", ""]
        sent = json.loads(data["stdin"])
        assert "manifest" not in sent
        assert (sent["out_dir"], sent["reserve_vram"]) == ("", "")
        # With neither member given, nothing is invented: the renderer reads absent as "".
        data = await run_done(h, "rg2", "run-graph", f'{{"graph": {GRAPH}}}')
        assert data["stdin"] == f'{{"graph": {GRAPH}}}' and data["files"]["manifest"] == ""


@pytest.mark.parametrize(
    ("payload", "substring"),
    [
        ("{}", "graph"),
        ('{"graph": null}', "graph"),
        ('{"graph": [1, 2]}', "object"),
        ('{"graph": "{\\"3\\": {}}"}', "object"),
        ('{"graph": 42}', "object"),
        ('{"graph": {}}', "non-empty"),
        ('{"graph": {"3": {}}, "manifest": []}', "manifest"),
    ],
)
async def test_node_072_run_graph_validation(tmp_path: Path, payload: str, substring: str) -> None:
    async with running_node(tmp_path, reference(tmp_path, ("run-graph",))) as h:
        r = await dispatch_raw(h, "bad", "run-graph", payload)
        assert r.status_code == 400
        error = r.json()["error"]
        assert error.startswith("run-graph payload: ") and substring in error, error
    assert work_dirs(tmp_path) == []


# -- 78–81 [opt]: fleet-trio passes payloads raw --------------------------------------------


async def check_payload_passed_raw(tmp_path: Path, task: str, full: str, minimal: str) -> None:
    async with running_node(tmp_path, reference(tmp_path, (task,))) as h:
        data = await run_done(h, "full", task, full)
        assert data["stdin"] == full  # every member as given, nothing renamed or converted
        sent = json.loads(data["stdin"])
        if "reserve_vram" in sent:  # stays the JSON number (not upstream's "2.5" string)
            assert isinstance(sent["reserve_vram"], float)
            assert f'"reserve_vram":{sent["reserve_vram"]}' in data["stdin"]
        # payload values never reach argv
        assert not any(str(v) in data["argv"] for v in sent.values() if v not in (True, False))
        data = await run_done(h, "min", task, minimal)
        assert data["stdin"] == minimal  # nothing added


async def test_node_078_image_payload_passed_raw(tmp_path: Path) -> None:
    full = (
        '{"prompt":"a cat","negative":"blur","out":"/tmp/cat.png","width":768,'
        '"height":512,"steps":20,"seed":7}'
    )
    await check_payload_passed_raw(tmp_path, "image-gen", full, '{"prompt":"a cat"}')


async def test_node_079_video_payload_passed_raw(tmp_path: Path) -> None:
    full = (
        '{"prompt":"waves","still":"/s.png","model":"wan","negative":"n","out":"/v.mp4",'
        '"frames":33,"width":832,"height":480,"steps":6,"seed":3,"reserve_vram":2.5,'
        '"fast":true,"hero":false,"upscale":true}'
    )
    await check_payload_passed_raw(tmp_path, "video-gen", full, '{"prompt":"waves"}')


async def test_node_080_stt_payload_passed_raw(tmp_path: Path) -> None:
    full = '{"audio":"/a.wav","language":"de","hq":true}'
    await check_payload_passed_raw(tmp_path, "stt", full, '{"audio":"/a.wav"}')


async def test_node_081_audio_payload_passed_raw(tmp_path: Path) -> None:
    full = (
        '{"text":"hi","kind":"voice","voice":"v1","clone":"/c.wav","lang":"en",'
        '"out":"/o.wav","seconds":5,"seed":9,"reserve_vram":1.5}'
    )
    await check_payload_passed_raw(tmp_path, "audio-gen", full, '{"text":"hi"}')


# -- 96–98, 100: footprint keys -------------------------------------------------------------


def keys(reg: TaskRegistry, task: str, payload: str) -> tuple[str, str]:
    job = reg.prepare(task, payload, "k")
    job.cleanup()
    return job.family, job.quant


@pytest.mark.parametrize(
    ("family", "key"),
    [
        (None, ("sdxl", "")),  # as shipped
        ("", ("sdxl", "")),
        ("hidream-o1", ("hidream-o1", "bf16")),
        ("hidream-o1-dev", ("hidream-o1-dev", "bf16")),
        ("some-other-dit", ("some-other-dit", "")),
    ],
)
def test_node_096_image_footprint_key(
    tmp_path: Path, family: str | None, key: tuple[str, str]
) -> None:
    override = {"image-gen": family} if family is not None else None
    reg = registry(reference(tmp_path, ("image-gen",), family=override), tmp_path)
    assert keys(reg, "image-gen", '{"prompt":"p"}') == key
    assert reg.families == (key[0],)  # advertised = recorded family


@pytest.mark.parametrize(
    ("unets", "quant"),
    [
        ({}, ""),
        ({"VIDEOGEN_UNET_HIGH": "wan2.2_t2v_high_noise_14B_Q8_0.gguf"}, "q8_0"),
        (
            {
                "VIDEOGEN_UNET_HIGH": "wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors",
                "VIDEOGEN_UNET_LOW": "wan2.2_t2v_low_noise_14B_q8_0.gguf",
            },
            "q8_0",
        ),
        (
            {
                "VIDEOGEN_UNET_HIGH": "wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors",
                "VIDEOGEN_UNET_LOW": "wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors",
            },
            "",
        ),
    ],
    ids=["none", "Q8_0-high", "q8_0-low", "fp8-both"],
)
def test_node_097_video_quant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unets: dict[str, str], quant: str
) -> None:
    monkeypatch.delenv("VIDEOGEN_UNET_HIGH", raising=False)
    monkeypatch.delenv("VIDEOGEN_UNET_LOW", raising=False)
    reg = registry(reference(tmp_path, ("video-gen",), env={"video-gen": unets}), tmp_path)
    assert keys(reg, "video-gen", '{"prompt":"p"}') == ("wan2.2", quant)
    # the same binding from the node's environment instead of env:
    for name, value in unets.items():
        monkeypatch.setenv(name, value)
    reg = registry(reference(tmp_path, ("video-gen",)), tmp_path)
    assert keys(reg, "video-gen", '{"prompt":"p"}') == ("wan2.2", quant)


def test_node_098_run_graph_family(tmp_path: Path) -> None:
    reg = registry(reference(tmp_path, ("run-graph",)), tmp_path)
    graph = '{"graph":{"3":{}}'
    assert keys(reg, "run-graph", graph + ',"model_family":"flux-dev"}') == ("flux-dev", "")
    assert keys(reg, "run-graph", graph + "}") == ("comfy-graph", "")
    assert keys(reg, "run-graph", graph + ',"model_family":""}') == ("comfy-graph", "")
    assert keys(reg, "run-graph", graph + ',"model_family":null}') == ("comfy-graph", "")
    assert reg.families == ("comfy-graph",)  # a per-job family is never advertised


def fixed_sample_runner(store: FootprintStore, peak: float) -> TaskRunner:
    """The real recorder of the node (``footprint_hooks``) fed a fixed sampled peak."""

    async def sample(job: PreparedJob, stop: trio.Event, pgid: int) -> float | None:
        await stop.wait()
        return peak

    gpu = GpuServices(sampler=None, footprints=store, source=object())  # type: ignore[arg-type]
    _, record = footprint_hooks(gpu)
    return TaskRunner(kill_grace=1, sample_peak=sample, record_peak=record)


async def test_node_100_end_to_end_stub_renderer_fixed_sample(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VIDEOGEN_UNET_LOW", raising=False)
    unets = {"VIDEOGEN_UNET_HIGH": "wan2.2_i2v_high_noise_14B_Q8_0.gguf"}
    cfg = reference(tmp_path, ("image-gen", "video-gen"), env={"video-gen": unets})
    reg = registry(cfg, tmp_path)
    store = await FootprintStore.open(str(tmp_path / "fp.json"), margin=1.2)
    with trio.fail_after(20):
        image = reg.prepare("image-gen", '{"prompt":"a gray sphere"}', "img")
        assert isinstance(await fixed_sample_runner(store, 2.0).execute(image), Done)
        video = reg.prepare("video-gen", '{"prompt":"waves","fast":true}', "vid")
        assert isinstance(await fixed_sample_runner(store, 5.5).execute(video), Done)
    assert [e.to_wire() for e in store.entries()] == [
        {"model_family": "sdxl", "task_type": "image-gen", "vram_peak_gb": 2.4},
        {"model_family": "wan2.2", "quant": "q8_0", "task_type": "video-gen", "vram_peak_gb": 6.6},
    ]
    reopened = await FootprintStore.open(str(tmp_path / "fp.json"), margin=1.2)
    rec = reopened.get(FootprintKey("wan2.2", "q8_0", "video-gen"))
    assert rec is not None and rec.observed_peak_gb == 5.5 and rec.vram_peak_gb == 6.6
    assert work_dirs(tmp_path) == []
