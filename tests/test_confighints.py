"""``fleet_trio.confighints``: the one formatter of cattrs errors both roles' config loaders use
(a message naming the dotted key, under the caller's prefix)."""

from __future__ import annotations

import attrs
import cattrs
import pytest

from fleet_trio.confighints import KeyedError, cattrs_error, structure


@attrs.frozen
class Item:
    size: int


@attrs.frozen
class Settings:
    name: str
    items: tuple[Item, ...] = ()
    labels: dict[str, int] = attrs.Factory(dict)


def strict() -> cattrs.Converter:
    converter = cattrs.Converter(forbid_extra_keys=True)

    def size(value: object, _: type) -> int:
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"expected a size >= 0, got {value!r}")
        return value

    converter.register_structure_hook(int, size)
    return converter


def test_a_nested_error_names_the_dotted_key_under_the_prefix() -> None:
    with pytest.raises(KeyedError) as info:
        structure(strict(), {"name": "n", "items": [{"size": 1}, {"size": -2}]}, Settings, "node")
    assert str(info.value) == "expected a size >= 0, got -2"
    assert info.value.key == "node.items[1].size"


def test_a_mapping_key_becomes_a_dotted_part() -> None:
    with pytest.raises(KeyedError) as info:
        structure(strict(), {"name": "n", "labels": {"tier": "x"}}, Settings, "")
    assert info.value.key == "labels.tier"


def test_an_unknown_key_of_a_strict_class_gets_the_closest_known_one() -> None:
    with pytest.raises(KeyedError) as info:
        structure(strict(), {"name": "n", "itmes": []}, Settings, "node")
    assert "itmes" in str(info.value)
    assert "(did you mean 'items'?)" in str(info.value)
    assert info.value.key == "node"


def test_a_missing_key_is_named() -> None:
    with pytest.raises(KeyedError) as info:
        structure(strict(), {}, Settings, "x")
    assert info.value.key == "x.name"
    assert "required" in str(info.value)


def test_an_error_outside_any_class_is_at_the_prefix() -> None:
    assert cattrs_error(ValueError("boom"), "a.b") == ("boom", "a.b")
    assert cattrs_error(TypeError("boom"), "") == ("invalid type (boom)", "")
