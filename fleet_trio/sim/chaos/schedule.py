"""The chaos schedule: the job kinds the chaos fleet runs (node tasks, rc commands) and
:func:`make_schedule`, a pure function of ``(seed, duration)``: the same seed gives the same list
of :class:`Step`, on any machine."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

import attrs

from fleet_trio.sim.fleet import GPU_ROOT_ENV, NODE_DRAIN, NODE_KILL_GRACE

# -- the job kinds --------------------------------------------------------------------------

NODE_MARKER = "FLEET_JOB_ID"
RC_MARKER = "RC_JOB_ID"
LEAK_MARKER = "FLEET_TRIO_SIM_LEAK_JOB"
"""Carried by a leaking fake-VRAM holder instead of ``RC_JOB_ID`` (so the sweep misses it)."""

SLEEPER_SECONDS = 1.2
STUBBORN_SECONDS = 2.5
"""How long the node's ``stubborn`` task (it ignores SIGTERM) runs when left alone."""
MARK_LEAD = NODE_KILL_GRACE / 2
"""The interrupted mark comes when the drain ends, before the kill grace: a poller sees it
within the drain plus half the grace after the stop (a mark made after the kill shows only
once the whole grace has passed)."""
TRAP_MARGIN = 0.3
"""Seconds a stubborn job needs after its ack to have its ``trap '' TERM`` in place."""

NODE_KINDS: dict[str, int] = {"quick": 3, "fail": 2, "sleeper": 2, "stubborn": 1, "escape": 1}
"""Node task types of the chaos node and their weight in a schedule."""
RC_KINDS: dict[str, int] = {"lines": 3, "fail": 1, "slow": 2, "escape": 1, "leak": 1}
LINK_FAULT_WINDOW = 1.0
"""Seconds a latency, fail_http or drop fault lasts before the link heals."""
PROCESS_FAULTS = ("node_crash", "node_stop", "worker_crash", "worker_stop", "controller_restart")
LINK_FAULTS = ("latency", "fail_http", "drop", "half_open")

LOG_RUN = 'echo "$FLEET_JOB_ID" >> "$FLEET_TRIO_SIM_NODE_DIR/runs"'


def node_yaml(*, escape_task: bool = True) -> str:
    """The chaos node's config: short drain and grace, one task per node kind. Each run
    appends its job id to ``runs`` in the node's folder (the run counter)."""
    tasks = {
        "quick": f"{LOG_RUN}; echo '{{\"ok\": true}}'",
        "fail": f"{LOG_RUN}; echo boom >&2; exit 3",
        "sleeper": f"{LOG_RUN}; sleep {SLEEPER_SECONDS}; echo '{{\"slept\": true}}'",
        "stubborn": f"trap '' TERM; {LOG_RUN}; sleep {STUBBORN_SECONDS}; echo '{{\"late\": true}}'",
    }
    if escape_task:
        tasks["escape"] = (
            f"{LOG_RUN}; setsid sleep 300 </dev/null >/dev/null 2>&1 & echo '{{\"escaped\": true}}'"
        )
    return shell_tasks_yaml(tasks, drain_ms=int(NODE_DRAIN * 1000), kill_grace_s=NODE_KILL_GRACE)


def shell_tasks_yaml(
    tasks: dict[str, str],
    *,
    drain_ms: int,
    kill_grace_s: float,
    linger_s: float | None = None,
    node_lines: tuple[str, ...] = (),
) -> str:
    """A node config of ``sh -c`` tasks (name → script) with these timings (``linger_s``:
    ``poll_linger``, else the default); ``node_lines`` are more lines under ``node:`` (indented
    two spaces)."""
    lines = [
        "node:",
        *node_lines,
        "  timings:",
        f"    drain_timeout: {drain_ms}ms",
        f"    kill_grace: {int(kill_grace_s * 1000)}ms",
    ]
    if linger_s is not None:
        lines.append(f"    poll_linger: {int(linger_s * 1000)}ms")
    lines.append("tasks:")
    for name, script in tasks.items():
        lines += [f"  {name}:", f'    command: ["sh", "-c", {yaml_str(script)}]']
    return "\n".join(lines) + "\n"


def yaml_str(text: str) -> str:
    """``text`` as a double-quoted YAML scalar."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def rc_expected_output(lines: int) -> bytes:
    return b"".join(b"line %d\n" % i for i in range(1, lines + 1))


def rc_command(kind: str, lines: int) -> list[str]:
    """The command of an rc job of ``kind`` printing ``lines`` numbered lines."""
    pause = "0.15" if kind == "slow" else "0.01"
    body = f'i=1; while [ $i -le {lines} ]; do echo "line $i"; i=$((i+1)); sleep {pause}; done'
    if kind == "fail":
        body += "; exit 2"
    elif kind == "escape":
        body = "setsid sleep 300 </dev/null >/dev/null 2>&1 & " + body
    elif kind == "leak":
        # An escaped process (new session, no RC_JOB_ID, so no sweep finds it) holding 1 GiB
        # of the device's fake GPU: the holding file (named after its pid, docs/gpu.md) is
        # written right after the fork, so it exists before the job can end.
        body = (
            f'env -u {RC_MARKER} {LEAK_MARKER}="$RC_JOB_ID" setsid sleep 120 '
            "</dev/null >/dev/null 2>&1 & "
            'echo 1G > "$FLEET_TRIO_SIM_GPU_DIR/$!"; ' + body
        )
    return ["sh", "-c", body]


VERIFY_SCRIPT = f"""#!/bin/sh
# Chaos verify: the device's fake GPU must hold no memory of a live process.
dev=${{RC_DEVICE#*:}}; host=${{RC_DEVICE%%:*}}
dir="${{{GPU_ROOT_ENV}}}/${{host}}_${{dev}}"
for f in "$dir"/*; do
  pid=${{f##*/}}
  case "$pid" in ''|*[!0-9]*) continue;; esac
  if [ -d "/proc/$pid" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$pid/status" 2>/dev/null; then
    echo "fake VRAM still held by pid $pid" >&2
    exit 1
  fi
done
exit 0
"""


# -- the schedule ---------------------------------------------------------------------------


@attrs.frozen
class Step:
    """One scheduled action, ``at`` seconds after the schedule starts."""

    at: float
    action: str
    """``dispatch`` | ``submit`` | ``rc_kill`` | one of :data:`PROCESS_FAULTS` | ``link``."""
    target: str = ""
    """Node or worker name, device id (``chaos-w1:gpu0``), or link name."""
    kind: str = ""
    """Job kind, or link fault kind."""
    ref: str = ""
    """The job's name in the schedule (``n3``, ``r2``); ``rc_kill`` names the job it kills."""
    arg: float = 0.0
    """Lines of an rc job; fault duration or count."""

    def describe(self) -> str:
        parts = [f"{self.at:6.2f}s", self.action]
        for value in (self.target, self.kind, self.ref):
            if value:
                parts.append(value)
        if self.arg:
            parts.append(f"{self.arg:g}")
        return " ".join(parts)


@attrs.frozen
class FleetShape:
    nodes: tuple[str, ...] = ("node1", "node2")
    workers: tuple[str, ...] = ("worker1", "worker2")
    devices: tuple[str, ...] = ("chaos-w1:gpu0", "chaos-w1:gpu1", "chaos-w2:gpu0", "chaos-w2:gpu1")


def _pick(rng: random.Random, weights: Mapping[str, int]) -> str:
    names = list(weights)
    return rng.choices(names, weights=[weights[n] for n in names])[0]


def make_schedule(seed: int, duration: float = 3.0, shape: FleetShape = FleetShape()) -> list[Step]:
    """The schedule of ``seed``: a pure function of its arguments (a private RNG)."""
    rng = random.Random(f"fleet-trio-chaos/{seed}")
    steps: list[Step] = []
    fault = rng.choice(PROCESS_FAULTS)
    fault_at = round(rng.uniform(0.3, 0.7) * duration, 2)
    fault_target = ""
    if fault.startswith("node"):
        fault_target = rng.choice(shape.nodes)
    elif fault.startswith("worker"):
        fault_target = rng.choice(shape.workers)
    steps.append(Step(fault_at, fault, fault_target))
    for i in range(rng.randint(6, 10)):
        kind = _pick(rng, NODE_KINDS)
        at = round(rng.uniform(0, duration), 2)
        if i == 0 and fault == "node_stop":
            # a stubborn job in flight when the node drains: its interrupt must be visible
            kind, at = "stubborn", max(0.0, round(fault_at - rng.uniform(0.3, 1.0), 2))
        steps.append(Step(at, "dispatch", kind=kind, ref=f"n{i + 1}"))
    rc_refs: list[tuple[str, float]] = []
    for i in range(rng.randint(4, 6)):
        kind = _pick(rng, RC_KINDS)
        at = round(rng.uniform(0, duration), 2)
        lines = rng.randint(3, 12) if kind == "slow" else rng.randint(3, 40)
        ref = f"r{i + 1}"
        steps.append(Step(at, "submit", rng.choice(shape.devices), kind, ref, float(lines)))
        rc_refs.append((ref, at))
    for ref, at in rng.sample(rc_refs, k=min(len(rc_refs), rng.randint(0, 2))):
        steps.append(Step(round(at + rng.uniform(0.05, 1.0), 2), "rc_kill", ref=ref))
    links = [f"dispatcher->{n}" for n in shape.nodes] + [f"{w}->controller" for w in shape.workers]
    if fault == "node_stop":  # keep the polls of the draining node clean
        links.remove(f"dispatcher->{fault_target}")
    for _ in range(rng.randint(1, 2)):
        kind = rng.choice(LINK_FAULTS)
        arg = (
            round(rng.uniform(0.3, 1.0), 2)
            if kind in ("latency", "half_open")
            else float(rng.randint(1, 2))
        )
        if kind == "latency":
            arg = round(rng.uniform(0.02, 0.2), 3)
        steps.append(
            Step(round(rng.uniform(0, duration), 2), "link", rng.choice(links), kind, "", arg)
        )
    return sorted(steps, key=lambda s: (s.at, s.action, s.ref))


def link_fault_window(step: Step) -> float:
    """How long a ``link`` step's fault lasts: ``arg`` seconds for ``half_open``, else
    :data:`LINK_FAULT_WINDOW`."""
    return step.arg if step.kind == "half_open" else LINK_FAULT_WINDOW


def format_schedule(seed: int, steps: Sequence[Step]) -> str:
    return "\n".join([f"schedule of seed {seed}:", *("  " + s.describe() for s in steps)])


__all__ = [
    "VERIFY_SCRIPT",
    "FleetShape",
    "Step",
    "format_schedule",
    "make_schedule",
    "node_yaml",
    "rc_command",
    "rc_expected_output",
    "shell_tasks_yaml",
    "yaml_str",
]
