#!/bin/sh
# on_acquire hook (worker-process.md §4): free the GPU for a job by stopping the per-GPU
# inference service that normally runs on it.
#
# The worker runs this before a job starts on a device whose previous lease was released (a job
# arriving inside the release linger skips it: the device was never given back). Exit 0 = the
# job may run. Non-zero exit (or running past the hook timeout) = the job is reported `failed`
# with "acquire hook failed: ..." and the device is faulted (quarantined until `rc clear`).
# stdout and stderr are combined; the last 4096 bytes go into that reason.
#
# Environment set by the worker: RC_EVENT=acquire, RC_DEVICE (host:name), RC_JOB_ID,
# RC_SUBMITTER, CUDA_VISIBLE_DEVICES (trailing digits of the device name; unset when the name
# has none). RC_JOB_ID and RC_SUBMITTER are untrusted text: use them only as values.
#
# Unit name: INFERENCE_UNIT_PREFIX (default "inference@") + the GPU index, e.g. inference@1.
# A host without systemctl, or without that unit, makes this a logged no-op. Needs
# inference_unit.sh (sourced) in the same directory.

me=on_acquire
action=stop
# Sets $unit, or exits 0 where there is nothing to stop (see inference_unit.sh).
. "$(dirname -- "$0")/inference_unit.sh"

say "stopping $unit for job ${RC_JOB_ID:-?} (${RC_SUBMITTER:-?}) on ${RC_DEVICE:-?}"
if ! systemctl stop -- "$unit"; then
	say "systemctl stop $unit failed; refusing the lease" >&2
	exit 1
fi
# The job must not start while the service still holds GPU memory.
if systemctl is-active --quiet -- "$unit"; then
	say "$unit is still active after stop; refusing the lease" >&2
	exit 1
fi
say "$unit stopped"
exit 0
