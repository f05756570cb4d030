"""Shared fixtures for the node tests: task YAML snippets with real child processes."""

from __future__ import annotations

import sys

PY = sys.executable

# A task script: reads the payload on stdin, behaves as the payload asks.
#   {"sleep": s} sleeps; {"exit": n} exits n; {"stdout": "..."} prints it raw;
#   {"result": {...}} prints it as the result (default: {"echo": <payload>, "env": {...}}).
TASK_SCRIPT = r"""
import json, os, sys, time
raw = sys.stdin.read()
p = json.loads(raw)
with open(os.path.join(os.environ["FLEET_WORK_DIR"], "stdin.txt"), "w") as f:
    f.write(raw)
if p.get("stderr"):
    sys.stderr.write(p["stderr"])
time.sleep(p.get("sleep", 0))
if "exit" in p:
    sys.exit(p["exit"])
if "stdout" in p:
    sys.stdout.write(p["stdout"])
    sys.exit(0)
out = p.get("result") or {
    "stdin": raw,
    "env": {k: v for k, v in os.environ.items() if k.startswith("FLEET_")},
    "argv": sys.argv[1:],
}
sys.stdout.write(json.dumps(out))
"""
