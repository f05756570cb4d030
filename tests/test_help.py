"""``--help`` of the top level and of every subcommand, discovered from the parser (so a new
subcommand is covered without touching this file): it exits 0, names every option, its usage
line names the subcommand, and each default it documents is the parser's actual default."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

import pytest

from fleet_trio import __version__
from fleet_trio.cli import PROG, build_parser, main
from fleet_trio.gpu.fake import build_parser as build_fake_gpu_parser


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


def _walk(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    found = [(path, parser)]
    seen: set[int] = set()
    for name, sub in _subparsers(parser).items():
        if id(sub) not in seen:  # an alias maps to the same parser
            seen.add(id(sub))
            found += _walk(sub, (*path, name))
    return found


PATHS = [path for path, _ in _walk(build_parser())]
FAKE_GPU_VERBS = [path for path, _ in _walk(build_fake_gpu_parser()) if path]


def _parser_at(path: tuple[str, ...]) -> argparse.ArgumentParser:
    return dict(_walk(build_parser()))[path]


def _help(path: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_:
        main([*path, "--help"])
    assert exit_.value.code in (0, None), exit_.value.code
    out = capsys.readouterr()
    assert out.err == ""
    return out.out


def _expanded_help(action: argparse.Action, prog: str) -> str:
    """The help text as argparse prints it (``%(default)s`` and friends substituted)."""
    params = {k: v for k, v in vars(action).items() if v is not argparse.SUPPRESS}
    params["prog"] = prog
    if params.get("choices") is not None:
        params["choices"] = ", ".join(str(c) for c in params["choices"])
    return (action.help or "") % params


DEFAULT_RE = re.compile(r"\bdefault:?\s+([^\s;)]+)")


def test_every_known_subcommand_is_discovered() -> None:
    for name in ("exec", "node", "measure", "worker", "tail"):
        assert (name,) in PATHS
    assert () in PATHS


@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(p) or "top")
def test_help(path: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    parser = _parser_at(path)
    text = _help(path, capsys)

    # the usage line names the subcommand
    want = " ".join([PROG, *path])
    assert text.startswith(f"usage: {want}"), text.splitlines()[0]

    # every option and positional is shown; every subcommand is listed by its parent
    for action in parser._actions:
        if action.help is argparse.SUPPRESS:
            continue
        if isinstance(action, argparse._SubParsersAction):
            for name in action.choices:
                assert re.search(rf"^\s+{re.escape(name)}\b", text, re.M), name
            continue
        if action.option_strings:
            for option in action.option_strings:
                assert option in text, option
            # the usage block (a custom one included) names the option in one of its spellings
            usage = text.split("\n\n", 1)[0]
            assert any(option in usage for option in action.option_strings), action.option_strings
        else:
            shown = action.metavar if action.metavar is not None else action.dest
            assert str(shown) in text, shown

    # each documented default is the actual one; a concrete default is documented
    for action in parser._actions:
        if not action.option_strings or action.help in (None, argparse.SUPPRESS):
            continue
        default = action.default
        if default in (None, argparse.SUPPRESS, False, True, "", []):
            continue  # resolved at run time (environment, config) or a plain switch
        documented = DEFAULT_RE.search(_expanded_help(action, parser.prog))
        assert documented is not None, (
            f"{action.option_strings[0]}: default {default!r} undocumented"
        )
        value = documented.group(1).rstrip(",.:")
        assert _same(value, default), (action.option_strings[0], value, default)


def _same(documented: str, default: object) -> bool:
    """``3`` documents 3.0; otherwise the text is the default's own."""
    if isinstance(default, int | float) and not isinstance(default, bool):
        try:
            return float(documented) == float(default)
        except ValueError:
            return False
    return documented == str(default)


def test_python_dash_m_and_version_from_one_place() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fleet_trio", "--version"], capture_output=True, timeout=30
    )
    assert done.returncode == 0
    assert done.stdout.decode().strip() == f"{PROG} {__version__}"
    from importlib.metadata import version

    assert version("fleet-trio") == __version__  # pyproject's dynamic version reads it


def test_top_level_help_is_the_same_without_the_harness_loaded() -> None:
    """``fleet-trio --help`` is printed with stand-ins for the harness commands (sim, demo),
    whose parsers are imported only when named: their lines are the real parsers' lines."""
    assert build_parser(full=()).format_help() == build_parser().format_help()


def _no_help_text(parser: argparse.ArgumentParser) -> list[str]:
    return [
        "/".join(action.option_strings) or str(action.metavar or action.dest)
        for action in parser._actions
        if action.help is not argparse.SUPPRESS
        and not isinstance(action, argparse._SubParsersAction)
        and not (action.help or "").strip()
    ]


def _wide_usage(parser: argparse.ArgumentParser) -> list[str]:
    """Usage lines wider than an 80-column terminal (argparse wraps its own at 78)."""
    return [line for line in parser.format_usage().splitlines() if len(line) > 80]


@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(p) or "top")
def test_every_argument_has_help_text(path: tuple[str, ...]) -> None:
    """Every option and positional of every subcommand says what it is (a test walks the
    parser), and the usage block fits a terminal (a hand-written usage line is wrapped)."""
    parser = _parser_at(path)
    missing = _no_help_text(parser)
    assert not missing, f"{' '.join([PROG, *path])}: no help text for {missing}"
    assert not _wide_usage(parser)


@pytest.mark.parametrize("path", FAKE_GPU_VERBS, ids=" ".join)
def test_every_fake_gpu_argument_has_help_text(path: tuple[str, ...]) -> None:
    """``fleet-trio fake-gpu VERB`` parses its verb's arguments with a parser of its own."""
    parser = dict(_walk(build_fake_gpu_parser("fleet-trio fake-gpu")))[path]
    missing = _no_help_text(parser)
    assert not missing, f"fleet-trio fake-gpu {' '.join(path)}: no help text for {missing}"
    assert not _wide_usage(parser)
