"""Process supervision shared by node and worker.

Run a job as its own process group and always turn it into an honest ``Result``
(:func:`run`; PTY sessions: :mod:`fleet_trio.proc.pty`; both supervised by the one
:class:`~fleet_trio.proc.supervisor.Supervisor`), sweep escaped processes by their
``RC_JOB_ID`` marker, reporting as reaped only what it has seen gone
(:func:`sweep_job_survivors`), prove the host clean after a crash
(:func:`recovery_proof_for`), and run a directory of scripts under a budget
(:func:`run_scripts`).
"""

from fleet_trio.proc.recovery import RecoveryProof, boot_id, recovery_proof_for
from fleet_trio.proc.run import run
from fleet_trio.proc.scripts import ScriptKind, ScriptOutcome, ScriptPass, run_script, run_scripts
from fleet_trio.proc.sinks import BufferSink, CappedBuffer, NullSink, Sink, TailBuffer, TeeSink
from fleet_trio.proc.spec import DEFAULT_GRACE, JobSpec, Result, SweepReport
from fleet_trio.proc.stop import StopToken
from fleet_trio.proc.sweep import sweep_job_survivors

__all__ = [
    "DEFAULT_GRACE",
    "BufferSink",
    "CappedBuffer",
    "JobSpec",
    "NullSink",
    "RecoveryProof",
    "Result",
    "ScriptKind",
    "ScriptOutcome",
    "ScriptPass",
    "Sink",
    "StopToken",
    "SweepReport",
    "TailBuffer",
    "TeeSink",
    "boot_id",
    "recovery_proof_for",
    "run",
    "run_script",
    "run_scripts",
    "sweep_job_survivors",
]
