"""A demo job: start a helper in a session of its own and exit without stopping it (the
RC_JOB_ID sweep must find it).
"""

import os
import subprocess
import sys


def main() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    print(f"started a helper, pid {child.pid}, in a session of its own", flush=True)
    print("exiting without stopping it (it escaped the job's process group)", flush=True)
    os._exit(0)


if __name__ == "__main__":  # a script run by the demo; importing it runs nothing
    main()
