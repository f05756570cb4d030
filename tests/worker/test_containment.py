"""Worker jobs under the cgroup backend (docs/containment.md): every escape variant, markers
stripped, is killed at the job's end and named in the worker's log; the job cgroup is
removed; ``--check`` and the config say which backend."""

from __future__ import annotations

import os
from pathlib import Path

import attrs
import pytest
import trio

from fleet_trio.errors import ConfigError
from fleet_trio.proc.containment import JOBS_DIR
from fleet_trio.worker.config.loader import config_from_mapping
from tests.helpers import dev, gone_within, running, until_terminal
from tests.proc.test_containment import VARIANTS, escape_command


@pytest.mark.parametrize("variant", VARIANTS)
async def test_a_worker_jobs_escapee_dies_with_it(
    variant: str, cgroup_parent: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="fleet_trio.worker")
    pidfile = tmp_path / "pid"

    def contained(c):  # type: ignore[no-untyped-def]
        return attrs.evolve(c, containment="cgroup", cgroup_base=cgroup_parent)

    with trio.fail_after(60):
        async with running(configure=contained) as (ctrl, worker):
            assert worker.containment is not None and worker.containment.name == "cgroup"
            job = ctrl.submit(dev("gpu0"), ["sh", "-c", escape_command(variant, pidfile)])
            assert await until_terminal(ctrl, job) == ["running", "succeeded"]
            pid = int(pidfile.read_text())
            assert await gone_within(pid, 10)
    lines = [r.getMessage() for r in caplog.records if "outlived the group" in r.getMessage()]
    assert lines == [f"job {job}: processes [{pid}] outlived the group and were reaped by job id"]
    assert any(r.getMessage().startswith("containment: cgroup") for r in caplog.records)
    jobs = Path(cgroup_parent, JOBS_DIR)
    assert [p for p in jobs.iterdir() if p.is_dir()] == []
    assert os.path.isdir(jobs)


def test_an_unknown_containment_names_its_key() -> None:
    raw = {"controller_url": "http://c:1", "devices": ["gpu0"], "containment": "jail"}
    with pytest.raises(ConfigError, match="containment"):
        config_from_mapping(raw)
    ok = config_from_mapping({**raw, "containment": "marker"})
    assert ok.containment == "marker"
