"""A misspelt key anywhere in a node YAML is named, with the closest known key (issue 28 §5)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet_trio.errors import ConfigError
from fleet_trio.node.config import load_config


def _error(tmp_path: Path, text: str) -> str:
    cfg = tmp_path / "node.yaml"
    cfg.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(cfg)
    message = str(info.value)
    assert message.startswith(f"{cfg}: "), message
    return message


def test_a_misspelt_command_is_named_not_reported_missing(tmp_path: Path) -> None:
    message = _error(tmp_path, "tasks:\n  t:\n    comand: [echo, hi]\n")
    assert "comand" in message
    assert "did you mean 'command'?" in message
    assert "required field missing" not in message


def test_a_misspelt_task_key_beside_command_gets_a_hint(tmp_path: Path) -> None:
    message = _error(tmp_path, "tasks:\n  t:\n    command: [echo]\n    timout: 5s\n")
    assert "tasks.t" in message
    assert "timout" in message
    assert "did you mean 'timeout'?" in message


def test_a_task_without_command_still_says_so(tmp_path: Path) -> None:
    message = _error(tmp_path, "tasks:\n  t:\n    gpu: true\n")
    assert message == f"{cfg_path(tmp_path)}: tasks.t.command: required field missing"


def test_a_misspelt_top_level_key_gets_a_hint(tmp_path: Path) -> None:
    message = _error(tmp_path, "nodes:\n  listen: 127.0.0.1:1\n")
    assert "nodes" in message
    assert "did you mean 'node'?" in message


@pytest.mark.parametrize(
    ("text", "typo", "hint"),
    [
        ("node:\n  timings:\n    drain_timout: 5s\n", "drain_timout", "drain_timeout"),
        ("node:\n  journal:\n    enabeld: false\n", "enabeld", "enabled"),
        (
            "tasks:\n  t:\n    command: [echo]\n    payload:\n      text: {requird: true}\n",
            "requird",
            "required",
        ),
        (
            "tasks:\n  t:\n    command: [echo]\n    footprint: {famly: x}\n",
            "famly",
            "family",
        ),
    ],
)
def test_nested_typos_get_a_hint(tmp_path: Path, text: str, typo: str, hint: str) -> None:
    message = _error(tmp_path, text)
    assert typo in message
    assert f"did you mean {hint!r}?" in message


def cfg_path(tmp_path: Path) -> Path:
    return tmp_path / "node.yaml"
