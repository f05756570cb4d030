"""Go-style durations, both ways, and Go's signal descriptions.

Durations are integer nanoseconds, as Go's ``time.Duration``. ``parse_duration`` accepts
exactly what Go's ``time.ParseDuration`` accepts (``300ms``, ``1.5s``, ``1m30s``, ``2h``,
``-1.5h``, the lone ``0``) and rejects a bare number such as ``30`` with a message that says
which unit is missing. ``go_duration`` renders exactly as Go's ``Duration.String()``, because
reason strings such as ``max_runtime exceeded (500ms)`` are matched by operators and tests.
"""

from __future__ import annotations

from fleet_trio.errors import DurationError

NANOSECOND = 1
MICROSECOND = 1_000
MILLISECOND = 1_000_000
SECOND = 1_000_000_000
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE

_MAX_NS = (1 << 63) - 1

_UNITS: dict[str, int] = {
    "ns": NANOSECOND,
    "us": MICROSECOND,
    "\u00b5s": MICROSECOND,  # MICRO SIGN
    "\u03bcs": MICROSECOND,  # GREEK SMALL LETTER MU
    "ms": MILLISECOND,
    "s": SECOND,
    "m": MINUTE,
    "h": HOUR,
}

_UNIT_HINT = "valid units are ns, us (or µs), ms, s, m, h; e.g. 500ms, 10s, 1m30s"


def parse_duration(text: str) -> int:
    """Parse a Go duration string into integer nanoseconds.

    Raises :class:`DurationError` with a one-line message on anything Go would reject.
    """
    if not isinstance(text, str):
        raise DurationError(f"invalid duration {text!r}: expected a string such as 10s")
    orig = text
    s = text
    neg = False
    if s[:1] in ("-", "+"):
        neg = s[0] == "-"
        s = s[1:]
    if s == "0":
        return 0
    if s == "":
        raise DurationError(f"invalid duration {orig!r}")
    total = 0
    while s:
        # the number: digits, optionally a '.' and more digits
        i = 0
        while i < len(s) and s[i].isascii() and s[i].isdigit():
            i += 1
        int_digits = s[:i]
        frac_digits = ""
        if i < len(s) and s[i] == ".":
            j = i + 1
            while j < len(s) and s[j].isascii() and s[j].isdigit():
                j += 1
            frac_digits = s[i + 1 : j]
            i = j
            if not int_digits and not frac_digits:
                raise DurationError(f"invalid duration {orig!r}")
        elif not int_digits:
            raise DurationError(f"invalid duration {orig!r}")
        s = s[i:]
        # the unit: everything up to the next digit or '.'
        k = 0
        while k < len(s) and not (s[k] == "." or (s[k].isascii() and s[k].isdigit())):
            k += 1
        unit_text = s[:k]
        s = s[k:]
        if not unit_text:
            raise DurationError(f"invalid duration {orig!r}: missing unit ({_UNIT_HINT})")
        unit = _UNITS.get(unit_text)
        if unit is None:
            raise DurationError(
                f"invalid duration {orig!r}: unknown unit {unit_text!r} ({_UNIT_HINT})"
            )
        value = int(int_digits or "0") * unit
        if frac_digits:
            value += int(frac_digits) * unit // (10 ** len(frac_digits))
        total += value
        if total > _MAX_NS + (1 if neg else 0):
            raise DurationError(f"invalid duration {orig!r}: out of range")
    return -total if neg else total


def parse_duration_seconds(text: str) -> float:
    """Parse a Go duration string into float seconds (for trio timeouts)."""
    return parse_duration(text) / SECOND


def _fmt_frac(u: int, prec: int) -> tuple[int, str]:
    scale = 10**prec
    frac = u % scale
    digits = f"{frac:0{prec}d}".rstrip("0") if frac else ""
    return u // scale, ("." + digits if digits else "")


def go_duration(ns: int) -> str:
    """Render integer nanoseconds exactly as Go's ``time.Duration.String()``."""
    ns = int(ns)
    neg = ns < 0
    u = -ns if neg else ns
    if u < SECOND:
        if u == 0:
            return "0s"
        if u < MICROSECOND:
            prec, unit = 0, "ns"
        elif u < MILLISECOND:
            prec, unit = 3, "\u00b5s"
        else:
            prec, unit = 6, "ms"
        whole, frac = _fmt_frac(u, prec)
        out = f"{whole}{frac}{unit}"
    else:
        secs, frac = _fmt_frac(u, 9)
        out = f"{secs % 60}{frac}s"
        minutes = secs // 60
        if minutes:
            out = f"{minutes % 60}m{out}"
            hours = minutes // 60
            if hours:
                out = f"{hours}h{out}"
    return "-" + out if neg else out


def seconds_to_ns(seconds: float) -> int:
    """Convert float seconds to integer nanoseconds, rounding to the nearest nanosecond."""
    return round(seconds * SECOND)


def go_duration_seconds(seconds: float) -> str:
    """``go_duration`` for a value held in float seconds."""
    return go_duration(seconds_to_ns(seconds))


_SIGNAL_TEXT: dict[int, str] = {
    1: "hangup",
    2: "interrupt",
    3: "quit",
    4: "illegal instruction",
    5: "trace/breakpoint trap",
    6: "aborted",
    7: "bus error",
    8: "floating point exception",
    9: "killed",
    10: "user defined signal 1",
    11: "segmentation fault",
    12: "user defined signal 2",
    13: "broken pipe",
    14: "alarm clock",
    15: "terminated",
    16: "stack fault",
    17: "child exited",
    18: "continued",
    19: "stopped (signal)",
    20: "stopped",
    21: "stopped (tty input)",
    22: "stopped (tty output)",
    23: "urgent I/O condition",
    24: "CPU time limit exceeded",
    25: "file size limit exceeded",
    26: "virtual timer expired",
    27: "profiling timer expired",
    28: "window changed",
    29: "I/O possible",
    30: "power failure",
    31: "bad system call",
}


def signal_text(signo: int) -> str:
    """Go's Linux description of a signal number (``signal <n>`` for unnamed ones)."""
    return _SIGNAL_TEXT.get(signo, f"signal {signo}")


__all__ = [
    "HOUR",
    "MICROSECOND",
    "MILLISECOND",
    "MINUTE",
    "NANOSECOND",
    "SECOND",
    "go_duration",
    "go_duration_seconds",
    "parse_duration",
    "parse_duration_seconds",
    "seconds_to_ns",
    "signal_text",
]
