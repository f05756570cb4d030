"""YAML configs are outside input (issue 14, items 4 and 6): both loaders turn any hostile file
into one ``ConfigError`` naming the file — never a RecursionError traceback, a hang or a
blow-up — and ``fleet-trio node`` / ``worker`` print it as one ``error:`` line."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet_trio.configfile import MAX_CONFIG_BYTES, YAML_MAX_DEPTH, yaml_shape_problem
from fleet_trio.errors import ConfigError
from fleet_trio.node.config import load_config
from fleet_trio.worker.config import load_worker_config
from tests.helpers import fleet

WORKER_OK = "controller_url: http://127.0.0.1:1\ntoken: t\nhost: h\ndevices:\n  - name: gpu0\n"
NODE_OK = "node:\n  footprints:\n    margin: 1.2\n"

LAUGHS = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 9)
)

HOSTILE = {
    "flow 5000 deep": "node: " + "[" * 5000 + "]" * 5000 + "\n",
    "block 3000 deep": "".join(" " * i + f"k{i}:\n" for i in range(3000)),
    "flow mapping 5000 deep": "node: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n",
    "billion laughs": LAUGHS,
    "recursive alias": "node: &n {x: *n}\n",
    "recursive sequence": "tasks: &t [*t]\n",
    "NUL byte": "node:\n  node_id: a\x00b\n",
    "escape char": "node:\n  node_id: a\x1bb\n",
    "not utf-8": b"node:\n  node_id: \xff\n",
    "5000-digit int": "node:\n  gpu:\n    index: " + "9" * 5000 + "\n",
}
NODE_ONLY = {
    "margin .inf": "node:\n  footprints:\n    margin: .inf\n",
    "margin .nan": "node:\n  footprints:\n    margin: .nan\n",
    "margin 1e400": "node:\n  footprints:\n    margin: 1e400\n",
    "index 2**70": "node:\n  gpu:\n    index: " + str(2**70) + "\n",
    "probe inf": "tasks:\n  t:\n    command: [true]\n    probe: {x: .inf}\n",
}

Loader = Callable[[str], object]
LOADERS: dict[str, Loader] = {"node": load_config, "worker": load_worker_config}


def write(tmp_path: Path, text: str | bytes) -> str:
    path = tmp_path / "c.yaml"
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return str(path)


@pytest.mark.parametrize("loader", LOADERS.values(), ids=LOADERS.keys())
@pytest.mark.parametrize("text", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_hostile_file_is_one_config_error(tmp_path: Path, loader: Loader, text: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        loader(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and "\n" not in message and len(message) < 500


@pytest.mark.parametrize("text", NODE_ONLY.values(), ids=NODE_ONLY.keys())
def test_node_numbers_are_finite_and_in_range(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: ")
    assert "finite" in str(info.value) or "range" in str(info.value)


def test_messages_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=f"nested deeper than {YAML_MAX_DEPTH} levels"):
        load_config(write(tmp_path, HOSTILE["flow 5000 deep"]))
    with pytest.raises(ConfigError, match="nodes once aliases are expanded"):
        load_worker_config(write(tmp_path, LAUGHS))
    with pytest.raises(ConfigError, match="recursive alias"):
        load_config(write(tmp_path, HOSTILE["recursive alias"]))
    with pytest.raises(ConfigError, match=r"node\.footprints\.margin: not a finite number"):
        load_config(write(tmp_path, NODE_ONLY["margin .inf"]))


@pytest.mark.parametrize("loader", LOADERS.values(), ids=LOADERS.keys())
def test_special_files_are_refused_without_blocking(tmp_path: Path, loader: Loader) -> None:
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    for path in ("/dev/zero", str(fifo), str(tmp_path)):
        with pytest.raises(ConfigError, match="not a regular file"):
            loader(path)
    big = write(tmp_path, "# " + "x" * MAX_CONFIG_BYTES + "\n")
    with pytest.raises(ConfigError, match=f"larger than {MAX_CONFIG_BYTES} bytes"):
        loader(big)


def test_good_files_still_load(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, NODE_OK)).node.footprints.margin == 1.2
    assert load_worker_config(write(tmp_path, WORKER_OK), environ={}).host == "h"
    # ordinary anchors and merge keys stay fine
    merged = WORKER_OK + "hooks: &h {timeout: 30s}\nx: *h\n"
    load_worker_config(write(tmp_path, merged), environ={})


async def test_cli_prints_one_error_line_and_no_traceback(tmp_path: Path) -> None:
    deep = write(tmp_path, HOSTILE["block 3000 deep"])
    for args in (("node", "-c", deep), ("worker", "-c", deep, "--check")):
        done = await fleet(*args)
        text = done.stderr.decode()
        assert done.returncode == 1, text
        assert "Traceback" not in text and "RecursionError" not in text
        lines = [line for line in text.splitlines() if line.strip()]
        assert len(lines) == 1 and "error: " in lines[0] and deep in lines[0], text


# --- fuzz -------------------------------------------------------------------------------------

_pieces = st.sampled_from(
    [
        "node:",
        "tasks:",
        "  ",
        "\n",
        "[",
        "]",
        "{",
        "}",
        "&a ",
        "*a",
        "<<: *a",
        ": ",
        "- ",
        ".inf",
        ".nan",
        "1e400",
        "9" * 40,
        "'",
        '"',
        "\\ud800",
        "\t",
        "margin",
        "command",
        "footprints",
        "\x00",
        "\x1b",
        "\u2028",
        "---",
    ]
)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_pieces | st.text(max_size=5), max_size=40))
def test_fuzz_both_loaders(tmp_path_factory: pytest.TempPathFactory, pieces: list[str]) -> None:
    path = tmp_path_factory.mktemp("cfg") / "c.yaml"
    path.write_bytes("".join(pieces).encode("utf-8", errors="surrogatepass"))
    for loader in LOADERS.values():
        try:
            loader(str(path))
        except ConfigError as exc:
            assert str(exc).startswith(f"{path}: ")


@pytest.mark.slow
@settings(max_examples=50, deadline=None)
@given(st.integers(min_value=YAML_MAX_DEPTH + 1, max_value=3000), st.sampled_from("[{-"))
def test_fuzz_depth(depth: int, opener: str) -> None:
    block = "".join(" " * (2 * i) + "-\n" for i in range(depth))
    text = block if opener == "-" else opener * depth
    problem = yaml_shape_problem(text)
    assert problem is not None and problem.startswith(f"nested deeper than {YAML_MAX_DEPTH} ")


@pytest.mark.parametrize(
    "text",
    ["node:\n- \n", "node: 5\n", "node: text\n", "tasks:\n  t: [1]\n"],
)
def test_a_section_that_is_not_a_mapping_is_one_config_error(tmp_path: Path, text: str) -> None:
    """Found by the fuzz: ``node:`` holding a list reached cattrs as an AttributeError, which
    the CLI printed as an internal error with a crash file."""
    path = tmp_path / "node.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(str(path))
    assert str(path) in str(info.value)
    assert "expected a mapping" in str(info.value)


# A raw NUL byte is refused by the YAML reader itself ("NUL byte" above); the escape "\0" in a
# double-quoted scalar is valid YAML and gave a string with a NUL in it, which reached a path
# (a ValueError from the OS layer: an internal error instead of a config error).
NUL_ESCAPES = {
    "node footprints path": (
        "node",
        'node:\n  footprints:\n    path: "a\\0b"\n',
        "node.footprints.path",
    ),
    "node journal path": ("node", 'node:\n  journal:\n    path: "a\\0b"\n', "node.journal.path"),
    "node task cwd": (
        "node",
        'tasks:\n  t:\n    command: ["true"]\n    cwd: "a\\0b"\n',
        "tasks.t.cwd",
    ),
    "node key": ("node", 'tasks:\n  "t\\0":\n    command: ["true"]\n', "tasks"),
    "worker probe_dir": ("worker", WORKER_OK + 'probe_dir: "a\\0b"\n', "probe_dir"),
    "worker verify_dir": ("worker", WORKER_OK + 'verify_dir: "a\\0b"\n', "verify_dir"),
    "worker device hook": (
        "worker",
        WORKER_OK + '    on_acquire: "/bin/tr\\0ue"\n',
        "devices[0].on_acquire",
    ),
    "worker label key": ("worker", WORKER_OK + '    labels: {"r\\0": x}\n', "devices[0].labels"),
}
SURROGATE_ESCAPES = {
    "node journal path": ("node", 'node:\n  journal:\n    path: "\\ud800"\n', "node.journal.path"),
    "node key": ("node", 'tasks:\n  "t\\udc80":\n    command: ["true"]\n', "tasks"),
    "worker verify_dir": ("worker", WORKER_OK + 'verify_dir: "\\udc80"\n', "verify_dir"),
    "worker device hook": (
        "worker",
        WORKER_OK + '    on_acquire: "/bin/tr\\ud800ue"\n',
        "devices[0].on_acquire",
    ),
}


@pytest.mark.parametrize(
    ("case", "problem"),
    [(case, "(found U+0000)") for case in NUL_ESCAPES.values()]
    + [(case, "lone surrogate (found U+D") for case in SURROGATE_ESCAPES.values()],
    ids=[f"NUL {k}" for k in NUL_ESCAPES] + [f"surrogate {k}" for k in SURROGATE_ESCAPES],
)
def test_text_no_path_can_hold_is_a_config_error_naming_the_key(
    tmp_path: Path, case: tuple[str, str, str], problem: str
) -> None:
    role, text, key = case
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        LOADERS[role](path)
    message = str(info.value)
    assert message.startswith(f"{path}: {key}") and problem in message, message
