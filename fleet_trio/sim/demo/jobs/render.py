"""The demo node's ``render`` task: a JSON payload on stdin (steps, hold, fail); holds fake
VRAM while it "denoises", prints its result as JSON on stdout.
"""

import json
import os
import sys
import time


def main() -> None:
    payload = json.loads(sys.stdin.read() or "{}")
    steps = int(payload.get("steps", 3))
    hold = payload.get("hold") or ""
    holder = None
    started = time.time()
    device = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    fake_dir = os.environ.get("FLEET_TRIO_FAKE_GPU_DIR")
    if fake_dir and not os.path.exists(os.path.join(fake_dir, "device.json")):
        # a multi-GPU fake: one directory per device; ours is the one the node pinned us to
        for name in sorted(os.listdir(fake_dir)):
            with open(os.path.join(fake_dir, name, "device.json"), encoding="utf-8") as f:
                if json.load(f).get("uuid") == device:
                    fake_dir = os.path.join(fake_dir, name)
                    break
    if fake_dir and hold:
        holder = os.path.join(fake_dir, str(os.getpid()))
        with open(holder, "w", encoding="utf-8") as f:
            f.write(hold)
        where = f" on {device}" if device else ""
        print(f"render: holding {hold} of fake VRAM{where}", file=sys.stderr, flush=True)
    try:
        for i in range(1, steps + 1):
            print(f"denoise step {i}/{steps}", file=sys.stderr, flush=True)
            time.sleep(0.25)
        if payload.get("fail"):
            print(
                "render: the decoder ran out of memory (scripted failure)",
                file=sys.stderr,
                flush=True,
            )
            sys.exit(2)
    finally:
        if holder is not None:
            os.unlink(holder)
    out = os.path.join(os.environ.get("FLEET_WORK_DIR", "."), "out.png")
    print(
        json.dumps(
            {
                "image": out,
                "steps": steps,
                "device": device,
                "started": started,
                "ended": time.time(),
            }
        )
    )


if __name__ == "__main__":  # a script run by the demo; importing it runs nothing
    main()
