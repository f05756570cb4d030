#!/bin/sh
# Soak: N runs of each escape variant through `fleet-trio exec --containment cgroup`, each
# leaving a marker-stripped escapee (setsid, double fork, renamed argv[0]); counts the
# escapees alive after their run ended (must be 0). Bounded: `timeout` per run.
#   scripts/soak/escape_exec.sh [N] [FLEET_TRIO]
set -u
N=${1:-200}
FT=${2:-.venv/bin/fleet-trio}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
STRIP="env -u RC_JOB_ID -u FLEET_JOB_ID -u FLEET_TRIO_SWEEP"
survived=0
runs=0
for variant in setsid double_fork renamed_argv0; do
  case $variant in
    setsid) body="setsid $STRIP sh -c 'echo \$\$ > $TMP/pid; exec sleep 4321' </dev/null >/dev/null 2>&1 &" ;;
    double_fork) body="$STRIP sh -c '(setsid sh -c \"echo \\\$\\\$ > $TMP/pid; exec sleep 4321\" &) ' </dev/null >/dev/null 2>&1" ;;
    renamed_argv0) body="setsid $STRIP sh -c 'echo \$\$ > $TMP/pid; exec -a kworker/0:1 sleep 4321' </dev/null >/dev/null 2>&1 & " ;;
  esac
  i=0
  while [ "$i" -lt "$N" ]; do
    rm -f "$TMP/pid"
    timeout 60 "$FT" exec --containment cgroup --job-id "soak-$variant-$i" --json -- \
      sh -c "$body
while [ ! -s $TMP/pid ]; do sleep 0.01; done; exit 0" >"$TMP/out" 2>&1
    runs=$((runs + 1))
    pid=$(cat "$TMP/pid" 2>/dev/null || echo "")
    state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null || true)
    if [ -n "$pid" ] && [ -n "$state" ] && [ "$state" != Z ]; then
      survived=$((survived + 1))
      echo "SURVIVED: $variant run $i pid $pid state $state"; cat "$TMP/out"; kill -9 "$pid"
    fi
    if [ -z "$pid" ]; then echo "no escapee started: $variant run $i"; cat "$TMP/out"; fi
    i=$((i + 1))
  done
done
echo "runs $runs survived $survived"
