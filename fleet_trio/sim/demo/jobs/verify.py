"""The demo worker's verify hook: exit 1 when the job's fake GPU still has more than LIMIT
GiB in use (its base use plus the files of live holding processes).

Usage: verify.py FAKE_GPU_ROOT LIMIT_GIB (the device is $CUDA_VISIBLE_DEVICES)
"""

import json
import os
import re
import sys


def main() -> None:
    root, limit = sys.argv[1], float(sys.argv[2])
    index = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    directory = os.path.join(root, "gpu" + index)
    with open(os.path.join(directory, "device.json"), encoding="utf-8") as f:
        used = float(json.load(f).get("base_used_gib", 0))
    units = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    for name in os.listdir(directory):  # one file per holding process, named after its pid
        if not (name.isdigit() and os.path.exists(f"/proc/{name}")):
            continue
        try:
            with open(os.path.join(directory, name), encoding="utf-8") as f:
                m = re.fullmatch(r"\s*([0-9.]+)\s*([KMGT]?)(?:i?B)?\s*", f.read(), re.I)
        except OSError:
            continue
        if m:
            used += float(m.group(1)) * units[m.group(2).upper()] / 2**30
    if used > limit:
        print(
            f"fake gpu{index}: {used:.1f} GiB still in use after the job (limit {limit:g} GiB)",
            file=sys.stderr,
        )
        sys.exit(1)


if __name__ == "__main__":  # a script run by the demo; importing it runs nothing
    main()
