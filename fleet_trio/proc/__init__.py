"""Process supervision shared by node and worker.

Run a job as its own process group and always turn it into an honest ``Result``
(:func:`run`), sweep escaped processes by their ``RC_JOB_ID`` marker
(:func:`sweep_job_survivors`), prove the host clean after a crash
(:func:`recovery_proof_for`), and run a directory of scripts under a budget.
"""

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
    "Result",
    "Sink",
    "StopToken",
    "SweepReport",
    "TailBuffer",
    "TeeSink",
    "sweep_job_survivors",
]
