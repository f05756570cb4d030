"""The shared test helpers, and the rule they serve: tests wait on facts, not on settle sleeps."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import trio
import trio.testing

from tests.helpers import elapse, quiet_for, scenario_pause, wait_until

TESTS = Path(__file__).parent
BARE_SLEEP = re.compile(r"await trio\.sleep\((0?\.[0-9]+|[0-9])\)")
PRIVATE_WAIT = re.compile(r"^\s*(async )?def (until|wait_for|_until|_wait_for)\w*\(", re.M)


def test_no_bare_settle_sleep_in_tests() -> None:
    """A wait goes through ``wait_until`` (a fact), ``elapse`` (virtual time), ``quiet_for``
    (a named "nothing happened" check) or ``scenario_pause`` (part of the scenario)."""
    found = [
        f"{path.relative_to(TESTS)}:{text.count(chr(10), 0, m.start()) + 1}"
        for path in sorted(TESTS.rglob("*.py"))
        for text in [path.read_text(encoding="utf-8")]
        for m in BARE_SLEEP.finditer(text)
    ]
    assert found == []


def test_one_wait_helper() -> None:
    """No private ``until``/``wait_for`` polling helper besides ``tests/helpers.py``'s."""
    found = [
        f"{path.relative_to(TESTS)}: {m.group(0).strip()}"
        for path in sorted(TESTS.rglob("*.py"))
        if path.name != "helpers.py"
        for m in PRIVATE_WAIT.finditer(path.read_text(encoding="utf-8"))
    ]
    assert found == []


def _imported_modules(path: Path) -> list[tuple[int, str]]:
    """Every module ``path`` imports (``from a.b import c`` yields ``a.b`` and ``a.b.c``), with
    relative imports resolved against its package."""
    package = path.relative_to(TESTS.parent).with_suffix("").parts[:-1]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1] if node.level else ())
            module = ".".join(part for part in (base, node.module or "") if part)
            found.append((node.lineno, module))
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


def test_no_test_module_imports_another() -> None:
    """A helper two test modules share lives in ``tests/helpers.py`` or a named helper module
    (``tests/node/harness.py``, ``tests/browser.py``...), never in a ``test_*.py`` module."""
    found = sorted(
        {
            f"{path.relative_to(TESTS)}:{line}: {module}"
            for path in TESTS.rglob("*.py")
            for line, module in _imported_modules(path)
            if module.split(".")[0] == "tests"
            and any(part.startswith("test_") for part in module.split(".")[1:])
        }
    )
    assert found == []


async def test_wait_until_returns_the_truthy_value(autojump_clock: trio.testing.MockClock) -> None:
    calls = []

    def predicate() -> list[int] | None:
        calls.append(1)
        return [len(calls)] if len(calls) >= 3 else None

    assert await wait_until(predicate, interval=0.5) == [3]
    assert trio.current_time() == pytest.approx(1.0)


async def test_wait_until_takes_an_async_predicate(autojump_clock: trio.testing.MockClock) -> None:
    state = {"n": 0}

    async def ready() -> bool:
        state["n"] += 1
        await trio.lowlevel.checkpoint()
        return state["n"] == 2

    assert await wait_until(ready) is True


async def test_wait_until_names_what_it_awaited(autojump_clock: trio.testing.MockClock) -> None:
    with pytest.raises(AssertionError, match=r"timed out after 2 s waiting for the gate \(last"):
        await wait_until(lambda: 0, timeout=2, what="the gate")
    assert trio.current_time() == pytest.approx(2.0, abs=0.02)
    with pytest.raises(AssertionError, match=r"waiting for a lambda at test_helpers\.py:\d+"):
        await wait_until(lambda: "", timeout=1)


async def test_elapse_refuses_a_real_clock() -> None:
    with pytest.raises(AssertionError, match="autojump"):
        await elapse(0.01)


async def test_elapse_quiet_for_and_scenario_pause_take_their_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    await elapse(5)
    await quiet_for(1, reason="nothing happens")
    await scenario_pause(2, why="a fake's latency")
    assert trio.current_time() == pytest.approx(8.0)
    with pytest.raises(AssertionError):
        await quiet_for(1, reason="")
    with pytest.raises(AssertionError):
        await scenario_pause(1, why="")
