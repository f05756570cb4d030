#!/usr/bin/env python3
"""A task that runs anywhere: reads the payload JSON on stdin, holds some fake GPU memory
(when the fake GPU is in use), sleeps briefly and prints a JSON result on stdout.

Payload: {"seconds": 0.5, "hold": "1G", "fail": false}
"""

import json
import os
import subprocess
import sys
import time

payload = json.loads(sys.stdin.read() or "{}")
seconds = float(payload.get("seconds", 0.5))
hold = payload.get("hold", "1G")
if payload.get("fail"):
    print("sleepy: asked to fail", file=sys.stderr)
    sys.exit(3)

holder = None
if os.environ.get("FLEET_TRIO_FAKE_GPU_DIR") and hold:
    # Fake GPU memory, attributed to this job's process tree by the per-job sampler.
    holder = subprocess.Popen(
        [sys.executable, "-m", "fleet_trio.gpu.fake", "hold", str(hold), "--for", str(seconds + 1)]
    )
time.sleep(seconds)
if holder is not None:
    holder.terminate()
    holder.wait()

out_path = os.path.join(os.environ.get("FLEET_WORK_DIR", "."), "out.txt")
print(
    json.dumps(
        {
            "slept": seconds,
            "job_id": os.environ.get("FLEET_JOB_ID", ""),
            "held": hold if holder is not None else None,
        }
    )
)
