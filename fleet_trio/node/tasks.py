"""The YAML task registry and executor (node.md §6.6).

(Over 500 lines: the registry, the payload rules and the runner are one contract (what is
advertised is what can run); the output tee and the sweep value are the runner's own.)

A task is a command. It reads the dispatched ``payload`` (its exact raw bytes, or ``{}``) on
stdin and prints one JSON object on stdout, which becomes the job's ``data``.

- :class:`TaskRegistry` is built once from the config: what is advertised (supported tasks,
  families, in declaration order), payload validation with §6.6's messages, and
  :meth:`TaskRegistry.prepare`, which at ack time validates and names the per-job work dir
  (``fleet-job-<tag>-…``); a task that materializes raw members into files gets the dir and
  its files then, any other task when its job starts (:meth:`PreparedJob.make_work_dir`).
  Nothing here awaits: ack stays on the hot path.
- :class:`TaskRunner` executes a :class:`PreparedJob` through :func:`fleet_trio.proc.run.run`
  (own process group, SIGTERM → grace → SIGKILL on cancel, ``timeout`` as ``max_runtime``),
  on its own GPU device(s) for ``gpu: true`` / ``gpus: N`` tasks (taken from the node's
  :class:`~fleet_trio.node.placement.Placement` *before* the spawn, pinned through
  ``CUDA_VISIBLE_DEVICES``), maps the result to a job
  :data:`~fleet_trio.node.jobs.Outcome`, and removes the work dir whatever happens.

The child's environment gains ``FLEET_JOB_ID``, ``FLEET_TASK_TYPE``, ``FLEET_WORK_DIR``,
``FLEET_FAMILY``, ``FLEET_QUANT``, ``FLEET_FILE_<NAME>`` and the sweep marker
``FLEET_TRIO_SWEEP`` (:func:`sweep_value`). When a job ends, the sweep of ``fleet_trio.proc``
finds and kills the processes that left its process group (``setsid``, daemons) by that
marker, as the worker does by ``RC_JOB_ID``; the outcome ignores what it found (it is logged).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import trio

from fleet_trio.durations import go_duration_seconds
from fleet_trio.errors import WireError
from fleet_trio.logs import ENV_SECRETS, job_context
from fleet_trio.memory import format_size
from fleet_trio.node.config import (
    FamilyRule,
    FieldSpec,
    QuantRule,
    TaskDef,
    task_gpus,
    task_limits,
)
from fleet_trio.node.jobs import Done, Failed, Outcome
from fleet_trio.node.placement import AllocationError, Placement, pin_env
from fleet_trio.node.wire import JsonSyntaxError, msg_unsupported, scan_members, scan_object
from fleet_trio.proc.containment import AnyContainment
from fleet_trio.proc.run import run
from fleet_trio.proc.sinks import CappedBuffer, Sink, TailBuffer, TeeSink
from fleet_trio.proc.spec import JobSpec, Result

if TYPE_CHECKING:  # live log tail (fleet_trio.logbus)
    from fleet_trio.logbus import JobLog, LogBus
    from fleet_trio.node.metrics import NodeMetrics

log = logging.getLogger(__name__)

TAIL_BYTES = 400
"""Failure messages carry the last 400 bytes of the child's output (§0)."""
RESULT_CAP = 16 << 20
"""Most stdout kept for the result (16 MiB); a longer result is an error."""
WORK_DIR_PREFIX = "fleet-job-"


def work_dir_prefix(tag: str) -> str:
    """The name prefix of every work dir of the node with this tag: ``fleet-job-<tag>-``
    (the tag is the journal's, so a restarted node knows its predecessor's dirs)."""
    return f"{WORK_DIR_PREFIX}{tag}-"


_PLACEHOLDER = re.compile(r"\{(job_id|task_type|work_dir|family|quant|file\.[A-Za-z0-9_.-]+)\}")
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def _go_float64(value: object) -> bool:
    """A JSON number the reference node's float64 takes: finite (the scanner refuses
    ``1e400``) and, for an integer literal, within float64's range."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        float(value)
    except OverflowError:
        return False
    return True


_TYPE_CHECKS: dict[str, Callable[[object], bool]] = {
    "string": lambda v: isinstance(v, str),
    # the reference node decodes an integer into an int64: a literal outside it is refused
    "integer": lambda v: (
        isinstance(v, int) and not isinstance(v, bool) and INT64_MIN <= v <= INT64_MAX
    ),
    "number": _go_float64,
    "boolean": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "any": lambda v: True,
}


def payload_error(task: str, detail: str) -> WireError:
    return WireError(f"{task} payload: {detail}", status=400)


def validate_payload(
    task: str, schema: Mapping[str, FieldSpec], payload_raw: str | None
) -> dict[str, tuple[Any, str]]:
    """§6.6 validation at ack time. Returns ``{member: (value, raw)}`` of the payload object.

    ``payload_raw`` is the member's exact text (``None`` when absent). Absent or ``null`` is
    ``{}``. Undeclared members are ignored; ``null`` members count as absent.
    """
    members: dict[str, tuple[Any, str]] = {}
    earlier: dict[str, list[Any]] = {}  # overridden copies of declared members
    if payload_raw is not None:
        try:
            scanned = scan_members(payload_raw)
        except JsonSyntaxError as exc:
            raise payload_error(task, str(exc)) from None
        if scanned is None:
            if json.loads(payload_raw) is not None:
                raise payload_error(task, "must be a JSON object")
        else:
            for name, value, raw in scanned:
                if name in members and name in schema:
                    earlier.setdefault(name, []).append(members[name][0])
                members[name] = (value, raw)
    for name, spec in schema.items():
        # as Go's decoder, every copy of a member is decoded in turn: an earlier copy of the
        # wrong type is refused even when the last one (the one the task reads) is right
        check = _TYPE_CHECKS[spec.type]
        if any(v is not None and not check(v) for v in earlier.get(name, ())):
            raise payload_error(task, f"{name} must be a JSON {spec.type}")
        value = members.get(name, (None, ""))[0]
        if value is None or (spec.required and value == ""):
            if spec.required:
                hint = f" ({spec.hint})" if spec.hint else ""
                raise payload_error(task, f"{name} required{hint}")
            continue
        if not _TYPE_CHECKS[spec.type](value):
            raise payload_error(task, f"{name} must be a JSON {spec.type}")
        if spec.type == "object" and spec.non_empty and not value:
            raise payload_error(task, f"{name} must be a non-empty JSON object")
    return members


def _family_for(task: TaskDef, members: Mapping[str, tuple[Any, str]]) -> tuple[str, str]:
    """The footprint (family, quant) of one job, from the node's bindings (§5.3)."""
    spec = task.footprint
    if spec is None:
        return task.family, ""
    family = spec.family
    if isinstance(family, FamilyRule):
        if family.from_payload:
            value = members.get(family.from_payload, (None, ""))[0]
        else:
            value = task.family
        # a closed set (node.config refuses a payload rule without one): anything outside it
        # is refused at ack time, so payload text never reaches argv, env or the store
        if (
            family.from_payload
            and family.allowed
            and value not in (None, "")
            and (not isinstance(value, str) or value not in family.allowed)
        ):
            allowed = ", ".join(family.allowed)
            raise payload_error(task.name, f"{family.from_payload} must be one of {allowed}")
        if isinstance(value, str) and value:
            chosen = family.map.get(value, family.default) if family.map else value
        else:
            chosen = family.default
    else:
        chosen = family or task.family
    return chosen, _quant_for(task, spec.quant, chosen)


def _quant_for(task: TaskDef, rule: str | QuantRule, family: str) -> str:
    """A plain quant, or the first :class:`QuantRule` match over its source texts."""
    if isinstance(rule, str):
        return rule
    for source in rule.source:
        if source == "family":
            text = family
        else:
            name = source.removeprefix("env.")
            text = task.env.get(name, os.environ.get(name, ""))
        for prefix, quant in rule.starts_with.items():
            if text.startswith(prefix):
                return quant
        upper = text.upper()
        for needle, quant in rule.contains.items():
            if needle.upper() in upper:
                return quant
    return rule.default


def advertised_family(task: TaskDef) -> str:
    if task.family:
        return task.family
    if task.footprint is not None:
        family = task.footprint.family
        if isinstance(family, str):
            return family
        if not family.from_payload:
            return family.default  # "the task's family, else <default>"
    return ""


def _executable(argv0: str) -> bool:
    if "/" in argv0:
        return os.path.isfile(argv0) and os.access(argv0, os.X_OK)
    return shutil.which(argv0) is not None


@attrs.define
class PreparedJob:
    """A validated dispatch, ready to run: the argv, env, stdin and its work dir."""

    job_id: str
    task: TaskDef
    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str
    stdin: bytes
    work_dir: str
    files: dict[str, str]
    family: str
    quant: str
    devices: tuple[str, ...] = ()
    """GPU placement: the UUIDs of the devices the job was given (empty: none / unknown)."""
    sweep_id: str = ""
    """The value of the job's :data:`SWEEP_MARKER` (its escapees are found by it)."""
    placement_ticket: int | None = None
    """GPU placement: the job's place in line, taken at its ack (:meth:`TaskRunner.reserve`);
    ``None``: none taken (the runner asks when the job starts)."""
    deferred_dir: bool = False
    """The work dir is only named yet: :meth:`make_work_dir` creates it when the job starts
    (a task with no materialized files; its dispatch makes no directory on the event loop)."""
    _cleaned: bool = False

    def pin(self, devices: tuple[str, ...]) -> None:
        """GPU placement: run on ``devices`` (``CUDA_VISIBLE_DEVICES`` and
        ``NVIDIA_VISIBLE_DEVICES`` set to their UUIDs)."""
        self.devices = devices
        self.env.update(pin_env(devices))

    def make_work_dir(self) -> None:
        """Create a deferred work dir (blocking; ``0700``; never an existing path — a name
        somebody made first fails with ``FileExistsError``). A no-op when it exists already."""
        if self.deferred_dir:
            os.mkdir(self.work_dir, 0o700)
            self.deferred_dir = False

    def cleanup(self) -> None:
        """Remove the work dir. Idempotent; safe even when there is nothing to remove."""
        if self._cleaned:
            return
        self._cleaned = True
        if self.work_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)


class TaskRegistry:
    """The configured tasks: advertising and ack-time preparation."""

    def __init__(
        self,
        tasks: Sequence[TaskDef],
        *,
        base_dir: str = "",
        work_root: str | None = None,
        check_executables: bool = True,
        node_id: str = "",
        work_tag: str = "",
    ) -> None:
        self.base_dir = base_dir
        self.work_root = work_root
        self.work_tag = work_tag or secrets.token_hex(6)
        """Work dirs are ``fleet-job-<work_tag>-…`` (:func:`work_dir_prefix`). With a journal,
        its tag (set before the node serves); without one, a tag of this registry's own."""
        self.node_id = node_id
        self._tasks: dict[str, TaskDef] = {}
        for task in tasks:
            if not task.enabled:
                continue
            task = attrs.evolve(task, command=self._resolve_command(task.command))
            if check_executables and not _executable(task.command[0]):
                log.warning(
                    "task %s: %s is not an executable; not advertised", task.name, task.command[0]
                )
                continue
            self._tasks[task.name] = task
        self.supported: tuple[str, ...] = tuple(self._tasks)
        families = dict.fromkeys(map(advertised_family, self._tasks.values()))  # ordered, once
        self.families: tuple[str, ...] = tuple(fam for fam in families if fam)

    @property
    def sweep_scope(self) -> str:
        """The node's part of each job's sweep marker (:func:`sweep_value`):
        ``<node id>.<work tag>``. With a journal the tag is the journal's, so a restarted node
        finds its predecessors' processes by the tag alone, whatever node id they ran under
        (``fleet_trio.node.recovery.sweep_tagged``); without one it is this registry's own.
        Either way two nodes on one host never sweep each other's jobs that share an id, even
        under one node id (the hostname is the default, and tests run nodes side by side)."""
        return f"{self.node_id or 'run'}.{self.work_tag}"

    def _resolve(self, path: str) -> str:
        return os.path.normpath(os.path.join(self.base_dir, path)) if self.base_dir else path

    def _resolve_command(self, command: tuple[str, ...]) -> tuple[str, ...]:
        """Relative paths resolve against the YAML file's folder (§6.6, §10.15)."""
        if not self.base_dir:
            return command
        out = list(command)
        if "/" in out[0] and not os.path.isabs(out[0]):
            out[0] = self._resolve(out[0])
        for i in range(1, len(out)):
            arg = out[i]
            if (
                "/" in arg
                and not os.path.isabs(arg)
                and not arg.startswith("-")
                and "{" not in arg
                and os.path.exists(self._resolve(arg))
            ):
                out[i] = self._resolve(arg)
        return tuple(out)

    @property
    def work_dir_root(self) -> str:
        """The folder work dirs are made in (``work_root``, else the temporary folder)."""
        return os.path.abspath(self.work_root or tempfile.gettempdir())

    def get(self, task_type: str) -> TaskDef | None:
        return self._tasks.get(task_type)

    def probes(self) -> list[tuple[TaskDef, dict[str, Any]]]:
        return [(t, t.probe) for t in self._tasks.values() if t.probe is not None]

    def prepare(self, task_type: str, payload_raw: str | None, job_id: str) -> PreparedJob:
        """Validate and materialize (§2.3 step 5). Raises :class:`WireError` (400).

        On success the caller owns the work dir: it must call :meth:`PreparedJob.cleanup`
        if the job is not registered.
        """
        task = self._tasks.get(task_type)
        if task is None:
            raise WireError(msg_unsupported(task_type, self.supported), status=400)
        members = validate_payload(task.name, task.payload, payload_raw)
        family, quant = _family_for(task, members)
        files: dict[str, str] = {}
        deferred = not task.materialize
        if deferred:  # named now, made when the job starts (off the event loop)
            name = work_dir_prefix(self.work_tag) + secrets.token_hex(8)
            work_dir = os.path.join(self.work_dir_root, name)
        else:  # its payload files are written now: a failure is the dispatch's 400
            work_dir = tempfile.mkdtemp(prefix=work_dir_prefix(self.work_tag), dir=self.work_root)
        try:
            for name, filename in task.materialize.items():
                value, raw = members.get(name, (None, ""))
                if value is None:
                    files[name] = ""
                    continue
                path = os.path.join(work_dir, filename)
                try:
                    with open(path, "wb") as f:
                        f.write(raw.encode())
                except OSError as exc:
                    raise payload_error(task.name, f"{name}: {exc}") from None
                files[name] = path
        except BaseException:
            shutil.rmtree(work_dir, ignore_errors=True)
            raise
        values = {
            "job_id": job_id,
            "task_type": task.name,
            "work_dir": work_dir,
            "family": family,
            "quant": quant,
            **{f"file.{k}": v for k, v in files.items()},
        }
        argv = tuple(
            _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), a) for a in task.command
        )
        env = dict(task.env)
        sweep_id = sweep_value(self.sweep_scope, job_id)
        env.update(
            **{JOB_MARKER: job_id, SWEEP_MARKER: sweep_id},
            FLEET_TASK_TYPE=task.name,
            FLEET_WORK_DIR=work_dir,
            FLEET_FAMILY=family,
            FLEET_QUANT=quant,
        )
        for name, path in files.items():
            env[f"FLEET_FILE_{re.sub(r'[^A-Za-z0-9]', '_', name).upper()}"] = path
        cwd = self._resolve(task.cwd) if task.cwd else (self.base_dir or "")
        # Exactly the raw bytes of the payload member; `{}` when it is absent or null.
        absent = payload_raw is None or payload_raw.strip() == "null"
        stdin = b"{}" if payload_raw is None or absent else payload_raw.encode()
        return PreparedJob(
            job_id=job_id,
            task=task,
            argv=argv,
            env=env,
            cwd=cwd,
            stdin=stdin,
            work_dir=work_dir,
            files=files,
            family=family,
            quant=quant,
            sweep_id=sweep_id,
            deferred_dir=deferred,
        )


class BytesReceiveStream(trio.abc.ReceiveStream):
    """A receive stream over fixed bytes (the payload on the child's stdin), then EOF."""

    def __init__(self, data: bytes) -> None:
        self._data = memoryview(data)

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint()
        n = max_bytes if max_bytes else 65536
        chunk, self._data = self._data[:n], self._data[n:]
        return bytes(chunk)

    async def aclose(self) -> None:
        self._data = memoryview(b"")
        await trio.lowlevel.checkpoint()


CLEANUP_BOUND = 10.0
"""Seconds a finished job's work-dir removal may hold up its terminal state."""
SHUTDOWN_CLEANUP_BOUND = 1.0
"""The same for a job the shutdown cancelled: within the shutdown's slack, so a huge tree
cannot push the stop past its bound. What is left is removed by the next start's recovery
(every work dir of the journal's tag); without a journal it stays in the temporary folder
(logged)."""

PeakSampler = Callable[[PreparedJob, trio.Event, int], Awaitable[float | None]]
"""``sample(job, stop, pgid)``: samples a job's VRAM peak until ``stop`` is set (the
render-sampling hook, §5.3), started as soon as the child is spawned (``pgid`` = its pid)."""
PeakRecorder = Callable[[PreparedJob, float], Awaitable[None]]
"""Records a successful job's peak in the footprint store."""


def _tail_text(data: bytes) -> str:
    return data[-TAIL_BYTES:].decode("utf-8", errors="replace").strip()


def _with_tail(message: str, tail: str) -> str:
    return f"{message} ({tail})" if tail else message


def outcome_of(task: TaskDef, result: Result, stdout: CappedBuffer, stderr: TailBuffer) -> Outcome:
    """Map a finished child to a job outcome (§6.6 "Result")."""
    name = task.name
    err_tail = _tail_text(stderr.getvalue())
    if result.err is not None:
        return Failed(_with_tail(f"{name} failed: {result.err}", err_tail))
    if result.reason.startswith("max_runtime exceeded"):
        return Failed(f"{name} failed: timed out after {go_duration_seconds(task.timeout)}")
    if result.exit_code != 0 or (result.killed and result.reason.startswith("signal")):
        what = result.reason if result.reason.startswith("signal") else None
        what = what or f"exit status {result.exit_code}"
        return Failed(_with_tail(f"{name} failed: {what}", err_tail))
    if stdout.truncated:  # what the tail would show is the cut, not why
        cap = format_size(stdout.cap)
        return Failed(f"{name} failed: result is not a JSON object (stdout over the {cap} cap)")
    raw = stdout.getvalue()
    try:
        text = raw.decode("utf-8").strip(" \t\r\n")
        members = scan_object(text)
    except (UnicodeDecodeError, JsonSyntaxError):
        members = None
    if members is None:
        tail = _tail_text(raw) or err_tail
        return Failed(_with_tail(f"{name} failed: result is not a JSON object", tail))
    if members.get("deferred", (None, ""))[0] is True:
        code = members.get("code", (None, ""))[0]
        detail = members.get("detail", (None, ""))[0]
        reason = members.get("reason", (None, ""))[0]
        if isinstance(code, str) and code:
            return Failed(f"{code}: {detail if isinstance(detail, str) else ''}")
        if isinstance(reason, str) and reason:
            return Failed(reason)
        return Failed("deferred")
    if task.expect_file:
        path = members.get(task.expect_file, (None, ""))[0]
        try:
            ok = isinstance(path, str) and bool(path) and os.path.getsize(path) > 0
        except (OSError, ValueError):  # the job's own text: a NUL in it is a ValueError
            ok = False
        if not ok:
            return Failed(
                f"{name} failed: expected file {task.expect_file}={path!r} is missing or empty"
            )
    return Done(text.encode())


# -- live log tail: the job's output teed into the log bus (fleet_trio.logbus) ----------------


class _BusSink:
    """One stream of a job's bus log. A failing bus is logged once, then left out: the bus
    never fails a job (``Cancelled`` is not an ``Exception`` and goes through)."""

    def __init__(self, tee: JobTee, sink: Sink) -> None:
        self.tee = tee
        self.sink = sink

    async def write(self, data: bytes) -> None:
        if self.tee.broken:
            return
        try:
            await self.sink.write(data)
        except Exception:
            self.tee.broke("write")


class JobTee:
    """A job's log on the bus: its two stream sinks, the exit code seen, and the end."""

    def __init__(self, job_id: str, job_log: JobLog) -> None:
        self.job_id = job_id
        self.job_log = job_log
        self.broken = False
        self.exit_code: int | None = None
        self.cpu_seconds: float | None = None
        self.stdout: Sink = _BusSink(self, job_log.sink("stdout"))
        self.stderr: Sink = _BusSink(self, job_log.sink("stderr"))

    @classmethod
    def open(cls, bus: LogBus | None, job: PreparedJob) -> JobTee | None:
        """The job's log (the one dispatch opened, else a new one); ``None`` if the bus fails."""
        if bus is None:
            return None
        try:
            job_log = bus.get(job.job_id)
            if job_log is None:
                job_log = bus.open(job.job_id, meta=job_log_meta(job))
            if job_log.ended:  # a log kept from an earlier job with this id
                log.info("job %s: an ended log holds this id; no live log", job.job_id)
                return None
            return cls(job.job_id, job_log)
        except ValueError as exc:  # an id the bus refuses (see fleet_trio.logbus.spill)
            log.info("job %s: no live log: %s", job.job_id, exc)
        except Exception:
            log.exception("job %s: the live log is unavailable", job.job_id)
        return None

    def broke(self, what: str) -> None:
        if not self.broken:
            log.exception(
                "job %s: live log %s failed; the job goes on without it", self.job_id, what
            )
        self.broken = True

    def seen(self, result: Result) -> None:
        self.exit_code = result.exit_code if result.exit_code >= 0 else None
        self.cpu_seconds = None if result.usage is None else result.usage.cpu_seconds

    def finish(self, outcome: Outcome | None, failure: BaseException | None) -> None:
        """End the log with the job's terminal state (sync; never raises an ``Exception``)."""
        if isinstance(outcome, Done):
            state, reason = "done", ""
        elif isinstance(outcome, Failed):
            state, reason = "error", outcome.message or "deferred"
        elif _is_cancel(failure):
            state, reason = "error", "interrupted"
        else:
            state, reason = "error", f"internal error: {failure}" if failure else "internal error"
        try:
            if not self.job_log.ended:
                self.job_log.end(state, self.exit_code, reason, cpu_seconds=self.cpu_seconds)
        except Exception:
            self.broke("end")


def _log_sweep(job: PreparedJob, result: Result) -> None:
    """What the sweep of the job's escapees did; the job's outcome ignores it (as the
    worker's, worker-process.md §3.6)."""
    sweep = result.sweep
    if sweep.remaining:
        level, pids, what = logging.ERROR, sweep.remaining, "survived SIGKILL after the sweep"
    elif sweep.found:
        level, pids, what = (
            logging.WARNING,
            sweep.found,
            "outlived the group and were reaped by "
            + ("their cgroup" if sweep.scope == "cgroup" else "job id"),
        )
    else:
        return
    context = job_context(job_id=job.job_id, task=job.task.name)
    log.log(level, f"job %s: processes %s {what}", job.job_id, list(pids), extra=context)


def job_log_meta(job: PreparedJob) -> dict[str, str]:
    return {"task_type": job.task.name, "family": job.family, "quant": job.quant}


def _is_cancel(exc: BaseException | None) -> bool:
    if isinstance(exc, trio.Cancelled):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return all(_is_cancel(e) for e in exc.exceptions)
    return False


# -- end of the live log tail block -------------------------------------------------------------


JOB_MARKER = "FLEET_JOB_ID"
"""The environment variable that marks a job's processes (the per-job sampler reads it)."""

SWEEP_MARKER = "FLEET_TRIO_SWEEP"
"""The environment variable the sweep finds a job's escaped processes by. Its value,
:func:`sweep_value`, names the node as well as the job: a dispatcher that reuses another
node's job id (or a process that sets ``FLEET_JOB_ID`` itself) can never make this node's
sweep signal a process that is not one of its own jobs'."""


def sweep_value(scope: str, job_id: str) -> str:
    """``<scope>/<job_id>`` (``scope``: the node id), or the job id alone without a scope."""
    return f"{scope}/{job_id}" if scope else job_id


SPAWN_CONCURRENCY = 2
"""How many job spawns (and, separately, work-dir removals) run in threads at once."""


class TaskRunner:
    """Runs prepared jobs: GPU slot, process group, outcome, cleanup, optional footprint."""

    def __init__(
        self,
        *,
        kill_grace: float,
        placement: Placement | None = None,
        footprint_need: Callable[[PreparedJob], float | None] | None = None,
        sample_peak: PeakSampler | None = None,
        record_peak: PeakRecorder | None = None,
        spawn_concurrency: int = SPAWN_CONCURRENCY,
        bus: LogBus | None = None,
        containment: AnyContainment | None = None,
    ) -> None:
        self.kill_grace = kill_grace
        self.containment = containment
        """How each job is contained (``None``: the marker backend; docs/containment.md)."""
        self.bus = bus
        """Where each job's stdout and stderr are teed for the live tail (``None``: nowhere)."""
        # Spawns and work-dir removals run in worker threads; unbounded, a burst of dispatches
        # puts dozens of threads on the GIL at once and the event loop (the acks, health)
        # waits behind them. Bounded, a burst starts at the rate the machine forks.
        self.spawn_limiter = trio.CapacityLimiter(spawn_concurrency)
        self.cleanup_limiter = trio.CapacityLimiter(spawn_concurrency)
        # GPU placement: the node's devices (a stand-in: one anonymous device, as a lock)
        self.placement = placement if placement is not None else Placement.single()
        self.footprint_need = footprint_need
        self.sample_peak = sample_peak
        self.record_peak = record_peak
        self.metrics: NodeMetrics | None = None
        """Job starts, ends and durations (docs/metrics.md); ``None``: not counted."""
        # live log tail: with a job store, a job's log ends only once its outcome is published
        # (see hold_log_ends); None: at once, when the job's execution ends
        self._held_ends: dict[str, Callable[[], None]] | None = None
        self._running: set[str] = set()
        self._published: set[str] = set()

    def hold_log_ends(self) -> Callable[[str], None]:
        """From now on a job's live log ends only once its outcome is visible to polls.

        Returns the listener to add to ``JobStore.on_published``. Without it the log would end
        when the execution returns, a moment before the store publishes the outcome (after the
        journal's commit), and a client that polls right after the tail's ``end`` could read
        ``running``."""
        self._held_ends = {}
        return self._outcome_published

    def _outcome_published(self, job_id: str) -> None:
        if self._held_ends is None:
            return
        end = self._held_ends.pop(job_id, None)
        if end is not None:
            end()
        elif job_id in self._running:  # published first (a drain's mark): end when it ends
            self._published.add(job_id)

    def _end_log(self, job_id: str, end: Callable[[], None]) -> None:
        self._running.discard(job_id)
        if self._held_ends is None or job_id in self._published:
            self._published.discard(job_id)
            end()
        else:
            self._held_ends[job_id] = end

    async def execute(self, job: PreparedJob) -> Outcome:
        context = job_context(job_id=job.job_id, task=job.task.name)  # structured logs
        log.info("job %s: started (%s)", job.job_id, job.task.name, extra=context)
        tee = JobTee.open(self.bus, job)  # live log tail
        if tee is not None and self._held_ends is not None:
            self._running.add(job.job_id)
        started = trio.current_time()  # metrics
        if self.metrics is not None:
            self.metrics.job_started(job.task.name)
        outcome: Outcome | None = None
        failure: BaseException | None = None
        try:
            if job.deferred_dir:  # the work dir its dispatch only named
                try:
                    await trio.to_thread.run_sync(job.make_work_dir, limiter=self.cleanup_limiter)
                except OSError as exc:
                    why = exc.strerror or str(exc)
                    outcome = Failed(f"{job.task.name} failed: cannot create its work dir: {why}")
                    return outcome
            wanted = task_gpus(job.task)
            if wanted:
                outcome = await self._run_placed(job, wanted, tee)
            else:
                outcome = await self._run(job, tee)
            return outcome
        except BaseException as exc:  # live log tail: noted for the log's end, re-raised
            failure = exc
            raise
        finally:
            self.unreserve(job)  # a place in line not used (no work dir, a cancel before it)
            # The work dir's rmtree is file I/O: off the event loop, bounded, never lost to a
            # cancel (abandoned after the bound, the thread still finishes the removal).
            shutdown = isinstance(failure, trio.Cancelled) or (
                isinstance(failure, BaseExceptionGroup)
                and failure.subgroup(trio.Cancelled) is not None
            )
            bound = SHUTDOWN_CLEANUP_BOUND if shutdown else CLEANUP_BOUND
            with trio.move_on_after(bound, shield=True) as removal:
                await trio.to_thread.run_sync(
                    job.cleanup, abandon_on_cancel=True, limiter=self.cleanup_limiter
                )
            if removal.cancelled_caught:
                log.warning(
                    "job %s: work dir removal still running after %gs; going on without it (%s)",
                    job.job_id,
                    bound,
                    job.work_dir,
                    extra=context,
                )
            if tee is not None:  # live log tail (ended once the outcome is published)
                self._end_log(job.job_id, functools.partial(tee.finish, outcome, failure))
            if self.metrics is not None:
                state = "done" if isinstance(outcome, Done) else "error"
                self.metrics.job_finished(job.task.name, state, trio.current_time() - started)
            if outcome is not None:  # structured logs: one line, the first of the error
                ended = (
                    "done"
                    if isinstance(outcome, Done)
                    else "error: " + (outcome.message or "deferred").partition("\n")[0]
                )
                log.info("job %s: %s", job.job_id, ended, extra=context)

    def _need(self, job: PreparedJob) -> float | None:
        """The VRAM (GiB) a GPU job waits for: its known footprint, ``None`` when unknown."""
        if self.footprint_need is not None and self.placement.knows_vram:
            return self.footprint_need(job)
        return None

    def reserve(self, job: PreparedJob) -> None:
        """GPU placement: take the job's place in line now (sync; the node calls it at the
        job's ack), so waiting jobs get devices in the order the node acked them, whichever of
        their runners asks first (jobs acked together start in any order). A no-op for a job
        without ``gpu``/``gpus`` or with a place already; a request the node can never meet
        takes none (the job fails with that error when it runs)."""
        wanted = task_gpus(job.task)
        if not wanted or job.placement_ticket is not None:
            return
        try:
            job.placement_ticket = self.placement.reserve(wanted, self._need(job))
        except AllocationError:
            return

    def unreserve(self, job: PreparedJob) -> None:
        """Give back a place in line the job did not use (it never ran). Idempotent."""
        ticket, job.placement_ticket = job.placement_ticket, None
        if ticket is not None:
            self.placement.release(ticket)

    def discard(self, job: PreparedJob) -> None:
        """A job that will never run: its place in line and its prepared files go."""
        self.unreserve(job)
        job.cleanup()

    async def _run_placed(self, job: PreparedJob, wanted: int, tee: JobTee | None) -> Outcome:
        """GPU placement: wait (FIFO) for ``wanted`` devices that fit the job's known
        footprint (its place in line from :meth:`reserve`, else one taken now), run the job
        pinned to them, give them back on every path."""
        ticket, job.placement_ticket = job.placement_ticket, None
        need = self._need(job)  # (a ticket from reserve carries the need it was taken with)

        def waiting() -> None:
            log.info(
                "job %s: waiting for %d free GPU device(s)%s",
                job.job_id,
                wanted,
                f" with {need:g} GiB free" if need is not None else "",
                extra=job_context(job_id=job.job_id, task=job.task.name),
            )

        try:
            async with self.placement.acquire(
                wanted, need, ticket=ticket, on_wait=waiting
            ) as devices:
                job.pin(devices)
                return await self._run(job, tee)
        except AllocationError as exc:
            return Failed(f"{job.task.name} failed: {exc}")

    async def _run(self, job: PreparedJob, tee: JobTee | None = None) -> Outcome:
        stdout = CappedBuffer(RESULT_CAP)
        stderr = TailBuffer(TAIL_BYTES)
        # live log tail: the result buffers first, then the bus
        out_sink: Sink = stdout if tee is None else TeeSink(stdout, tee.stdout)
        err_sink: Sink = stderr if tee is None else TeeSink(stderr, tee.stderr)
        spec = JobSpec(
            command=job.argv,
            cwd=job.cwd,
            env=job.env,
            grace_ceiling=self.kill_grace,
            max_runtime=job.task.timeout,
            stderr_sink=err_sink,
            stdin_source=BytesReceiveStream(job.stdin),
            # escapees of the group, found by FLEET_TRIO_SWEEP=<node id>/<job id>: never a
            # process of another node or user that merely carries the same FLEET_JOB_ID
            sweep_job_id=job.sweep_id or job.job_id,
            sweep_marker=SWEEP_MARKER if job.sweep_id else JOB_MARKER,
            env_unset=ENV_SECRETS,  # the node's token is not the job's
            containment=self.containment,
            cgroup_key=job.job_id,
            limits=task_limits(job.task),
        )
        sampler = self.sample_peak if job.task.footprint is not None else None
        peaks: list[float | None] = []
        stop = trio.Event()

        async def sample(pgid: int) -> None:
            assert sampler is not None
            try:
                peaks.append(await sampler(job, stop, pgid))
            except Exception:
                log.exception(
                    "job %s: VRAM sampling failed; no footprint",
                    job.job_id,
                    extra=job_context(job_id=job.job_id, task=job.task.name),
                )

        if sampler is None:
            result = await run(spec, out_sink, spawn_limiter=self.spawn_limiter)
        else:
            async with trio.open_nursery() as nursery:
                try:
                    # the first sample is taken as soon as the child exists (§5.3)
                    result = await run(
                        spec,
                        out_sink,
                        on_spawn=lambda pid: nursery.start_soon(sample, pid),
                        spawn_limiter=self.spawn_limiter,
                    )
                finally:
                    stop.set()
        _log_sweep(job, result)
        if result.usage is not None:
            log.info(
                "job %s: used %s",
                job.job_id,
                result.usage.text(),
                extra=job_context(job_id=job.job_id, task=job.task.name),
            )
            if self.metrics is not None:
                self.metrics.job_cpu(job.task.name, result.usage.cpu_seconds)
        if tee is not None:
            tee.seen(result)
        outcome = outcome_of(job.task, result, stdout, stderr)
        peak = peaks[0] if peaks else None
        recorder = self.record_peak
        if isinstance(outcome, Done) and peak is not None and peak > 0 and recorder is not None:
            try:
                await recorder(job, peak)
            except Exception:
                log.exception(
                    "job %s: recording the footprint failed",
                    job.job_id,
                    extra=job_context(job_id=job.job_id, task=job.task.name),
                )
        return outcome


__all__ = [
    "JOB_MARKER",
    "RESULT_CAP",
    "SPAWN_CONCURRENCY",
    "SWEEP_MARKER",
    "TAIL_BYTES",
    "BytesReceiveStream",
    "JobTee",
    "PeakRecorder",
    "PeakSampler",
    "PreparedJob",
    "TaskRegistry",
    "TaskRunner",
    "advertised_family",
    "outcome_of",
    "payload_error",
    "sweep_value",
    "validate_payload",
    "work_dir_prefix",
]
