"""Payload text never reaches argv, a shell, a path or the environment (issue 14, item 2).

A footprint family read from the payload (``from_payload``) flows into ``{family}``,
``FLEET_FAMILY`` and the footprint file. It is only allowed through a closed set the task's YAML
names (``allowed:`` or ``map:``); a config without one is refused at load time, and a value
outside the set is a 400 at ack time, before anything runs.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import trio

from fleet_trio.errors import ConfigError, WireError
from fleet_trio.node.config import config_from_mapping
from fleet_trio.node.jobs import Done
from fleet_trio.node.tasks import TaskRegistry, TaskRunner

HOSTILE = 'x"; touch pwned; echo "'


def shell_task(family: object) -> dict[str, object]:
    """The shape of the reported case: a shell line with ``{family}`` in it."""
    return {
        "command": ["sh", "-c", 'echo "family={family}" > "{work_dir}/../seen.txt"; echo {}'],
        "cwd": "",
        "footprint": {"family": family},
        "payload": {"model_family": {"type": "string"}},
    }


def registry(tmp_path: Path, task: dict[str, object]) -> TaskRegistry:
    cfg = config_from_mapping({"tasks": {"t": task}}, path="n.yaml", base_dir=str(tmp_path))
    return TaskRegistry(cfg.tasks, base_dir=cfg.base_dir, work_root=str(tmp_path))


async def run_one(reg: TaskRegistry, payload: str, job_id: str) -> object:
    job = reg.prepare("t", payload, job_id)
    with trio.fail_after(10):
        return await TaskRunner(kill_grace=1).execute(job)


async def test_open_from_payload_rule_never_runs_payload_text(tmp_path: Path) -> None:
    """The reported case: before the fix this ran the injected command. Now the config that
    would pass the payload through is refused, or — were it accepted — nothing is injected."""
    payload = json.dumps({"model_family": HOSTILE})
    try:
        reg = registry(tmp_path, shell_task({"from_payload": "model_family", "default": "d"}))
    except ConfigError:
        pass
    else:
        with contextlib.suppress(WireError):
            await run_one(reg, payload, "j1")
    assert not (tmp_path / "pwned").exists()
    assert not (tmp_path.parent / "pwned").exists()


def test_from_payload_without_a_closed_set_is_a_config_error() -> None:
    raw = {"tasks": {"t": shell_task({"from_payload": "model_family", "default": "sdxl"})}}
    with pytest.raises(ConfigError) as info:
        config_from_mapping(raw, path="node.yaml")
    text = str(info.value)
    assert text.startswith("node.yaml: tasks.t.footprint.family: ")
    assert "allowed" in text and "map" in text


@pytest.mark.parametrize(
    ("rule", "where"),
    [
        ({"from_payload": "m", "allowed": ["ok", 'x"; id']}, "allowed"),
        ({"from_payload": "m", "allowed": []}, "allowed"),
        ({"from_payload": "m", "map": {"a": "b c"}}, "map"),
        ({"from_payload": "m", "allowed": ["ok"], "default": "$(id)"}, "default"),
    ],
)
def test_closed_set_values_must_be_ids(rule: dict[str, object], where: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_mapping({"tasks": {"t": shell_task(rule)}}, path="node.yaml")
    assert f"tasks.t.footprint.family.{where}" in str(info.value)


async def test_a_value_outside_the_allowed_set_is_a_400_before_anything_runs(
    tmp_path: Path,
) -> None:
    reg = registry(
        tmp_path, shell_task({"from_payload": "model_family", "allowed": ["sdxl", "flux"]})
    )
    with pytest.raises(WireError) as info:
        reg.prepare("t", json.dumps({"model_family": HOSTILE}), "j1")
    assert info.value.status == 400
    assert str(info.value) == "t payload: model_family must be one of sdxl, flux"
    assert [p for p in tmp_path.iterdir() if p.name.startswith("fleet-job-")] == []
    assert not (tmp_path / "seen.txt").exists()


async def test_an_allowed_value_reaches_the_command_env_and_key(tmp_path: Path) -> None:
    reg = registry(
        tmp_path,
        shell_task({"from_payload": "model_family", "allowed": ["sdxl", "flux"], "default": "d"}),
    )
    job = reg.prepare("t", '{"model_family": "flux"}', "j-ok")
    assert (job.family, job.env["FLEET_FAMILY"]) == ("flux", "flux")
    with trio.fail_after(10):
        outcome = await TaskRunner(kill_grace=1).execute(job)
    assert isinstance(outcome, Done)
    assert (tmp_path / "seen.txt").read_text() == "family=flux\n"
    # absent, null or "": the default, which is in the closed set too
    assert reg.prepare("t", "{}", "j-d").family == "d"
    assert reg.prepare("t", '{"model_family": ""}', "j-e").family == "d"


async def test_a_map_rule_sends_unmapped_text_to_the_default(tmp_path: Path) -> None:
    reg = registry(
        tmp_path,
        shell_task({"from_payload": "model_family", "map": {"music": "acestep"}, "default": "cb"}),
    )
    assert reg.prepare("t", '{"model_family": "music"}', "j1").family == "acestep"
    job = reg.prepare("t", json.dumps({"model_family": HOSTILE}), "j2")
    assert (job.family, job.env["FLEET_FAMILY"]) == ("cb", "cb")
    with trio.fail_after(10):
        await TaskRunner(kill_grace=1).execute(job)
    assert (tmp_path / "seen.txt").read_text() == "family=cb\n"
    assert not (tmp_path / "pwned").exists()


def test_non_string_payload_member_takes_the_default(tmp_path: Path) -> None:
    task = shell_task({"from_payload": "model_family", "allowed": ["sdxl"], "default": "sdxl"})
    task["payload"] = {"model_family": {"type": "any"}}
    reg = registry(tmp_path, task)
    with pytest.raises(WireError) as info:
        reg.prepare("t", '{"model_family": ["sdxl"]}', "j1")
    assert "model_family must be one of sdxl" in str(info.value)


def test_every_placeholder_source_is_the_node_or_a_closed_set(tmp_path: Path) -> None:
    """The docs' promise, pinned: with every placeholder in argv and a hostile payload, argv and
    the FLEET_* environment hold only the node's own values."""
    task = shell_task({"from_payload": "model_family", "map": {"a": "fam-a"}, "default": "fam"})
    task["command"] = ["echo", "{job_id}", "{task_type}", "{work_dir}", "{family}", "{quant}"]
    task["payload"] = {"model_family": {"type": "string"}, "other": {"type": "string"}}
    reg = registry(tmp_path, task)
    payload = json.dumps({"model_family": HOSTILE, "other": HOSTILE, "quant": HOSTILE})
    job = reg.prepare("t", payload, "j1")
    assert job.argv == ("echo", "j1", "t", job.work_dir, "fam", "")
    assert all(HOSTILE not in v for v in job.env.values())
    job.cleanup()


@pytest.mark.parametrize("name", ["two words", "a/b", "-flag", "tab\there", "é"])
def test_task_types_are_ids(name: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_mapping({"tasks": {name: {"command": ["true"]}}}, path="node.yaml")
    assert "a task type must be 1-256 characters" in str(info.value)
    assert "\t" not in str(info.value)


@pytest.mark.parametrize("where", ["family", "footprint"])
def test_a_plain_family_outside_the_id_set_is_a_config_error(where: str) -> None:
    """A family reaches {family}, FLEET_FAMILY, health and the footprint file: a control
    character or a lone surrogate there is refused at load, naming the key."""
    bad = "\ud800\n2026 ERROR x"
    task: dict[str, object] = {"command": ["true"]}
    if where == "family":
        task["family"] = bad
    else:
        task["footprint"] = {"family": bad}
    with pytest.raises(
        ConfigError, match=r"tasks\.t\.(footprint\.)?family: .*(must be 1-256|lone surrogate)"
    ):
        config_from_mapping({"tasks": {"t": task}}, path="node.yaml", base_dir=".")
