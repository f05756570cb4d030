# Shared part of on_acquire.sh and on_release.sh, sourced by both (install it next to them; it
# needs no exec bit). The caller sets `me` (its name, for log lines) and `action` (stop or
# start). This finds the per-GPU inference unit, INFERENCE_UNIT_PREFIX (default "inference@")
# + the GPU index from CUDA_VISIBLE_DEVICES, and sets `unit`; where there is nothing to act on
# (no GPU index, no systemctl, no such unit) it says why and exits 0: a logged no-op.

prefix=${INFERENCE_UNIT_PREFIX:-inference@}
index=${CUDA_VISIBLE_DEVICES:-}

say() { printf '%s: %s\n' "$me" "$*"; }

if [ -z "$index" ]; then
	say "${RC_DEVICE:-?}: no GPU index (CUDA_VISIBLE_DEVICES unset); nothing to $action"
	exit 0
fi
unit="${prefix}${index}"

if ! command -v systemctl >/dev/null 2>&1; then
	say "systemctl not found; cannot $action $unit"
	exit 0
fi
# `systemctl cat` fails for a unit that does not exist (instances of a template exist).
if ! systemctl cat -- "$unit" >/dev/null 2>&1; then
	say "unit $unit not found (or systemd not reachable); nothing to $action"
	exit 0
fi
