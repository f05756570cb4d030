"""Run a module under cProfile with a CPU clock (``time.process_time``), not a wall clock.

    python scripts/bench/cpu_profile.py OUT.prof -m MODULE [ARGS...]

On a loaded machine a wall-clock profile charges the time a process waits for a core to the
call it happened to be in (a ``send`` that wakes the peer, a lock release that hands over
the GIL); CPU time is what a process really costs. The stats are written to ``OUT.prof`` when
the module returns or exits (SIGTERM handled by the module included).
"""

from __future__ import annotations

import cProfile
import runpy
import sys
import time


def main() -> None:
    if len(sys.argv) < 4 or sys.argv[2] != "-m":
        raise SystemExit(__doc__)
    out, module = sys.argv[1], sys.argv[3]
    sys.argv = [module, *sys.argv[4:]]
    prof = cProfile.Profile(time.process_time)
    prof.enable()
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit:
        pass
    finally:
        prof.disable()
        prof.dump_stats(out)


if __name__ == "__main__":
    main()
