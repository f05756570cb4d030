"""The documentation index, its links, and the examples the docs point at (issue 8 §3, §5)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from fleet_trio.node.config import load_config
from fleet_trio.worker.config import load_worker_config

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
EXAMPLES = ROOT / "examples"

_FENCE = re.compile(r"^```.*?^```", re.M | re.S)
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def markdown_files() -> list[Path]:
    files = [*DOCS.glob("*.md"), ROOT / "README.md", ROOT / "CHANGELOG.md"]
    files += EXAMPLES.rglob("*.md")
    return sorted(p for p in files if p.exists())


def relative_links(md: Path) -> list[str]:
    """Link targets outside code blocks that point into the repository."""
    text = _FENCE.sub("", md.read_text(encoding="utf-8"))
    return [
        target
        for target in _LINK.findall(text)
        if not re.match(r"[a-z][a-z0-9+.-]*:", target) and not target.startswith("#")
    ]


def test_every_doc_is_in_the_index() -> None:
    index = relative_links(DOCS / "README.md")
    linked = {target.split("#")[0] for target in index}
    missing = sorted(
        p.name for p in DOCS.glob("*.md") if p.name != "README.md" and p.name not in linked
    )
    assert missing == [], f"docs/README.md does not list {missing}"
    assert "architecture.md" in linked and "troubleshooting.md" in linked


def test_relative_links_resolve() -> None:
    broken = [
        f"{md.relative_to(ROOT)} -> {target}"
        for md in markdown_files()
        for target in relative_links(md)
        if not (md.parent / target.split("#")[0]).exists()
    ]
    assert broken == [], "\n".join(broken)


@pytest.mark.parametrize(
    "example",
    [
        "examples/node.yaml",
        "examples/node-reference.yaml",
        "examples/worker.yaml",
        "examples/hooks/",
        "examples/probe.d/",
        "examples/verify.d/",
        "examples/systemd/fleet-trio-node.service",
        "examples/systemd/fleet-trio-worker.service",
    ],
)
def test_examples_are_referenced_from_the_docs(example: str) -> None:
    text = "\n".join(p.read_text(encoding="utf-8") for p in DOCS.glob("*.md"))
    assert (ROOT / example).exists()
    assert example in text, f"no page in docs/ mentions {example}"


def test_example_configs_load() -> None:
    worker = load_worker_config(EXAMPLES / "worker.yaml")
    assert [d.name for d in worker.devices] == ["gpu0", "gpu1"]
    # The hook paths (commented out, so the example passes --check) are where
    # examples/hooks/README.md installs the example hooks.
    text = (EXAMPLES / "worker.yaml").read_text(encoding="utf-8")
    for hook in ("on_acquire", "on_release"):
        found = re.search(rf"(?m)^ *# {hook}: (\S+)$", text)
        assert found, f"examples/worker.yaml lacks its commented-out {hook}:"
        assert Path(found[1]).name in os.listdir(EXAMPLES / "hooks")
    # Every documented key is in the annotated example (fleet-trio's own keys included).
    summary = worker.to_summary()
    assert summary["ignored_keys"] == []
    text = (EXAMPLES / "worker.yaml").read_text(encoding="utf-8")
    for key in summary:
        if key not in ("path", "ignored_keys"):
            assert re.search(rf"(?m)^{key}:", text), f"examples/worker.yaml lacks {key}:"
    node = load_config(EXAMPLES / "node.yaml")
    assert [t.name for t in node.tasks] == ["sleepy"]


@pytest.mark.parametrize("script", sorted((EXAMPLES / "probe.d").glob("[0-9]*")), ids=str)
def test_example_probes_print_one_json_object(script: Path, tmp_path: Path) -> None:
    """Without nvidia-smi or a scratch dir each probe still prints a flat JSON object."""
    assert os.access(script, os.X_OK)
    env = {"PATH": str(tmp_path), "SCRATCH_DIR": str(tmp_path / "absent")}
    sh = shutil.which("sh")
    assert sh is not None
    proc = subprocess.run([sh, str(script)], env=env, capture_output=True, timeout=30, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {}


@pytest.mark.parametrize(
    "script",
    [
        *sorted((EXAMPLES / "hooks").glob("on_*.sh")),
        *sorted((EXAMPLES / "probe.d").glob("[0-9]*")),
        *sorted((EXAMPLES / "verify.d").glob("[0-9]*")),
    ],
    ids=str,
)
def test_example_scripts_are_executable_shell(script: Path) -> None:
    assert os.access(script, os.X_OK), f"{script} is not executable"
    first = script.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("#!"), f"{script} has no interpreter line"
    if first.split()[0].endswith("sh"):
        proc = subprocess.run(["sh", "-n", str(script)], capture_output=True, timeout=30)
        assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(("hook", "action"), [("on_acquire", "stop"), ("on_release", "start")])
def test_example_hooks_source_their_shared_part(hook: str, action: str) -> None:
    """Both hooks source inference_unit.sh from their own directory; with no GPU index it is a
    logged no-op (exit 0) wherever the hook is run from."""
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    proc = subprocess.run(
        ["sh", str(EXAMPLES / "hooks" / f"{hook}.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        cwd="/",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"{hook}: ")
    assert f"nothing to {action}" in proc.stdout
