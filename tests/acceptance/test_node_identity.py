"""node.md §9, items 83–90: identity, the listen guard and config defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet_trio.node.config import (
    DEFAULT_LISTEN,
    ListenRefused,
    check_listen,
    load_config,
    resolve_listen,
    resolve_node_id,
)


def test_node_083_defaults_resolve(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path, ""))
    listen = resolve_listen(None, cfg.node.listen)
    check_listen(listen, False)
    assert listen == "127.0.0.1:18811"
    assert resolve_node_id(None, cfg.node.node_id, lambda: "node-a") == "node-a"


def test_node_084_non_loopback_refused() -> None:
    with pytest.raises(ListenRefused) as info:
        check_listen("100.64.0.10:18811", False)
    assert "refusing to bind" in str(info.value)
    assert 'refusing to bind --listen "100.64.0.10:18811"' in str(info.value)


def test_node_085_override_accepts_and_flags_win() -> None:
    check_listen("100.64.0.10:18811", True)
    assert resolve_listen("100.64.0.10:18811", "127.0.0.1:18899") == "100.64.0.10:18811"
    assert resolve_node_id("flag-id", "cfg-id", lambda: "host") == "flag-id"


def test_node_086_config_node_id_beats_hostname() -> None:
    assert resolve_node_id(None, "cfg-id", lambda: "host") == "cfg-id"


def test_node_087_hostname_failure_fleet_node() -> None:
    def broken() -> str:
        raise OSError("no hostname")

    assert resolve_node_id(None, "", broken) == "fleet-node"
    assert resolve_node_id(None, "", lambda: "") == "fleet-node"


def test_node_088_config_listen_beats_default() -> None:
    assert resolve_listen(None, "127.0.0.1:18899") == "127.0.0.1:18899"


@pytest.mark.parametrize(
    ("addr", "allowed"),
    [
        ("127.0.0.1:18800", True),
        ("[::1]:18800", True),
        ("localhost:18800", True),
        ("LocalHost:18800", True),
        ("127.5.6.7:18800", True),
        ("[::ffff:127.0.0.1]:18800", True),
        ("0.0.0.0:18800", False),
        ("192.168.1.5:18800", False),
        (":18800", False),
        ("example.com:18800", False),
        ("127.0.0.1", False),
        ("localhost", False),
        ("", False),
    ],
)
def test_node_089_guard_table(addr: str, allowed: bool) -> None:
    if allowed:
        check_listen(addr, False)
    else:
        with pytest.raises(ListenRefused) as info:
            check_listen(addr, False)
        text = str(info.value)
        assert "refusing to bind" in text or f'cannot parse --listen "{addr}"' in text
    check_listen(addr, True)  # the override skips even the parse


def test_node_089_parse_errors_say_cannot_parse() -> None:
    for addr in ("127.0.0.1", "localhost", ""):
        with pytest.raises(ListenRefused, match="cannot parse --listen"):
            check_listen(addr, False)


def test_node_090_config_defaults_and_loading(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path, ""))
    assert resolve_listen(None, cfg.node.listen) == DEFAULT_LISTEN
    assert cfg.node.node_id == "" and cfg.node.sampler == "auto"
    cfg = load_config(
        _write(
            tmp_path,
            'node:\n  listen: "127.0.0.1:18899"\n  node_id: "box-7"\n  sampler: global\n',
        )
    )
    assert (cfg.node.listen, cfg.node.node_id, cfg.node.sampler) == (
        "127.0.0.1:18899",
        "box-7",
        "global",
    )


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "node.yaml"
    path.write_text(text)
    return path
