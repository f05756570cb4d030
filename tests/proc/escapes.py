"""Jobs that leave an escapee behind (markers stripped, its own session or group, a renamed
``argv[0]``): shared by the containment tests of ``exec``, node jobs and worker jobs."""

from __future__ import annotations

import sys
from pathlib import Path

STRIP = "env -u RC_JOB_ID -u FLEET_JOB_ID -u FLEET_TRIO_SWEEP"
WAIT_PIDFILE = "while [ ! -s {pidfile} ]; do sleep 0.01; done"
PY_ESCAPE = (
    "import os\n"
    "if os.fork(): os._exit(0)\n"
    "{detach}\n"
    "if os.fork(): os._exit(0)\n"
    "for k in ('RC_JOB_ID', 'FLEET_JOB_ID', 'FLEET_TRIO_SWEEP'): os.environ.pop(k, None)\n"
    "fd = os.open('{pidfile}', os.O_WRONLY | os.O_CREAT | os.O_TRUNC)\n"
    "os.write(fd, str(os.getpid()).encode()); os.close(fd)\n"
    "os.execv('/bin/sleep', ['{argv0}', '4321'])\n"
)
VARIANTS = ("setsid", "double_fork", "renamed_argv0")


def escape_command(variant: str, pidfile: Path) -> str:
    """A job that leaves an escapee (markers stripped) and exits 0 once it exists."""
    if variant == "setsid":
        start = (
            f"setsid {STRIP} sh -c 'echo $$ > {pidfile}; exec sleep 4321' "
            "</dev/null >/dev/null 2>&1 &"
        )
    else:
        detach = "os.setpgid(0, 0)" if variant == "double_fork" else "os.setsid()"
        argv0 = "sleep" if variant == "double_fork" else "kworker/0:1"
        code = PY_ESCAPE.format(detach=detach, pidfile=pidfile, argv0=argv0)
        script = pidfile.parent / f"{variant}.py"
        script.write_text(code)
        start = f"{sys.executable} {script} </dev/null >/dev/null 2>&1"
    return f"{start}\n{WAIT_PIDFILE.format(pidfile=pidfile)}\nexit 0"


__all__ = ["STRIP", "VARIANTS", "escape_command"]
