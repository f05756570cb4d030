"""docs/sim.md's example: the files it shows are the files in examples/sim, and they pass."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import trio

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "sim.md"
EXAMPLE = REPO / "examples" / "sim"


def code_blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```$", text, flags=re.S | re.M)


@pytest.mark.parametrize(
    ("name", "lang"),
    [
        ("test_example.py", "python"),
        ("upper.py", "python"),
        ("node.yaml", "yaml"),
        ("worker.yaml", "yaml"),
    ],
)
def test_the_doc_shows_the_example_files_verbatim(name: str, lang: str) -> None:
    blocks = code_blocks(DOC.read_text(), lang)
    assert (EXAMPLE / name).read_text() in blocks, f"docs/sim.md does not show {name} verbatim"


@pytest.mark.slow
async def test_the_example_passes() -> None:
    """Run as a user would: ``pytest examples/sim`` in a fresh interpreter (the plugin comes
    from the installed entry point)."""
    cmd = [sys.executable, "-m", "pytest", "examples/sim", "-q", "-p", "no:cacheprovider"]
    with trio.fail_after(120):
        done = await trio.run_process(
            cmd, cwd=REPO, capture_stdout=True, stderr=subprocess.STDOUT, check=False
        )
    out = done.stdout.decode(errors="replace")
    assert done.returncode == 0, out
    assert re.search(r"\b5 passed\b", out), out
