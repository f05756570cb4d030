"""CONTRACT v2 wire types and parsing (node.md §2).

(Over 500 lines: the strict JSON scanner and the CONTRACT v2 types it feeds are one edge; the
messages are the spec's exact strings.)

Everything here is synchronous and pure: the HTTP layer (``app.py``) feeds it headers and body
bytes and writes what it returns. Messages are the exact strings of §2.5.

Raw spans: the dispatch body is decoded with a small scanner over the top-level object that
keeps each member's *raw text* next to its value, so the payload reaches the task byte for
byte (§6.6: "stdin receives exactly the raw bytes of the dispatched payload") and a task's
``data`` is echoed byte-identical in a poll.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from itertools import accumulate
from typing import Any

import attrs
import cattrs

from fleet_trio.edge import MSG_UNAUTHORIZED, error_body
from fleet_trio.errors import WireError
from fleet_trio.gpu.footprints import FootprintEntry
from fleet_trio.inputs import JSON_MAX_DEPTH, finite_float

MAX_DISPATCH_BODY = 1 << 20
"""1 MiB (§0)."""
SCHEMA_VERSION = 1
GPU_VENDOR = "nvidia"

RESERVED_MEMBERS = frozenset(
    {
        "model_family",
        "quant",
        "priority",
        "width",
        "height",
        "num_frames",
        "params_b",
        "context_len",
        "num_layers",
        "hidden_dim",
        "batch_size",
    }
)
"""Accepted and ignored (§2.3)."""
STRING_MEMBERS = ("job_id", "task_type", "model_family", "quant")
"""Must be JSON strings or ``null``."""
ENVELOPE_MEMBERS = frozenset({"job_id", "task_type", "payload"}) | RESERVED_MEMBERS
ENVELOPE_GO_TYPE = "dispatchEnvelope"
"""The reference node's envelope struct (package ``fleetnode``), as its decoder errors name it."""

# Messages (§2.5), exact.
MSG_SNAPSHOT_UNAVAILABLE = "vram snapshot unavailable"
MSG_SNAPSHOT_STALE = "vram snapshot stale"
MSG_TOO_LARGE = "request body too large (limit 1 MiB)"
MSG_JOB_ID_REQUIRED = "job_id required"
MSG_DRAINING = "node draining"
MSG_UNKNOWN_JOB = "unknown job"


def msg_content_type(raw: str) -> str:
    """``raw``: the header as the server decoded it (Latin-1); Go quotes the client's bytes."""
    return f"content-type must be application/json (got {go_quote_bytes(_header_bytes(raw))})"


def msg_malformed(detail: str) -> str:
    return f"malformed dispatch body: {detail}"


def msg_previously_failed(error: str) -> str:
    return f"job previously failed on this node: {error}"


def msg_unsupported(task_type: str, supported: Sequence[str]) -> str:
    return f"unsupported task_type {go_quote(task_type)} (supported: {', '.join(supported)})"


_GO_ESCAPES = {c: "\\" + e for c, e in zip("\a\b\f\n\r\t\v", "abfnrtv", strict=True)}
_SURROGATE = re.compile("[\ud800-\udfff]")


def _go_quote_char(ch: str) -> str:
    """One character as ``strconv.Quote`` writes it (a surrogate stands for an invalid byte,
    as ``surrogateescape`` decodes it)."""
    if ch in '"\\':
        return "\\" + ch
    code = ord(ch)
    if 0xDC80 <= code <= 0xDCFF:
        return f"\\x{code - 0xDC00:02x}"
    if ch.isprintable():  # unicode.IsPrint: letters, marks, numbers, punctuation, symbols, ' '
        return ch
    if ch in _GO_ESCAPES:
        return _GO_ESCAPES[ch]
    if code < 0x20 or code == 0x7F:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def go_quote_bytes(raw: bytes) -> str:
    """Go's ``%q`` (``strconv.Quote``) of a byte string: valid printable UTF-8 as is, an
    invalid byte as ``\\xNN``, other characters escaped. Linear in ``len(raw)``."""
    text = raw.decode("utf-8", "surrogateescape")
    if text.isprintable() and '"' not in text and "\\" not in text:
        return f'"{text}"'
    return '"' + "".join(map(_go_quote_char, text)) + '"'


def go_quote(text: str) -> str:
    """Go's ``%q`` of a string that came from JSON (a lone surrogate escape decodes to U+FFFD
    in Go, so it is quoted as that)."""
    return go_quote_bytes(_SURROGATE.sub("\ufffd", text).encode("utf-8"))


# --------------------------------------------------------------------------------------------
# JSON output
# --------------------------------------------------------------------------------------------


def dumps(value: object) -> bytes:
    """One JSON document followed by a newline (§2.1).

    A lone surrogate in a string (from a request: an unknown member's name, a payload value in
    a validation message) is written as its JSON escape (``\\ud800``), never a 500.
    """
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":")) + "\n"
    return text.encode("utf-8", errors="backslashreplace")


def ack_body(job_id: str) -> bytes:
    return dumps({"job_id": job_id, "status": "accepted"})


# --------------------------------------------------------------------------------------------
# Raw-span JSON scanning
# --------------------------------------------------------------------------------------------

_WS = " \t\n\r"

MAX_DEPTH = JSON_MAX_DEPTH
"""Deepest nesting of a dispatch body (the envelope counts as one level; docs/security.md)."""
MSG_TOO_DEEP = f"nested deeper than {MAX_DEPTH} levels"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"invalid character {name[0]!r} looking for beginning of value")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=finite_float)


_ESCAPE = re.compile(r"\\.", re.S)
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'[]{}"')
_STRING_SHELL = re.compile(rb'"[^"]*"')
_BRACKET_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def _deeper_than(raw: str, limit: int) -> bool:
    """Whether the JSON text ``raw`` (already decoded fine) nests arrays/objects more than
    ``limit`` levels. Brackets inside strings do not count; C-speed scans, no recursion."""
    if raw.count("[") + raw.count("{") <= limit:
        return False
    # escapes out (only strings hold backslashes), then every byte but brackets and quotes
    # (UTF-8 multi-byte sequences hold no ASCII byte), then the strings' shells: what is left
    # is the bracket structure
    data = _ESCAPE.sub("", raw).encode("utf-8", "surrogatepass").translate(None, _NOT_STRUCTURE)
    shape = _STRING_SHELL.sub(b"", data)
    return max(accumulate(map(_BRACKET_STEP.__getitem__, shape)), default=0) > limit


MSG_LONE_SURROGATE = "a string holds a lone UTF-16 surrogate escape"


def _lone_surrogate(value: Any, raw: str) -> bool:
    """Whether a decoded value holds a lone surrogate (``"\\ud800"`` decodes to one; raw
    UTF-8 cannot carry one, so without a ``\\u`` escape in ``raw`` there is none)."""
    if "\\u" not in raw:
        return False
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _decode_value(text: str, i: int) -> tuple[Any, int]:
    """One JSON value at ``text[i:]`` (strict: finite numbers only, bounded depth)."""
    try:
        return _DECODER.raw_decode(text, i)
    except json.JSONDecodeError as exc:
        raise JsonSyntaxError(_describe(exc)) from None
    except RecursionError:
        raise JsonSyntaxError(MSG_TOO_DEEP) from None
    except ValueError as exc:  # a non-finite number, an integer too long to convert
        if "integer string conversion" in str(exc):
            raise JsonSyntaxError("number out of range: an integer with too many digits") from None
        raise JsonSyntaxError(str(exc)) from None


class JsonSyntaxError(ValueError):
    """The text is not one JSON value."""


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


def _describe(exc: json.JSONDecodeError) -> str:
    return f"{exc.msg} (line {exc.lineno} column {exc.colno})"


def scan_object(text: str) -> dict[str, tuple[Any, str]] | None:
    """Parse ``text`` as exactly one JSON value (trailing bytes are refused, §11 H).

    For an object, return ``{name: (value, raw)}`` where ``raw`` is the member's exact source
    text (the last duplicate wins, as in Go). For any other value return ``None``.
    Raises :class:`JsonSyntaxError`.
    """
    members = scan_members(text)
    if members is None:
        return None
    return {name: (value, raw) for name, value, raw in members}


def scan_members(text: str) -> list[tuple[str, Any, str]] | None:
    """As :func:`scan_object`, but every member in document order, duplicates included
    (Go's decoder decodes each copy in turn, so an earlier copy can be an error)."""
    i = _skip_ws(text, 0)
    if i >= len(text):
        raise JsonSyntaxError("unexpected end of JSON input")
    if text[i] != "{":
        _value, end = _decode_value(text, i)
        if _deeper_than(text, MAX_DEPTH):
            raise JsonSyntaxError(MSG_TOO_DEEP)
        if _lone_surrogate(_value, text):
            raise JsonSyntaxError(MSG_LONE_SURROGATE)
        if _skip_ws(text, end) != len(text):
            raise JsonSyntaxError("invalid character after top-level value")
        return None
    members: list[tuple[str, Any, str]] = []
    i = _skip_ws(text, i + 1)
    if i < len(text) and text[i] == "}":
        end = i + 1
    else:
        while True:
            if i >= len(text):
                raise JsonSyntaxError("unexpected end of JSON input")
            if text[i] != '"':
                raise JsonSyntaxError(
                    f"invalid character {text[i]!r} looking for beginning of object key string"
                )
            try:
                name, i = json.decoder.scanstring(text, i + 1)  # type: ignore[attr-defined]
            except json.JSONDecodeError as exc:
                raise JsonSyntaxError(_describe(exc)) from None
            i = _skip_ws(text, i)
            if i >= len(text) or text[i] != ":":
                raise JsonSyntaxError("expected ':' after object key")
            i = _skip_ws(text, i + 1)
            value, end = _decode_value(text, i)
            raw = text[i:end]
            if _deeper_than(raw, MAX_DEPTH - 1):  # the envelope is the first level
                raise JsonSyntaxError(MSG_TOO_DEEP)
            if _lone_surrogate(value, raw):
                raise JsonSyntaxError(MSG_LONE_SURROGATE)
            members.append((str(name), value, raw))
            i = _skip_ws(text, end)
            if i < len(text) and text[i] == ",":
                i = _skip_ws(text, i + 1)
                continue
            if i < len(text) and text[i] == "}":
                end = i + 1
                break
            raise JsonSyntaxError("expected ',' or '}' after object member")
    if _skip_ws(text, end) != len(text):
        raise JsonSyntaxError("invalid character after top-level value")
    return members


def json_kind(value: object) -> str:
    """Go's name for a JSON value's kind, as in ``cannot unmarshal <kind> into …``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def decode_utf8(body: bytes) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JsonSyntaxError(f"invalid UTF-8 at byte {exc.start}") from None


# --------------------------------------------------------------------------------------------
# Dispatch
# --------------------------------------------------------------------------------------------

# Go's mime.ParseMediaType (RFC 2045 tokens; unicode.IsSpace; unicode.ToLower), exactly: the
# header is parsed as the bytes the client sent (decoded ``surrogateescape``, so an invalid
# byte is a character that is neither a space nor a token character, as Go's U+FFFD is).
_TSPECIALS = frozenset('()<>@,;:\\"/[]?=')
_TOKEN_CHARS = frozenset(map(chr, range(0x21, 0x7F))) - _TSPECIALS
_GO_SPACES = "\t\n\v\f\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000" + "".join(
    map(chr, range(0x2000, 0x200B))
)


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i] in _GO_SPACES:
        i += 1
    return i


def _token_end(text: str, i: int) -> int:
    while i < len(text) and text[i] in _TOKEN_CHARS:
        i += 1
    return i


def _media_type_ok(mediatype: str) -> bool:
    """``checkMediaTypeDisposition``: ``token`` or ``token/token``."""
    end = _token_end(mediatype, 0)
    if end == 0 or end == len(mediatype):
        return end > 0
    if mediatype[end] != "/":
        return False
    sub_end = _token_end(mediatype, end + 1)
    return end + 1 < sub_end == len(mediatype)


def _media_value(text: str, i: int) -> tuple[str, int]:
    """``consumeValue``: a token or a quoted string; ``("", i)`` when there is none."""
    if i >= len(text) or text[i] != '"':
        end = _token_end(text, i)
        return text[i:end], end
    out: list[str] = []
    j = i + 1
    while j < len(text):
        ch = text[j]
        if ch == '"':
            return "".join(out), j + 1
        if ch == "\\" and j + 1 < len(text) and text[j + 1] in _TSPECIALS:
            out.append(text[j + 1])
            j += 2
            continue
        if ch in "\r\n":
            return "", i
        out.append(ch)
        j += 1
    return "", i  # no closing quote


def _media_param(text: str, i: int) -> tuple[str, str, int] | None:
    """``consumeMediaParam`` at ``text[i:]``: ``(name, value, end)``, or ``None``."""
    i = _skip_space(text, i)
    if i >= len(text) or text[i] != ";":
        return None
    i = _skip_space(text, i + 1)
    end = _token_end(text, i)
    if end == i:
        return None
    name = text[i:end].lower()
    i = _skip_space(text, end)
    if i >= len(text) or text[i] != "=":
        return None
    i = _skip_space(text, i + 1)
    value, end = _media_value(text, i)
    if value == "" and end == i:
        return None
    return name, value, end


def parse_media_type(raw: str) -> str | None:
    """The lower-cased media type of a Content-Type value, or ``None`` where Go's
    ``mime.ParseMediaType`` returns an error: a bad type, a parameter that is not
    ``name=token`` or ``name="quoted"``, an empty parameter (``;;``; one trailing ``;`` is
    tolerated), or a name given twice with different values. Linear in ``len(raw)``."""
    base = raw.split(";", 1)[0]
    # strings.ToLower maps U+0130 to "i" (simple case folding); Python's full mapping does not
    mediatype = base.replace("\u0130", "i").lower().strip(_GO_SPACES)
    if not _media_type_ok(mediatype):
        return None
    params: dict[str, str] = {}
    continued: dict[str, dict[str, str]] = {}  # RFC 2231 `name*` / `name*0` pieces, per name
    i = len(base)
    while i < len(raw):
        i = _skip_space(raw, i)
        if i >= len(raw):
            break
        param = _media_param(raw, i)
        if param is None:
            if raw[i:].strip(_GO_SPACES) == ";":
                break  # a trailing semicolon
            return None
        name, value, i = param
        seen = continued.setdefault(name.split("*", 1)[0], {}) if "*" in name else params
        if seen.setdefault(name, value) != value:
            return None  # "mime: duplicate parameter name" (equal values are allowed)
    return mediatype


def _header_bytes(raw: str) -> bytes:
    """The bytes of a header value as the server hands it over (ASGI servers decode header
    bytes as Latin-1, one character per byte); text beyond Latin-1 is taken as UTF-8."""
    try:
        return raw.encode("latin-1")
    except UnicodeEncodeError:
        return raw.encode("utf-8", "surrogateescape")


def check_content_type(raw: str | None) -> None:
    """§2.3 step 1. A missing or empty header is allowed (plain curl). ``raw`` is the header
    as the server decoded it (Latin-1); it is parsed, and echoed, as the client's bytes."""
    if raw is None or raw == "":
        return
    text = _header_bytes(raw).decode("utf-8", "surrogateescape")
    if parse_media_type(text) != "application/json":
        raise WireError(msg_content_type(raw), status=400)


@attrs.frozen
class DispatchRequest:
    """A decoded dispatch envelope. ``payload_raw`` is the payload member's exact text
    (``None`` when absent); reserved members are accepted and dropped here."""

    job_id: str = ""
    task_type: str = ""
    payload_raw: str | None = None


def parse_dispatch(body: bytes) -> DispatchRequest:
    """§2.3 step 2 (decode; the size cap is the caller's) and step 3 (``job_id required``).

    Raises :class:`WireError` (400) with the §2.5 message.
    """
    try:
        text = decode_utf8(body)
        if text.strip(_WS) == "":
            raise JsonSyntaxError("EOF")
        members = scan_members(text)
    except JsonSyntaxError as exc:
        raise WireError(msg_malformed(str(exc))) from None
    if members is None:
        value = json.loads(text)
        if value is None:
            raise WireError(MSG_JOB_ID_REQUIRED)  # `null` decodes to an empty envelope
        raise WireError(
            msg_malformed(
                f"json: cannot unmarshal {json_kind(value)} into Go value of type "
                f"fleetnode.{ENVELOPE_GO_TYPE}"
            )
        )
    # As encoding/json: each copy of a member is decoded in turn into its field, so the first
    # error in document order wins (an earlier wrong-typed copy included), a later string
    # replaces an earlier one, and `null` into a string field leaves it as it was.
    strings: dict[str, str] = {}
    payload_raw: str | None = None
    for name, value, raw in members:
        if name not in ENVELOPE_MEMBERS:
            raise WireError(msg_malformed(f"json: unknown field {go_quote(name)}"))
        if name in STRING_MEMBERS:
            if isinstance(value, str):
                strings[name] = value
            elif value is not None:
                raise WireError(
                    msg_malformed(
                        f"json: cannot unmarshal {json_kind(value)} into Go struct field "
                        f"{ENVELOPE_GO_TYPE}.{name} of type string"
                    )
                )
        elif name == "payload":
            payload_raw = raw  # a json.RawMessage: the last copy, `null` included
    job_id = strings.get("job_id", "")
    if not job_id:
        raise WireError(MSG_JOB_ID_REQUIRED)
    return DispatchRequest(
        job_id=job_id, task_type=strings.get("task_type", ""), payload_raw=payload_raw
    )


# --------------------------------------------------------------------------------------------
# Health and job status
# --------------------------------------------------------------------------------------------


@attrs.frozen
class FootprintWire:
    """One ``model_footprints`` entry; ``quant``/``task_type`` are omitted when empty."""

    model_family: str
    vram_peak_gb: float
    quant: str = ""
    task_type: str = ""


def _str_tuple(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(values)


def _fp_tuple(values: Iterable[FootprintWire]) -> tuple[FootprintWire, ...]:
    return tuple(values)


@attrs.frozen
class GpuDeviceWire:
    """One ``gpu_devices`` entry (multi-GPU nodes): exactly these five members, in this order.
    Sizes are GiB, not rounded (as the headline's)."""

    index: int
    uuid: str
    name: str
    vram_total_gb: float
    vram_free_gb: float


def _devices_tuple(values: Iterable[GpuDeviceWire] | None) -> tuple[GpuDeviceWire, ...] | None:
    return None if values is None else tuple(values)


@attrs.frozen
class Health:
    """The 200 body of ``GET /fleet/health``: exactly the ten v2 fields, in upstream order,
    then ``gpu_devices`` on a multi-GPU node only (additive; absent for a single device)."""

    node_id: str
    gpu_arch: str
    vram_total_gb: float
    vram_free_gb: float
    supported_task_types: tuple[str, ...] = attrs.field(converter=_str_tuple, default=())
    loadable_model_families: tuple[str, ...] = attrs.field(converter=_str_tuple, default=())
    model_footprints: tuple[FootprintWire, ...] = attrs.field(converter=_fp_tuple, default=())
    queue_depth: int = 0
    schema_version: int = SCHEMA_VERSION
    gpu_vendor: str = GPU_VENDOR
    gpu_devices: tuple[GpuDeviceWire, ...] | None = attrs.field(
        converter=_devices_tuple, default=None
    )


HEALTH_FIELDS = (
    "node_id",
    "schema_version",
    "gpu_vendor",
    "gpu_arch",
    "vram_total_gb",
    "vram_free_gb",
    "supported_task_types",
    "loadable_model_families",
    "model_footprints",
    "queue_depth",
)


GPU_DEVICES_FIELD = "gpu_devices"
GPU_DEVICE_FIELDS = ("index", "uuid", "name", "vram_total_gb", "vram_free_gb")


def _unstructure_footprint(fp: FootprintWire) -> dict[str, Any]:
    return FootprintEntry(fp.model_family, fp.quant, fp.task_type, fp.vram_peak_gb).to_wire()


def _structure_footprint(obj: Mapping[str, Any], _: type) -> FootprintWire:
    return FootprintWire(
        model_family=str(obj.get("model_family", "")),
        vram_peak_gb=float(obj.get("vram_peak_gb", 0.0)),
        quant=str(obj.get("quant") or ""),
        task_type=str(obj.get("task_type") or ""),
    )


def _unstructure_health(h: Health) -> dict[str, Any]:
    out: dict[str, Any] = {name: getattr(h, name) for name in HEALTH_FIELDS}  # upstream order
    out["supported_task_types"] = list(h.supported_task_types)
    out["loadable_model_families"] = list(h.loadable_model_families)
    out["model_footprints"] = [_unstructure_footprint(f) for f in h.model_footprints]
    if h.gpu_devices is not None:  # multi-GPU only: after the v2 fields, additive
        out[GPU_DEVICES_FIELD] = [
            {name: getattr(d, name) for name in GPU_DEVICE_FIELDS} for d in h.gpu_devices
        ]
    return out


def register_hooks(converter: cattrs.Converter) -> None:
    """The node wire edge: health and footprint entries in the exact v2 shape."""
    converter.register_unstructure_hook(FootprintWire, _unstructure_footprint)
    converter.register_structure_hook(FootprintWire, _structure_footprint)
    converter.register_unstructure_hook(Health, _unstructure_health)


def make_converter() -> cattrs.Converter:
    converter = cattrs.Converter()
    register_hooks(converter)
    return converter


def footprint_from_wire(obj: Mapping[str, Any]) -> FootprintWire:
    """Build a :class:`FootprintWire` from a ``to_wire()`` mapping (the GPU package's)."""
    return _structure_footprint(obj, FootprintWire)


def snapshot_usable(total_gb: float, free_gb: float) -> bool:
    """§2.2 fifth guard: a total ≤ 0 or a non-finite value is never published."""
    return math.isfinite(total_gb) and math.isfinite(free_gb) and total_gb > 0


def job_body(job_id: str, state: str, *, data: bytes | None, error: str | None) -> bytes:
    """``GET /fleet/jobs/{id}`` 200 body. ``data`` is embedded as its raw bytes (byte-identical
    echo); it is present only for ``done`` with a non-empty result (§2.4)."""
    head = f'{{"job_id":{json.dumps(job_id, ensure_ascii=False)},"state":"{state}"'.encode()
    if state == "done" and data:
        return head + b',"data":' + data + b"}\n"
    if state == "error":
        error_text = json.dumps(error or "", ensure_ascii=False)
        return head + b',"error":' + error_text.encode("utf-8", "backslashreplace") + b"}\n"
    return head + b"}\n"


__all__ = [
    "ENVELOPE_MEMBERS",
    "GPU_DEVICES_FIELD",
    "GPU_DEVICE_FIELDS",
    "GPU_VENDOR",
    "HEALTH_FIELDS",
    "MAX_DEPTH",
    "MAX_DISPATCH_BODY",
    "MSG_DRAINING",
    "MSG_JOB_ID_REQUIRED",
    "MSG_SNAPSHOT_STALE",
    "MSG_SNAPSHOT_UNAVAILABLE",
    "MSG_TOO_DEEP",
    "MSG_TOO_LARGE",
    "MSG_UNAUTHORIZED",
    "MSG_UNKNOWN_JOB",
    "RESERVED_MEMBERS",
    "SCHEMA_VERSION",
    "DispatchRequest",
    "FootprintWire",
    "GpuDeviceWire",
    "Health",
    "JsonSyntaxError",
    "ack_body",
    "check_content_type",
    "decode_utf8",
    "dumps",
    "error_body",
    "footprint_from_wire",
    "go_quote",
    "job_body",
    "json_kind",
    "make_converter",
    "msg_content_type",
    "msg_malformed",
    "msg_previously_failed",
    "msg_unsupported",
    "parse_dispatch",
    "parse_media_type",
    "register_hooks",
    "scan_object",
    "snapshot_usable",
]
