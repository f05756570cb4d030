"""The scripted story: each ``step_*`` drives the fleet, observes the outcome and compares
it with what the step expects (docs/demo.md lists the steps)."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import trio

from fleet_trio.gpu.fake import init_device
from fleet_trio.sim.controller.records import TERMINAL
from fleet_trio.sim.demo.console import TAIL_COLOURS, Console
from fleet_trio.sim.demo.files import GPU_GIB
from fleet_trio.sim.demo.model import LEAK_GIB, RUN_MARKER, Fleet, RcOutcome, Step
from fleet_trio.sim.demo.report import _short, marked_processes, one_line
from fleet_trio.sim.demo.tails import Tail, follow

if TYPE_CHECKING:
    from fleet_trio.sim.dispatcher import DispatchRecord


PLAN = tuple(
    tuple(cell.strip() for cell in row.split("|"))
    for row in """
render-ok | node | a node job that succeeds | done
footprint | node | its measured VRAM peak is advertised in health | demo-diffusion >= 2 GiB
two-gpus | node | two render jobs at once on the two-GPU node | both done, on 2 devices, at once
render-fail | node | a node job that fails | error, exit status 2
train-ok | worker gpu0 | an rc job that succeeds | succeeded, exit 0
train-fail | worker gpu1 | an rc job that fails | failed, exit 3
kill | worker gpu0 | an rc job killed by `rc kill` | killed: cancelled
timeout | worker gpu1 | an rc job past its max_runtime of 2 s | killed: max_runtime exceeded
escape | worker gpu0 | an rc job whose helper escapes its process group | succeeded, escapee swept
leak | worker gpu1 | an rc job that leaks fake VRAM; verify fails | gpu1 unhealthy (fault)
clear | worker gpu1 | free the memory, `rc clear`, run a job again | gpu1 ready, job succeeded
drain | node | node shutdown with a job in flight | error: interrupted
late-dispatch | node | a dispatch sent during that drain | refused: 503 node draining
no-leftovers | host | no process of any demo job is left | none
""".strip().splitlines()
)
"""name | where | what | expected, one step a row; ``step_NAME`` (dashes as underscores) runs
it. The leak step's device is quarantined: the controller says unhealthy."""


class Story:
    """The scripted steps, in order. Each ``step_*`` coroutine fills in its :class:`Step`."""

    def __init__(self, con: Console, fleet: Fleet, *, keep_running: bool) -> None:
        self.con = con
        self.fleet = fleet
        self.keep_running = keep_running
        self._colour = 0
        self.steps = [Step(name, where, what, expected) for name, where, what, expected in PLAN]
        self._late_record: DispatchRecord | None = None

    def next_colour(self) -> str:
        self._colour += 1
        return TAIL_COLOURS[self._colour % len(TAIL_COLOURS)]

    # -- running ------------------------------------------------------------------------------

    async def run(self) -> None:
        con = self.con
        total = len(self.steps)
        for index, step in enumerate(self.steps, 1):
            if self.keep_running and step.name in ("drain", "late-dispatch"):
                step.status, step.observed = "skipped", "skipped (--keep-running)"
                step.ok = True
                continue
            head = con.paint(f"[{con.elapsed():5.1f}s]", "dim")
            title = con.paint(f"{index:>2}/{total} {step.name}", "bold")
            con.say(f"{head} {title}  {step.what} ({step.where})")
            step.status = step.observed = "interrupted"  # unless it gets to the end
            try:
                await getattr(self, "step_" + step.name.replace("-", "_"))(step)
            except trio.TooSlowError:
                step.observed = "timed out" if step.observed == "interrupted" else step.observed
                step.ok = False
            except Exception as exc:  # a step that broke is a mismatch, not a crash
                step.observed = f"error: {_short(repr(exc), 60)}"
                step.ok = False
            step.status = "ok" if step.ok else "MISMATCH"
            self._report(step)

    def note(self, step: Step, text: str) -> None:
        """A line about what the step did or saw, printed now and kept on the step."""
        step.notes.append(one_line(text))
        self.dim(step.notes[-1])

    def dim(self, text: str) -> None:
        self.con.say(f"      {self.con.paint(text, 'dim')}")

    def _report(self, step: Step) -> None:
        con = self.con
        if step.ok:
            verdict = con.paint("ok", "green", "bold")
            con.say(f"      -> {step.observed}  {verdict}")
        else:
            verdict = con.paint("MISMATCH", "red", "bold")
            con.say(f"      -> {step.observed}  {verdict} (expected: {step.expected})")

    # -- helpers -------------------------------------------------------------------------------

    async def rc_job(
        self,
        label: str,
        device: str,
        command: Sequence[str],
        *,
        max_runtime: int = 0,
        env: dict[str, str] | None = None,
        during: Callable[[str, Tail], Any] | None = None,
    ) -> RcOutcome:
        """Submit an rc job, follow its tail, run ``during(job_id, tail)`` alongside, and
        return the terminal report the controller accepted."""
        f = self.fleet
        full_env = {
            RUN_MARKER: f.files.run_id,
            "FLEET_TRIO_FAKE_GPU_DIR": f.files.fake_gpu(device),
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        job_id = f.ctrl.submit(
            f.device(device),
            list(command),
            env=full_env,
            max_runtime_seconds=max_runtime,
            submitter="demo@fleet-trio",
        )
        self.dim(f"rc run -d on {f.device(device)}: job {job_id}")
        tail = Tail(label, self.next_colour())
        try:
            with trio.fail_after(30):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(
                        functools.partial(
                            follow,
                            self.con,
                            tail,
                            f.worker_tail,
                            job_id,
                            ready=functools.partial(
                                f.ctrl.wait_for,
                                lambda: f.worker.bus.get(job_id) is not None,
                                timeout=20,
                            ),
                        )
                    )
                    if during is not None:
                        nursery.start_soon(during, job_id, tail)
                    await f.ctrl.wait_for(
                        lambda: any(s in TERMINAL for s in f.ctrl.statuses(job_id)),
                        timeout=25,
                    )
                    with trio.move_on_after(5):
                        await tail.finished.wait()
                    nursery.cancel_scope.cancel()
        except trio.TooSlowError:
            f.ctrl.kill(job_id)  # do not leave it running into the next steps
            raise
        report = f.ctrl.status_reports(job_id)[-1]
        return RcOutcome(job_id, report.state, report.exit_code, report.reason, tail)

    def count(self, n: int, delay: float, code: int, word: str) -> list[str]:
        return [
            self.fleet.files.python,
            self.fleet.files.script("count.py"),
            str(n),
            f"{delay:g}",
            str(code),
            word,
        ]

    async def node_job(
        self,
        job_id: str,
        task_type: str,
        payload: dict[str, Any],
        *,
        family: str | None = None,
        during: Callable[[DispatchRecord, Tail], Any] | None = None,
        wait: bool = True,
    ) -> tuple[DispatchRecord, Tail]:
        f = self.fleet
        rec = await f.disp.submit(task_type, model_family=family, payload=payload, job_id=job_id)
        tail = Tail(job_id, self.next_colour())
        if rec.state == "unplaced":
            tail.finished.set()
            return rec, tail
        self.dim(f"dispatched to {rec.node}: 202 accepted")
        f.nursery.start_soon(
            functools.partial(follow, self.con, tail, f.node.url, job_id, gone=f.node_done.is_set)
        )
        if during is not None:
            await during(rec, tail)
        if wait:
            await f.disp.wait(job_id, timeout=30)
            with trio.move_on_after(5):
                await tail.finished.wait()
        return rec, tail

    # -- the steps --------------------------------------------------------------------------

    async def step_render_ok(self, step: Step) -> None:
        rec, _ = await self.node_job(
            "render-ok", "render", {"steps": 4, "hold": "2G"}, family="demo-diffusion"
        )
        step.observed = rec.state if rec.state != "error" else f"error: {rec.error}"
        step.ok = rec.state == "done"

    async def step_footprint(self, step: Step) -> None:
        f = self.fleet
        url = f.node.url.rstrip("/")

        def advertised() -> float | None:
            body = f.disp.health(url) or {}
            for entry in body.get("model_footprints") or ():
                if entry.get("model_family") == "demo-diffusion":
                    peak = entry.get("vram_peak_gb")
                    if isinstance(peak, int | float):
                        return float(peak)
            return None

        try:
            peak: float | None = await f.disp.wait_for(advertised, timeout=5)
        except trio.TooSlowError:
            peak = None
        if peak is None:
            step.observed = "no footprint advertised"
            step.ok = False
            return
        step.observed = f"demo-diffusion {peak:g} GiB"
        self.note(
            step,
            "render-ok held 2 GiB of fake VRAM; health advertises the peak x1.2, and the "
            "dispatcher now sends demo-diffusion jobs only where that much is free",
        )
        step.ok = peak >= 2.0

    async def step_two_gpus(self, step: Step) -> None:
        f = self.fleet
        payload = {"steps": 6, "hold": "1G"}
        recs: list[DispatchRecord] = []

        async def one(job_id: str) -> None:
            rec, _ = await self.node_job(job_id, "render", payload, family="demo-diffusion")
            recs.append(rec)

        async with trio.open_nursery() as nursery:
            for job_id in ("render-gpu-a", "render-gpu-b"):
                nursery.start_soon(one, job_id)
        results = [r.result for r in recs if r.state == "done" and isinstance(r.result, dict)]
        if len(results) != 2:
            states = ", ".join(f"{r.job_id}: {r.state} {r.error or ''}".strip() for r in recs)
            step.observed = f"not both done ({states})"
            step.ok = False
            return
        devices = {str(r.get("device", "")) for r in results}
        overlap = max(float(r["started"]) for r in results) < min(
            float(r["ended"]) for r in results
        )
        health = f.disp.health(f.node.url.rstrip("/")) or {}
        listed = [d.get("uuid") for d in health.get("gpu_devices") or ()]
        self.note(step, f"health lists gpu_devices {listed}")
        self.note(
            step,
            "each job ran with CUDA_VISIBLE_DEVICES set to its own device's UUID: "
            + ", ".join(sorted(devices)),
        )
        step.observed = f"both done, on {len(devices - {''})} devices" + (
            ", at once" if overlap else ", one after the other"
        )
        step.ok = len(devices - {""}) == 2 and devices <= set(listed) and overlap

    async def step_render_fail(self, step: Step) -> None:
        rec, _ = await self.node_job(
            "render-fail", "render", {"steps": 2, "fail": True}, family="demo-diffusion"
        )
        error = rec.error or ""
        step.observed = rec.state if rec.state != "error" else f"error, {_short(error)}"
        if "exit status 2" in error:
            step.observed = "error, exit status 2"
        self.note(step, f"error: {error}")
        step.ok = rec.state == "error" and "exit status 2" in error

    async def step_train_ok(self, step: Step) -> None:
        out = await self.rc_job("train-ok", "gpu0", self.count(4, 0.2, 0, "batch"))
        step.observed = f"{out.state}, exit {out.exit_code}"
        step.ok = (out.state, out.exit_code) == ("succeeded", 0)

    async def step_train_fail(self, step: Step) -> None:
        out = await self.rc_job("train-fail", "gpu1", self.count(2, 0.2, 3, "batch"))
        step.observed = f"{out.state}, exit {out.exit_code}"
        step.ok = (out.state, out.exit_code) == ("failed", 3)

    async def step_kill(self, step: Step) -> None:
        ctrl = self.fleet.ctrl

        async def kill_after_output(job_id: str, tail: Tail) -> None:
            if await tail.wait_line(r"^tick 3") is not None:
                self.note(step, "rc kill after the third line of output")
            else:
                self.note(step, "rc kill (the third line of output did not show up)")
            ctrl.kill(job_id)

        out = await self.rc_job(
            "kill", "gpu0", self.count(0, 0.2, 0, "tick"), during=kill_after_output
        )
        step.observed = f"{out.state}: {out.reason}" if out.reason else out.state
        step.ok = out.state == "killed" and out.reason == "cancelled"

    async def step_timeout(self, step: Step) -> None:
        out = await self.rc_job("timeout", "gpu1", self.count(0, 0.3, 0, "tick"), max_runtime=2)
        step.observed = f"{out.state}: {out.reason}" if out.reason else out.state
        step.ok = out.state == "killed" and out.reason.startswith("max_runtime exceeded")

    async def step_escape(self, step: Step) -> None:
        from fleet_trio.proc.procfs import pid_alive

        files = self.fleet.files
        out = await self.rc_job("escape", "gpu0", [files.python, files.script("escape.py")])
        m = None
        for line in out.tail.lines:
            m = re.search(r"pid (\d+)", line)
            if m is not None:
                break
        if m is None:
            step.observed = f"{out.state}; escapee pid not seen in the output"
            step.ok = False
            return
        pid = int(m.group(1))
        gone = not pid_alive(pid)
        if gone:
            self.note(
                step, f"pid {pid} was gone when the job's report arrived (the RC_JOB_ID sweep)"
            )
        else:
            self.note(step, f"pid {pid} was still alive when the job's report arrived")
        step.observed = f"{out.state}, escapee " + ("swept" if gone else "still alive")
        step.ok = out.state == "succeeded" and gone

    async def step_leak(self, step: Step) -> None:
        f = self.fleet
        files = f.files
        device = f.device("gpu1")
        out = await self.rc_job(
            "leak", "gpu1", [files.python, files.script("leak.py"), f"{LEAK_GIB:g}"]
        )
        dev = f.ctrl.device(device)
        faults = f.ctrl.faults(device)
        if faults:
            self.note(step, f"fault: {faults[-1]}")
        self.note(step, f"the job itself ended {out.state} (exit {out.exit_code})")
        step.observed = f"gpu1 {dev.state}" + (f" ({dev.reason})" if dev.reason else "")
        step.ok = (
            out.state == "succeeded"
            and dev.state == "unhealthy"
            and dev.reason == "fault"
            and any(r.startswith("verify failed: ") for r in faults)
        )

    async def step_clear(self, step: Step) -> None:
        f = self.fleet
        device = f.device("gpu1")
        await trio.to_thread.run_sync(
            init_device, f.files.fake_gpu("gpu1"), "Fake GPU 1 (demo worker)", GPU_GIB
        )
        self.note(step, "operator freed the leaked memory, then ran `rc clear demo-box:gpu1`")
        try:
            f.ctrl.clear(device)
        except Exception as exc:  # SimError: the device was not clearable
            step.observed = f"rc clear refused: {exc}"
            step.ok = False
            return
        cleared = f.ctrl.device(device).state
        out = await self.rc_job("after-clear", "gpu1", self.count(2, 0.2, 0, "batch"))
        dev = f.ctrl.device(device)
        step.observed = f"gpu1 {dev.state}, job {out.state}"
        step.ok = cleared == "ready" and dev.state == "ready" and out.state == "succeeded"

    async def step_drain(self, step: Step) -> None:
        f = self.fleet

        async def drain_when_running(rec: DispatchRecord, tail: Tail) -> None:
            await tail.wait_line(r"^epoch 4/")
            self.note(
                step, "node shutdown requested while the job runs (drain_timeout 2s, kill_grace 2s)"
            )
            f.node.request_shutdown("fleet-trio demo: node drain")

        rec, tail = await self.node_job(
            "train-drain",
            "train",
            {"epochs": 400},
            family="demo-trainer",
            during=drain_when_running,
            wait=False,
        )
        # the late dispatch belongs to the drain window: it runs right away, reported next
        self._late_record = await f.disp.submit(
            "render", model_family="demo-diffusion", payload={"steps": 1}, job_id="render-late"
        )
        with trio.fail_after(20):
            await f.node_done.wait()
        with trio.move_on_after(3):
            await tail.finished.wait()
        view = f.node.store.get("train-drain")
        table = "gone" if view is None else view.state.value
        if view is not None and view.error:
            table += f": {view.error}"
        seen = " -> ".join(rec.states_seen) or "nothing"
        if rec.terminal:
            self.note(step, f"dispatcher polls saw: {seen}; its record: {rec.state}: {rec.error}")
        else:
            self.note(
                step,
                f"dispatcher polls saw: {seen}; the node was gone before a poll could see "
                "the final state (the node's own table shows it)",
            )
        self.note(step, f"node's job table after exit: {table}")
        step.observed = table
        step.ok = view is not None and view.state.value == "error" and view.error == "interrupted"
        if rec.terminal and rec.error != "interrupted":
            step.ok = False
            step.observed += f" (dispatcher saw {rec.state}: {rec.error})"

    async def step_late_dispatch(self, step: Step) -> None:
        rec = self._late_record
        if rec is None:
            step.observed = "not dispatched (the drain step did not run)"
            step.ok = False
            return
        refusals = [(status, reason) for _node, status, reason in rec.attempts]
        self.note(step, f"dispatcher record: {rec.error or rec.state}")
        step.observed = (
            f"refused: {refusals[0][0]} {refusals[0][1]}" if refusals else f"{rec.state}"
        )
        step.ok = rec.state == "unplaced" and (503, "node draining") in refusals

    async def step_no_leftovers(self, step: Step) -> None:
        pids = await trio.to_thread.run_sync(marked_processes, self.fleet.files.run_id)
        step.observed = "none" if not pids else f"{len(pids)} left: {pids}"
        step.ok = not pids
