#!/bin/sh
# on_release hook (worker-process.md §4): give the GPU back to its per-GPU inference service.
#
# When it runs:
#   * after a job ends and the device then stayed idle for release_linger (default 30s); a
#     burst of back-to-back jobs gives one on_acquire and one on_release naming the last job;
#   * at worker shutdown, for a release still lingering (20 s for all devices together);
#   * once per device at worker start, before the first poll, with RC_JOB_ID="" and
#     RC_SUBMITTER="" (the startup pass redoes any release a crash or restart cut short).
# So it MUST be idempotent: starting an already running service is fine, and so is running
# with no preceding on_acquire at all.
#
# A failure is logged by the worker and never quarantines the device (it stays schedulable).
#
# Environment: RC_EVENT=release, RC_DEVICE, RC_JOB_ID, RC_SUBMITTER (possibly empty, see
# above), CUDA_VISIBLE_DEVICES. Unit name: INFERENCE_UNIT_PREFIX (default "inference@") + the
# GPU index. A host without systemctl, or without that unit, makes this a logged no-op. Needs
# inference_unit.sh (sourced) in the same directory.

me=on_release
action=start
# Sets $unit, or exits 0 where there is nothing to start (see inference_unit.sh).
. "$(dirname -- "$0")/inference_unit.sh"

if [ -n "${RC_JOB_ID:-}" ]; then
	why="after job $RC_JOB_ID (${RC_SUBMITTER:-?})"
else
	why="startup release pass"
fi

if systemctl is-active --quiet -- "$unit"; then
	say "$unit already active ($why); nothing to do"
	exit 0
fi
say "starting $unit on ${RC_DEVICE:-?} ($why)"
# `start` on an active unit is a no-op, so a concurrent start elsewhere is harmless too.
if ! systemctl start -- "$unit"; then
	say "systemctl start $unit failed" >&2
	exit 1
fi
say "$unit started"
exit 0
