"""A demo job: print N numbered lines (N=0: forever), DELAY apart, then exit CODE.

Usage: count.py N DELAY CODE WORD
"""

import sys
import time


def main() -> None:
    n, delay, code, word = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    i = 0
    while n == 0 or i < n:
        i += 1
        print(f"{word} {i}" + (f"/{n}" if n else ""), flush=True)
        time.sleep(delay)
    if code:
        print(f"{word}: giving up with exit status {code}", file=sys.stderr, flush=True)
    sys.exit(code)


if __name__ == "__main__":  # a script run by the demo; importing it runs nothing
    main()
