"""The one logging setup of every ``fleet-trio`` command (see ``docs/logging.md``).

(Over 500 lines: every command's logging: the flags, the formatters and the redaction must agree,
and nothing else imports logging setup.)

- :func:`add_log_arguments` puts ``--log-level`` and ``--log-format`` on the top-level parser
  and on every subcommand (also nested ones), so they work before and after the subcommand.
- :func:`setup_logging` resolves flag → environment (``FLEET_TRIO_LOG_LEVEL``,
  ``FLEET_TRIO_LOG_FORMAT``) → default and installs one handler on the root logger: ``text``
  (one human-readable line per record, context as ``key=value``) or ``json`` (one JSON object
  per line: ``ts``, ``level``, ``logger``, ``event``, context keys, ``exc``).
- :class:`RedactFilter`, installed with the handler and on the HTTP libraries' loggers,
  rewrites every record before it is formatted: bearer tokens, ``Authorization`` values,
  ``token=`` parameters, URL passwords, secret-named keys and the configured secrets
  themselves (:func:`redact_secrets`, called once a config is loaded) become ``[REDACTED]``,
  in the message, its arguments, ``extra=`` values, tracebacks and stack traces.

Context travels with ``extra=``: ``log.info("job %s: started", job_id, extra=job_context(
job_id=job_id, task=name))``. The keys ``job_id``, ``device``, ``task``, ``worker_id`` and
``node_id`` come first; any other ``extra=`` key follows.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import sys
import time
from collections.abc import Iterable, Mapping
from typing import Any, Final, TextIO
from urllib.parse import quote, quote_plus

from fleet_trio.errors import FleetTrioError
from fleet_trio.inputs import printable

LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
FORMATS: Final = ("text", "json")
DEFAULT_LEVEL: Final = "WARNING"
DEFAULT_FORMAT: Final = "text"
ENV_LEVEL: Final = "FLEET_TRIO_LOG_LEVEL"
ENV_FORMAT: Final = "FLEET_TRIO_LOG_FORMAT"
_LEVEL_HELP = "DEBUG, INFO, WARNING, ERROR or CRITICAL"
_FORMAT_HELP = "text: readable lines, or json: one JSON object per line"
ENV_SECRETS: Final = ("FLEET_TRIO_TOKEN", "RC_TOKEN")
"""Environment variables whose values are redacted from the start (before any config loads)."""

CONTEXT_KEYS: Final = ("job_id", "task", "device", "worker_id", "node_id")
"""Context keys, in the order they are written (other ``extra=`` keys follow)."""

REDACTED: Final = "[REDACTED]"
MIN_SECRET_LEN: Final = 4
"""Configured secrets shorter than this are not replaced by value (only by the patterns): a
one- or two-character token would otherwise erase every occurrence of that text."""

LIBRARY_LOGGERS: Final = ("hypercorn.access", "hypercorn.error", "httpx", "httpcore")
"""Loggers that may carry their own handlers: they get the redaction filter themselves."""

_RESERVED: Final = frozenset(vars(logging.LogRecord("", logging.INFO, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}

_SECRET_KEY = re.compile(r"(?i)(token|authorization|password|passwd|secret|api[_-]?key)")
_NOT_YET = r"(?!\[REDACTED\])"
_VALUE = r"[^\s'\",;&)}\]]+"
_PATTERNS: Final = (
    # scheme://user:PASSWORD@host
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^/\s:@]*:)" + _NOT_YET + r"[^@/\s]+(?=@)"), r"\1"),
    # Authorization: <scheme> VALUE, 'Authorization': '...', (b'Authorization', b'...')
    (
        re.compile(
            r"(?i)(authorization['\"]?\s*[:=,]\s*b?['\"]?(?:(?:bearer|basic|token|digest)\s+)?)"
            + _NOT_YET
            + _VALUE
        ),
        r"\1",
    ),
    # Bearer VALUE anywhere
    (re.compile(r"(?i)\b(bearer\s+)" + _NOT_YET + _VALUE), r"\1"),
    # token=VALUE, tail_token=VALUE, access_token=VALUE, password=VALUE … (query or text)
    (
        re.compile(
            r"(?i)\b((?:[a-z0-9_-]*token|password|passwd|secret|api[_-]?key)=)"
            + _NOT_YET
            + r"[^&\s'\",;)}\]#]+"
        ),
        r"\1",
    ),
    # "token": "VALUE", 'tail_token': 'VALUE' (JSON or a repr)
    (
        re.compile(
            r"(?i)(['\"](?:[a-z0-9_-]*token|password|passwd|secret)['\"]\s*:\s*b?['\"])"
            + _NOT_YET
            + r"[^'\"]+"
        ),
        r"\1",
    ),
)


class LogSetupError(FleetTrioError):
    """A bad ``--log-level``/``--log-format`` value or environment variable (one line)."""


# -- redaction --------------------------------------------------------------------------------


class RedactFilter(logging.Filter):
    """Rewrites each record so that no secret reaches a handler. Always lets it through.

    The message is formatted here (``msg % args``), redacted, and stored back with
    ``args = None``; ``extra=`` values are redacted (a value under a secret-named key such as
    ``token`` or ``authorization`` is replaced whole); a traceback is rendered into
    ``exc_text`` and redacted. Running twice over the same record is harmless.
    """

    def __init__(self, secrets: Iterable[str | None] = ()) -> None:
        super().__init__()
        self.secrets: tuple[str, ...] = ()
        self.add(*secrets)

    def add(self, *secrets: str | None) -> None:
        """Redact these values (and their URL-encoded forms) from now on."""
        known = set(self.secrets)
        for secret in secrets:
            if secret and len(secret.strip()) >= MIN_SECRET_LEN:
                secret = secret.strip()
                known.update({secret, quote(secret, safe=""), quote_plus(secret)})
        # longest first, so a secret that contains another is replaced whole
        self.secrets = tuple(sorted(known, key=lambda s: (-len(s), s)))

    def redact(self, text: str) -> str:
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        for pattern, keep in _PATTERNS:
            text = pattern.sub(keep + REDACTED, text)
        return text

    def redact_value(self, key: str, value: Any) -> Any:
        if _SECRET_KEY.search(key) and value not in (None, "", b""):
            return REDACTED
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, bytes):
            return self.redact(value.decode("utf-8", errors="replace"))
        if isinstance(value, Mapping):
            return {str(k): self.redact_value(str(k), v) for k, v in value.items()}
        if isinstance(value, list | tuple | set | frozenset):
            return [self.redact_value("", v) for v in value]
        if value is None or isinstance(value, bool | int | float):
            return value
        return self.redact(str(value))

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            try:
                message = record.getMessage()
            except Exception:  # bad arguments: keep what can be shown, say so
                message = f"{record.msg} (unformattable log arguments: {record.args!r})"
            record.msg = self.redact(message)
            record.args = None
            for key in [k for k in vars(record) if k not in _RESERVED]:
                setattr(record, key, self.redact_value(key, getattr(record, key)))
            if record.exc_info and record.exc_info[0] is not None and not record.exc_text:
                record.exc_text = logging.Formatter().formatException(record.exc_info)
            if record.exc_text:
                record.exc_text = self.redact(record.exc_text)
            if record.stack_info:
                record.stack_info = self.redact(record.stack_info)
        except Exception as exc:  # never let a log call fail, never let a secret through
            record.msg = f"(log record withheld: redaction failed: {type(exc).__name__})"
            record.args = None
            record.exc_info = None
            record.exc_text = None
            record.stack_info = None
        return True


# -- formatting -------------------------------------------------------------------------------


def _timestamp(record: logging.LogRecord) -> str:
    """RFC 3339, UTC, milliseconds: ``2026-03-01T12:00:00.123Z``."""
    whole = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{whole}.{int(record.msecs):03d}Z"


def record_context(record: logging.LogRecord) -> dict[str, Any]:
    """The record's ``extra=`` values: the context keys first, then the rest in order."""
    extras = {k: v for k, v in vars(record).items() if k not in _RESERVED}
    ordered: dict[str, Any] = {}
    for key in CONTEXT_KEYS:
        value = extras.pop(key, None)
        if value not in (None, ""):
            ordered[key] = value
    ordered.update(extras)
    return ordered


def _logfmt(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if text and text.isprintable() and not re.search(r"[\s\"=\\]", text):
        return text
    return json.dumps(text)  # ASCII only: every control character escaped


CONTINUATION: Final = "  "
"""Prefix of a record's continuation lines (a traceback, a stack) in the text format: only a
record's first line starts at column 0, so an exception message from outside that holds a
newline cannot pass for a record of its own."""


def _escape_lines(text: str) -> str:
    """A traceback or stack: its line breaks kept, each line indented and its control
    characters escaped (no escape sequence, no carriage return)."""
    return "\n".join(CONTINUATION + printable(line) for line in text.split("\n"))


def json_line(text: str) -> str:
    """A JSON document (``ensure_ascii=False``) with every character that is not printable
    written as its ``\\uXXXX`` escape: C1 controls, lone surrogates, bidi and other format
    characters. Outside strings ``json.dumps`` writes ASCII only, so the value is unchanged."""
    if text.isprintable():
        return text
    out: list[str] = []
    for ch in text:
        if ch.isprintable():
            out.append(ch)
            continue
        code = ord(ch)
        if code > 0xFFFF:  # a UTF-16 surrogate pair, as JSON escapes it
            code -= 0x10000
            out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
        else:
            out.append(f"\\u{code:04x}")
    return "".join(out)


class TextFormatter(logging.Formatter):
    """``2026-03-01T12:00:00.123Z INFO    fleet_trio.node.tasks: job j1: done job_id=j1``.

    The message is one line: newlines, carriage returns, escape sequences, other control
    characters, lone surrogates and backslashes in it are escaped (``\\n``, ``\\x1b``,
    ``\\\\``), so a value from outside cannot forge a line or drive a terminal; context values
    that are not plain are JSON-quoted (ASCII); tracebacks keep their lines, each escaped and
    indented by :data:`CONTINUATION`, so every line at column 0 starts a record.
    """

    def format(self, record: logging.LogRecord) -> str:
        message = printable(record.getMessage())  # one line, whatever came from outside
        line = f"{_timestamp(record)} {record.levelname:<7} {record.name}: {message}"
        context = record_context(record)
        if context:
            line += " " + " ".join(f"{k}={_logfmt(v)}" for k, v in context.items())
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line += "\n" + _escape_lines(record.exc_text)
        if record.stack_info:
            line += "\n" + _escape_lines(self.formatStack(record.stack_info))
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line: newlines and every other character that is
    not printable inside values are JSON-escaped (:func:`json_line`)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname,
            "logger": record.name,
            "event": record.getMessage(),
        }
        for key, value in record_context(record).items():
            entry.setdefault(key, value)
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["exc"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json_line(json.dumps(entry, default=str, ensure_ascii=False))


class StderrHandler(logging.StreamHandler[TextIO]):
    """Writes to the given stream, or to whatever ``sys.stderr`` is at the time of each write
    (so a replaced ``sys.stderr`` is honoured and a closed one is never kept)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        super().__init__(stream if stream is not None else sys.stderr)
        self._fixed = stream is not None

    def emit(self, record: logging.LogRecord) -> None:
        if not self._fixed:
            self.stream = sys.stderr
        super().emit(record)


# -- the flags and the setup ------------------------------------------------------------------


def add_log_arguments(parser: argparse.ArgumentParser) -> None:
    """``--log-level`` and ``--log-format`` on ``parser`` (default ``None``: taken from the
    environment, then the default) and on every subcommand parser below it (default
    ``SUPPRESS``: the value after the subcommand wins only when it is given)."""
    _add_log_arguments(parser, top=True)
    seen: set[int] = {id(parser)}
    todo = [parser]
    while todo:
        for action in todo.pop()._actions:
            if not isinstance(action, argparse._SubParsersAction):
                continue
            for sub in action.choices.values():
                if id(sub) not in seen:
                    seen.add(id(sub))
                    _add_log_arguments(sub, top=False)
                    todo.append(sub)


def _add_log_arguments(parser: argparse.ArgumentParser, *, top: bool) -> None:
    default: Any = None if top else argparse.SUPPRESS
    group = parser.add_argument_group("logging (before or after the command)")
    for flag, convert, choices, what, env, fallback in (
        ("--log-level", str.upper, LEVELS, _LEVEL_HELP, ENV_LEVEL, DEFAULT_LEVEL),
        ("--log-format", str.lower, FORMATS, _FORMAT_HELP, ENV_FORMAT, DEFAULT_FORMAT),
    ):
        group.add_argument(
            flag,
            metavar=flag.removeprefix("--log-").upper(),
            default=default,
            type=convert,
            choices=choices,
            help=f"{what} (default ${env}, else {fallback})",
        )


def _resolve(
    flag: str | None,
    environ: Mapping[str, str],
    key: str,
    what: str,
    choices: Iterable[str],
    default: str,
    *,
    upper: bool,
) -> str:
    """The flag, else ``$key`` (case-folded), else the default; a bad ``$key`` is an error."""
    fold = str.upper if upper else str.lower
    if flag:
        return fold(flag)
    value = fold(environ.get(key, "").strip())
    if not value:
        return default
    if value not in choices:
        raise LogSetupError(
            f"${key}: invalid {what} {environ[key]!r} (choose from {', '.join(choices)})"
        )
    return value


def resolve_level(flag: str | None, environ: Mapping[str, str]) -> str:
    """The log level: the flag, else ``$FLEET_TRIO_LOG_LEVEL``, else WARNING."""
    return _resolve(flag, environ, ENV_LEVEL, "log level", LEVELS, DEFAULT_LEVEL, upper=True)


def resolve_format(flag: str | None, environ: Mapping[str, str]) -> str:
    """The log format: the flag, else ``$FLEET_TRIO_LOG_FORMAT``, else text."""
    return _resolve(flag, environ, ENV_FORMAT, "log format", FORMATS, DEFAULT_FORMAT, upper=False)


def setup_logging(
    level: str | None = None,
    fmt: str | None = None,
    *,
    stream: TextIO | None = None,
    environ: Mapping[str, str] | None = None,
    secrets: Iterable[str | None] = (),
) -> StderrHandler:
    """Install the one handler on the root logger (replacing one installed earlier) and the
    redaction filter; return the handler. ``level``/``fmt`` are the flags (``None``: not
    given). Raises :class:`LogSetupError` for a bad environment value."""
    env = os.environ if environ is None else environ
    resolved_level = resolve_level(level, env)
    resolved_format = resolve_format(fmt, env)
    redactor = RedactFilter([*(env.get(name) for name in ENV_SECRETS), *secrets])
    handler = StderrHandler(stream)
    handler.setFormatter(JsonFormatter() if resolved_format == "json" else TextFormatter())
    handler.addFilter(redactor)
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, StderrHandler)]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(resolved_level)
    for name in LIBRARY_LOGGERS:
        library = logging.getLogger(name)
        for old_filter in [f for f in library.filters if isinstance(f, RedactFilter)]:
            library.removeFilter(old_filter)
        library.addFilter(redactor)
    logging.captureWarnings(True)
    return handler


def teardown_logging() -> None:
    """Remove what :func:`setup_logging` installed (tests; a process simply exits)."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, StderrHandler)]:
        root.removeHandler(old)
        old.close()
    for name in LIBRARY_LOGGERS:
        library = logging.getLogger(name)
        for old_filter in [f for f in library.filters if isinstance(f, RedactFilter)]:
            library.removeFilter(old_filter)
    logging.captureWarnings(False)


def redact_secrets(*secrets: str | None) -> None:
    """Redact these values from every log line from now on (call it once the config holding
    them is loaded). Empty and ``None`` values are ignored; without :func:`setup_logging`
    this does nothing."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, StderrHandler):
            for f in handler.filters:
                if isinstance(f, RedactFilter):
                    f.add(*secrets)


def console(
    text: str,
    *,
    event: str | None = None,
    logger: str = "fleet_trio",
    level: int = logging.INFO,
) -> None:
    """A line for the operator that is always shown, whatever the level: ``text`` as is on
    stderr, or, with ``--log-format json``, a JSON line whose ``event`` is ``event`` (default
    ``text``), so that a JSON log stays one object per line. Redacted either way. A stderr
    that cannot be written (the terminal hung up) loses the line, never the caller's work."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, StderrHandler):
            if isinstance(handler.formatter, JsonFormatter):
                message = text if event is None else event
                record = logging.getLogger(logger).makeRecord(
                    logger, level, "", 0, message, (), None
                )
                handler.handle(record)  # the redaction filter, the format, the write
                return
            for f in handler.filters:
                if isinstance(f, RedactFilter):
                    text = f.redact(text)
    # the terminal may be gone (a closed SSH session: EIO), or stderr closed
    with contextlib.suppress(OSError, ValueError):
        print(text, file=sys.stderr, flush=True)


def job_context(
    *,
    job_id: str | None = None,
    task: str | None = None,
    device: str | None = None,
    worker_id: str | None = None,
    node_id: str | None = None,
) -> dict[str, str]:
    """An ``extra=`` mapping with the given context keys (the unset ones left out)."""
    given = {
        "job_id": job_id,
        "task": task,
        "device": device,
        "worker_id": worker_id,
        "node_id": node_id,
    }
    return {k: v for k, v in given.items() if v}


__all__ = [
    "CONTEXT_KEYS",
    "DEFAULT_FORMAT",
    "DEFAULT_LEVEL",
    "ENV_FORMAT",
    "ENV_LEVEL",
    "FORMATS",
    "LEVELS",
    "REDACTED",
    "JsonFormatter",
    "LogSetupError",
    "RedactFilter",
    "StderrHandler",
    "TextFormatter",
    "add_log_arguments",
    "console",
    "job_context",
    "json_line",
    "record_context",
    "redact_secrets",
    "resolve_format",
    "resolve_level",
    "setup_logging",
    "teardown_logging",
]
