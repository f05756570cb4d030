"""Reading a YAML config file as outside input (both roles' loaders use it).

A config file is read only when it is a regular file of at most :data:`MAX_CONFIG_BYTES` (a
FIFO, a device or a directory is refused without blocking), and its YAML is checked on the
parser's event stream — which PyYAML produces without recursion — before any tree is built:
nesting deeper than :data:`YAML_MAX_DEPTH`, more than :data:`YAML_MAX_NODES` nodes once aliases
are expanded (the "billion laughs" shape) and an alias inside its own anchor are refused. So a
hostile file is one ``ConfigError`` naming the file, never a ``RecursionError`` traceback, a
hang or a blow-up. Sync, no module state; callers in trio run it in a thread.
"""

from __future__ import annotations

import math
import os
import re
import stat
from collections.abc import Mapping
from typing import Any

import yaml

from fleet_trio.errors import ConfigError

MAX_CONFIG_BYTES = 1 << 20
"""The largest config file read (1 MiB)."""
YAML_MAX_DEPTH = 32
"""Deepest nesting of mappings and sequences a config may have."""
YAML_MAX_NODES = 100_000
"""Most nodes a config may hold once every alias is expanded."""
INT64_MAX = (1 << 63) - 1


def read_config_bytes(path: str, *, max_bytes: int = MAX_CONFIG_BYTES) -> bytes:
    """The file's bytes; :class:`ConfigError` naming ``path`` when it cannot be one."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror or exc}", path=path) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError("cannot read: not a regular file", path=path)
        if st.st_size > max_bytes:
            raise ConfigError(f"cannot read: larger than {max_bytes} bytes", path=path)
        chunks: list[bytes] = []
        size = 0
        while chunk := os.read(fd, 1 << 16):
            size += len(chunk)
            if size > max_bytes:
                raise ConfigError(f"cannot read: larger than {max_bytes} bytes", path=path)
            chunks.append(chunk)
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror or exc}", path=path) from None
    finally:
        os.close(fd)
    return b"".join(chunks)


def _scan(text: str, loader: Any, max_depth: int, max_nodes: int) -> str | None:
    """The event-stream check with ``loader``'s parser; a syntax error raises."""
    anchors: dict[str, int] = {}
    open_anchors: set[str] = set()
    names: list[str | None] = []  # the open collections' anchors ...
    sizes: list[int] = []  # ... and their expanded node counts so far
    try:
        for event in yaml.parse(text, Loader=loader):
            if isinstance(event, yaml.CollectionStartEvent):
                if len(sizes) >= max_depth:
                    mark = event.start_mark
                    where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "?"
                    return f"nested deeper than {max_depth} levels ({where})"
                if event.anchor:
                    open_anchors.add(event.anchor)
                names.append(event.anchor)
                sizes.append(1)
                continue
            if isinstance(event, yaml.ScalarEvent):
                count = 1
                if event.anchor:
                    anchors[event.anchor] = 1
            elif isinstance(event, yaml.AliasEvent):
                if event.anchor in open_anchors:
                    return f"recursive alias *{event.anchor}"
                count = anchors.get(event.anchor or "", 1)
            elif isinstance(event, yaml.CollectionEndEvent) and sizes:
                anchor, count = names.pop(), sizes.pop()
                if anchor:
                    open_anchors.discard(anchor)
                    anchors[anchor] = count
            else:
                continue
            if sizes:
                sizes[-1] += count
                if sizes[-1] > max_nodes:
                    return f"more than {max_nodes} nodes once aliases are expanded"
            elif count > max_nodes:
                return f"more than {max_nodes} nodes once aliases are expanded"
    except RecursionError:  # pragma: no cover - both parsers are iterative
        return f"nested deeper than {max_depth} levels"
    return None


def yaml_shape_problem(
    text: str, *, max_depth: int = YAML_MAX_DEPTH, max_nodes: int = YAML_MAX_NODES
) -> str | None:
    """Why ``text``'s YAML shape is refused, or ``None``. A syntax error is left to the loader
    (``None``), which reports it with its own line and column.

    libyaml's parser (when PyYAML has it) scans fast; on any error of its own (it also stops at
    1000 levels) the pure-Python parser, which yields events lazily, decides.
    """
    fast = getattr(yaml, "CSafeLoader", None)
    if fast is not None:
        try:
            return _scan(text, fast, max_depth, max_nodes)
        except yaml.YAMLError:
            pass
    try:
        return _scan(text, yaml.SafeLoader, max_depth, max_nodes)
    except yaml.YAMLError:
        return None


def check_yaml_shape(text: str, *, path: str) -> None:
    """:func:`yaml_shape_problem` as a :class:`ConfigError` naming ``path``."""
    problem = yaml_shape_problem(text)
    if problem is not None:
        raise ConfigError(f"invalid YAML: {problem}", path=path)


def number_problem(value: object) -> str | None:
    """Why a parsed number is refused: non-finite floats and integers beyond int64."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"not a finite number: {value!r}"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT64_MAX:
        return "number out of range (more than 64 bits)"
    return None


NUL_PROBLEM = "must not contain a control character (found U+0000)"
_SURROGATE = re.compile("[\ud800-\udfff]")


def text_problem(text: str) -> str | None:
    """Why a config string (or key) is refused: a NUL byte or a lone surrogate (YAML's
    ``"\\0"`` and ``"\\ud800"`` escapes). Such text can be no path, command, environment
    value or name: refused at load, naming its key, rather than an error of the OS layer later
    (``embedded null byte``, ``surrogates not allowed``)."""
    if "\0" in text:
        return NUL_PROBLEM
    found = _SURROGATE.search(text)
    if found is not None:
        return f"must not contain a lone surrogate (found U+{ord(found.group()):04X})"
    return None


def find_bad_value(value: object, key: str = "") -> tuple[str, str] | None:
    """``(dotted key, problem)`` of the first non-finite or out-of-range number, or string or
    key refused by :func:`text_problem`, in a parsed tree (iterative; every node visited once,
    so shared alias targets cost nothing more)."""
    seen: set[int] = set()
    todo: list[tuple[object, str]] = [(value, key)]
    while todo:
        item, where = todo.pop()
        if isinstance(item, Mapping | list | tuple):
            if id(item) in seen:
                continue
            seen.add(id(item))
            if isinstance(item, Mapping):
                for k in item:
                    if isinstance(k, str) and (problem := text_problem(k)) is not None:
                        return where, problem
                todo.extend((v, f"{where}.{k}" if where else str(k)) for k, v in item.items())
            else:
                todo.extend((v, f"{where}[{i}]") for i, v in enumerate(item))
            continue
        problem = text_problem(item) if isinstance(item, str) else number_problem(item)
        if problem is not None:
            return where, problem
    return None


__all__ = [
    "INT64_MAX",
    "MAX_CONFIG_BYTES",
    "NUL_PROBLEM",
    "YAML_MAX_DEPTH",
    "YAML_MAX_NODES",
    "check_yaml_shape",
    "find_bad_value",
    "number_problem",
    "read_config_bytes",
    "text_problem",
    "yaml_shape_problem",
]
