"""A demo job: raise the fake GPU's used memory by GIB and exit without freeing it.

Usage: leak.py GIB (the fake GPU is $FLEET_TRIO_FAKE_GPU_DIR)
"""

import json
import os
import sys


def main() -> None:
    path = os.path.join(os.environ["FLEET_TRIO_FAKE_GPU_DIR"], "device.json")
    with open(path, encoding="utf-8") as f:
        dev = json.load(f)
    dev["base_used_gib"] = float(dev.get("base_used_gib", 0)) + float(sys.argv[1])
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(dev, f)
    os.replace(path + ".tmp", path)
    print(f"loaded {sys.argv[1]} GiB of weights onto the fake GPU", flush=True)
    print("exiting without freeing them (memory the driver never gets back)", flush=True)


if __name__ == "__main__":  # a script run by the demo; importing it runs nothing
    main()
