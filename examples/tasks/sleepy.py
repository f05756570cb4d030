#!/usr/bin/env python3
"""A task that runs anywhere: reads the payload JSON on stdin, holds some fake GPU memory
(when the fake GPU is in use), sleeps briefly and prints a JSON result on stdout.

Payload: {"seconds": 0.5, "hold": "1G", "fail": false}

Standalone on purpose (copy it and edit): it imports nothing from fleet-trio, so the few lines
that hold fake GPU memory are its own (the demo's render task holds memory the same way).
"""

import json
import os
import sys
import time

payload = json.loads(sys.stdin.read() or "{}")
seconds = float(payload.get("seconds", 0.5))
hold = payload.get("hold", "1G")
if payload.get("fail"):
    print("sleepy: asked to fail", file=sys.stderr)
    sys.exit(3)

# Fake GPU memory: the fake GPU counts a file named after a live pid in its directory as that
# process's allocation (docs/gpu.md), so this needs nothing but the directory. The per-job
# sampler attributes it to this job's process group.
holder = None
fake_dir = os.environ.get("FLEET_TRIO_FAKE_GPU_DIR")
if fake_dir and hold:
    holder = os.path.join(fake_dir, str(os.getpid()))
    with open(holder, "w") as f:
        f.write(str(hold))
try:
    time.sleep(seconds)
finally:
    if holder is not None:
        os.unlink(holder)

held = hold if holder is not None else None
print(json.dumps({"slept": seconds, "job_id": os.environ.get("FLEET_JOB_ID", ""), "held": held}))
