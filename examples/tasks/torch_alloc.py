#!/usr/bin/env python3
"""A real-GPU task: allocates GPU memory with torch, holds it, prints a JSON result.

Payload (stdin): {"gib": 2, "seconds": 3}. Used by scripts/gpu-smoke to check that the node's
per-job sampler measures a real allocation; needs torch with CUDA.
"""

import json
import sys
import time

import torch

payload = json.loads(sys.stdin.read() or "{}")
gib = float(payload.get("gib", 2))
seconds = float(payload.get("seconds", 3))
block = torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
time.sleep(seconds)
print(json.dumps({"allocated_gib": gib, "held_s": seconds, "device": torch.cuda.get_device_name()}))
