"""worker-protocol.md §15 items 61 and 130–136 (§9.1 labels wire rules; worker-process.md
§6.6–§6.7): the real worker as a trio task against the simulated controller, with real drop-in
probe scripts and, where an item needs one, a fake ``nvidia-smi`` on the prober's search path.

Probes that must change behaviour between passes count their own runs in a state file, so "pass
1" is always the startup registration and push ``i`` (0-based) is pass ``i + 2`` — no race with
the test. Every prober gets an explicit ``nvidia-smi`` search path (an empty tmp dir unless the
test installs a fake there), so a real ``nvidia-smi`` on the test host never leaks in. Item 129
lives in ``test_protocol_worker.py``.
"""

from __future__ import annotations

import logging
import pathlib
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio

from fleet_trio.durations import SECOND
from fleet_trio.sim import SimController, serve_controller
from fleet_trio.worker import probes
from fleet_trio.worker.probes import Prober
from fleet_trio.worker.worker import Worker
from tests.helpers import (
    FAST,
    FAST_CLIENT,
    config,
    dev,
    sh_script,
    sim,
    start_worker,
    wait_until,
)

PROBE_LOGGER = "fleet_trio.worker.probes"
PRESERVING = "preserving the last known detected labels of device"
GUARD = 25


# --------------------------------------------------------------------------------------------
# Harness
# --------------------------------------------------------------------------------------------


@attrs.frozen
class Setup:
    probe_dir: pathlib.Path
    bindir: pathlib.Path
    state: pathlib.Path


@pytest.fixture
def setup(tmp_path: pathlib.Path) -> Setup:
    s = Setup(tmp_path / "probe.d", tmp_path / "bin", tmp_path / "state")
    for d in (s.probe_dir, s.bindir, s.state):
        d.mkdir()
    return s


IB_ONCE = """1) echo '{"gpu0.ib":"mlx5_0"}' ;;\n"""
"""A :func:`counting` case: the first pass labels ``gpu0`` with ``ib``."""


def counting(s: Setup, name: str, cases: str) -> pathlib.Path:
    """A probe whose run number ``$n`` (1-based, kept in ``s.state/<name>``) selects a branch of
    ``case "$n" in <cases> esac``."""
    counter = s.state / name
    body = (
        f'n=$(( $(cat "{counter}" 2>/dev/null || echo 0) + 1 ))\n'
        f'echo "$n" > "{counter}"\n'
        f'case "$n" in\n{cases}\nesac'
    )
    return sh_script(s.probe_dir, name, body)


@asynccontextmanager
async def labelled_worker(
    s: Setup,
    *,
    devices: Sequence[str] = ("gpu0", "gpu1"),
    probe_interval: float = 0.15,
    heartbeat_interval: float = 0.1,
    probe_timeout: float = 5.0,
) -> AsyncIterator[SimController]:
    """A sim controller and a started worker whose prober runs ``s.probe_dir`` and looks for
    ``nvidia-smi`` only in ``s.bindir``, shut down gracefully at exit: the controller. The
    whole block is guarded by ``fail_after(GUARD)``."""
    ctrl = sim()
    with trio.fail_after(GUARD):
        async with trio.open_nursery() as nursery:
            url = await nursery.start(serve_controller, ctrl)
            cfg = config(
                url,
                devices,
                manual_clear=True,
                probe_dir=str(s.probe_dir),
                probe_timeout=round(probe_timeout * SECOND),
            )
            worker = Worker(
                cfg,
                timings=attrs.evolve(
                    FAST, probe_interval=probe_interval, heartbeat_interval=heartbeat_interval
                ),
                client_timings=FAST_CLIENT,
                prober=Prober(cfg, path=str(s.bindir)),
            )
            done = start_worker(nursery, worker)
            await ctrl.wait_for(lambda: worker.registrations >= 1, timeout=10)
            yield ctrl
            worker.request_shutdown("test over")
            with trio.fail_after(15):
                await done.wait()
            nursery.cancel_scope.cancel()


async def pushes(ctrl: SimController, count: int) -> list[Any]:
    """The first ``count`` labels pushes (waits up to 10 s for them)."""
    await ctrl.wait_for(lambda: len(ctrl.label_pushes()) >= count, timeout=10)
    return ctrl.label_pushes()[:count]


def preserving_warnings(caplog: pytest.LogCaptureFixture, device: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == PROBE_LOGGER
        and r.levelno == logging.WARNING
        and r.getMessage().startswith(f"{PRESERVING} {device}:")
    ]


@pytest.fixture
def no_builtins(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host whose built-in facts are all unavailable: the only way for a real pass to produce
    no host facts (``cpus`` is never omitted on a real machine)."""
    monkeypatch.setattr(probes, "builtin_host_facts", lambda: {})


# --------------------------------------------------------------------------------------------
# §15.4 Heartbeats
# --------------------------------------------------------------------------------------------


async def test_protocol_061_slow_probe_pass_never_stalls_heartbeats(setup: Setup) -> None:
    """A probe pass that does not end (its probe blocks on a gate file) while heartbeats go on
    at their 100 ms interval: five beats arrive while it is blocked, and no second pass starts
    beside it. Opened, the pass ends and its labels are pushed."""
    started, gate = setup.state / "started", setup.state / "gate"
    counting(
        setup,
        "10-slow",
        f"""1) echo '{{"slow":"no"}}' ;;
*) touch "{started}"
   while [ ! -e "{gate}" ]; do sleep 0.05; done
   echo '{{"slow":"yes"}}' ;;""",
    )
    async with labelled_worker(
        setup, probe_interval=0.15, heartbeat_interval=0.1, probe_timeout=GUARD
    ) as ctrl:
        # pass 1 (the registration's) answered at once; pass 2 is the periodic loop's
        await wait_until(started.exists, timeout=10, what="the second probe pass to block")
        blocked_at = trio.current_time()

        def beats_while_blocked() -> int:
            return sum(
                1
                for r in ctrl.requests("heartbeat")
                if r.outcome == "handled" and r.at > blocked_at
            )

        await wait_until(
            lambda: beats_while_blocked() >= 5, timeout=10, what="heartbeats during the pass"
        )
        # still blocked: no pass ended, none started beside it (passes are serialised)
        assert not ctrl.label_pushes()
        assert (setup.state / "10-slow").read_text().strip() == "2"
        gate.touch()
        (push,) = await pushes(ctrl, 1)
        assert push["labels"][""]["slow"] == "yes"
        assert ctrl.registrations()[0]["labels"][""]["slow"] == "no"


# --------------------------------------------------------------------------------------------
# §15.11 Labels
# --------------------------------------------------------------------------------------------


async def test_protocol_130_device_whose_probe_starts_failing_is_omitted_host_key_kept(
    setup: Setup,
) -> None:
    counting(setup, "10-ib", IB_ONCE + """*) echo 'ib probe broke' >&2; exit 1 ;;""")
    async with labelled_worker(setup) as ctrl:
        reg = ctrl.registrations()[0]
        assert reg["labels"]["gpu0"] == {"ib": "mlx5_0"}
        assert reg["labels"]["gpu1"] == {}
        (push,) = await pushes(ctrl, 1)
        labels = push["labels"]
        assert "gpu0" not in labels
        assert labels[""]["cpus"]
        assert labels["gpu1"] == {}
        # The controller keeps gpu0's last known facts; gpu1 got the refreshed host facts.
        assert ctrl.device(dev("gpu0")).detected_labels["ib"] == "mlx5_0"
        assert ctrl.device(dev("gpu1")).detected_labels == labels[""]


async def test_protocol_131_vanished_nvidia_smi_preserves_gpu_and_says_why(
    setup: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=PROBE_LOGGER)
    # Present for the first pass only: it removes itself after answering.
    sh_script(
        setup.bindir,
        "nvidia-smi",
        'echo "NVIDIA A100-SXM4-80GB, 81920, 80000, 550.54.15"\nrm -f -- "$0"',
    )
    async with labelled_worker(setup) as ctrl:
        reg = ctrl.registrations()[0]
        assert reg["labels"]["gpu0"] == {
            "vendor": "nvidia",
            "model": "NVIDIA A100-SXM4-80GB",
            "vram": "81920M",
            "vram_free": "80000M",
            "driver": "550.54.15",
        }
        assert not (setup.bindir / "nvidia-smi").exists()
        (push,) = await pushes(ctrl, 1)
        labels = push["labels"]
        assert "gpu0" not in labels
        assert labels[""]["cpus"]
        assert labels["gpu1"] == {}  # nvidia-smi only ever spoke for gpu0
        assert ctrl.device(dev("gpu0")).detected_labels["model"] == "NVIDIA A100-SXM4-80GB"
        warnings = preserving_warnings(caplog, "gpu0")
        assert warnings, caplog.text
        assert "nvidia-smi" in warnings[0]
        assert "failed" in warnings[0] and "omitted" in warnings[0]
        assert not preserving_warnings(caplog, "gpu1")


async def test_protocol_132_no_nvidia_smi_dropin_empty_object_clears_device(
    setup: Setup,
) -> None:
    counting(setup, "10-gpu0", IB_ONCE + """*) echo '{}' ;;""")
    async with labelled_worker(setup) as ctrl:
        assert ctrl.registrations()[0]["labels"]["gpu0"] == {"ib": "mlx5_0"}
        assert ctrl.device(dev("gpu0")).detected_labels["ib"] == "mlx5_0"
        (push,) = await pushes(ctrl, 1)
        labels = push["labels"]
        assert labels["gpu0"] == {}  # present and empty: an explicit clear
        assert labels["gpu1"] == {}
        gpu0 = ctrl.device(dev("gpu0")).detected_labels
        assert "ib" not in gpu0
        assert gpu0 == labels[""]


async def test_protocol_133_broken_dropin_does_not_freeze_other_devices(setup: Setup) -> None:
    counting(setup, "10-gpu0", IB_ONCE + """*) echo 'not json' ;;""")
    # An unrelated host-wide fact that changes every pass.
    counting(setup, "20-host", """*) echo "{\\"probe_pass\\":$n}" ;;""")
    async with labelled_worker(setup) as ctrl:
        reg = ctrl.registrations()[0]
        assert reg["labels"][""]["probe_pass"] == "1"
        first, second = await pushes(ctrl, 2)
        for number, push in ((2, first), (3, second)):
            labels = push["labels"]
            assert labels[""]["probe_pass"] == str(number)
            assert labels["gpu1"] == {}
            assert "gpu0" not in labels
        gpu1 = ctrl.device(dev("gpu1")).detected_labels
        assert int(gpu1["probe_pass"]) >= 3  # refreshed host facts reached gpu1
        gpu0 = ctrl.device(dev("gpu0")).detected_labels
        assert gpu0["ib"] == "mlx5_0"
        assert gpu0["probe_pass"] == "1"  # frozen at the last confirmed pass


@pytest.mark.usefixtures("no_builtins")
async def test_protocol_134_no_facts_anywhere_sends_null_facts_send_everything(
    setup: Setup,
) -> None:
    counting(setup, "10-gpu0", IB_ONCE + """*) echo '{}' ;;""")
    async with labelled_worker(setup) as ctrl:
        # A pass with facts sends every device, the confirmed-empty one as {}.
        assert ctrl.registrations()[0]["labels"] == {"gpu0": {"ib": "mlx5_0"}, "gpu1": {}}
        (push,) = await pushes(ctrl, 1)
        # A pass with no facts anywhere: `labels` present and null.
        assert "labels" in push
        assert push["labels"] is None
        assert ctrl.device(dev("gpu0")).detected_labels == {"ib": "mlx5_0"}


@pytest.mark.usefixtures("no_builtins")
async def test_protocol_135_only_unconfirmed_empty_devices_omitted_no_host_key(
    setup: Setup,
) -> None:
    counting(setup, "10-a", """1) echo '{"gpu0.a":"1","gpu1.a":"1"}' ;;\n*) exit 3 ;;""")
    sh_script(setup.probe_dir, "20-b", """echo '{"gpu1.b":"2"}'""")
    async with labelled_worker(setup, devices=("gpu0", "gpu1", "gpu2")) as ctrl:
        assert ctrl.registrations()[0]["labels"] == {
            "gpu0": {"a": "1"},
            "gpu1": {"a": "1", "b": "2"},
            "gpu2": {},
        }
        (push,) = await pushes(ctrl, 1)
        # gpu0: unconfirmed and empty → omitted; gpu1: unconfirmed but has facts → sent;
        # gpu2: confirmed empty → {}; no host facts → no "" key.
        assert push["labels"] == {"gpu1": {"b": "2"}, "gpu2": {}}
        assert ctrl.device(dev("gpu0")).detected_labels == {"a": "1"}
        assert ctrl.device(dev("gpu1")).detected_labels == {"b": "2"}


async def test_protocol_136_preserving_warning_once_per_episode(
    setup: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=PROBE_LOGGER)
    # Pass 1 good, 2–4 broken (episode one), 5 good (recovered), 6+ broken (episode two).
    counting(setup, "10-gpu0", """1|5) echo '{"gpu0.ib":"mlx5_0"}' ;;\n*) exit 1 ;;""")
    async with labelled_worker(setup) as ctrl:
        assert not preserving_warnings(caplog, "gpu0")
        sent = await pushes(ctrl, 7)  # passes 2..8
        present = ["gpu0" in p["labels"] for p in sent]
        assert present == [False, False, False, True, False, False, False]
        assert sent[3]["labels"]["gpu0"] == {"ib": "mlx5_0"}
        assert len(preserving_warnings(caplog, "gpu0")) == 2, caplog.text
        assert not preserving_warnings(caplog, "gpu1")
