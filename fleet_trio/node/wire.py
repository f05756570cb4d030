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

# Messages (§2.5), exact.
MSG_SNAPSHOT_UNAVAILABLE = "vram snapshot unavailable"
MSG_SNAPSHOT_STALE = "vram snapshot stale"
MSG_TOO_LARGE = "request body too large (limit 1 MiB)"
MSG_JOB_ID_REQUIRED = "job_id required"
MSG_DRAINING = "node draining"
MSG_UNKNOWN_JOB = "unknown job"


def msg_content_type(raw: str) -> str:
    return f"content-type must be application/json (got {go_quote(raw)})"


def msg_malformed(detail: str) -> str:
    return f"malformed dispatch body: {detail}"


def msg_previously_failed(error: str) -> str:
    return f"job previously failed on this node: {error}"


def msg_unsupported(task_type: str, supported: Sequence[str]) -> str:
    return f"unsupported task_type {go_quote(task_type)} (supported: {', '.join(supported)})"


def go_quote(text: str) -> str:
    """Go's ``%q`` for the common cases (JSON string quoting is the same for printable text)."""
    return json.dumps(text, ensure_ascii=False)


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
    members: dict[str, tuple[Any, str]] = {}
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
            members[str(name)] = (value, raw)
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

_TOKEN = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_MEDIA_TYPE = re.compile(rf"^({_TOKEN})/({_TOKEN})$")
_PARAM = re.compile(rf'^({_TOKEN})\s*=\s*({_TOKEN}|"(?:[^"\\]|\\.)*")$')


def parse_media_type(raw: str) -> str | None:
    """The lower-cased ``type/subtype`` of a Content-Type value, or ``None`` if it will not
    parse (Go's ``mime.ParseMediaType``: parameters must be ``name=token`` or quoted)."""
    parts = raw.split(";")
    m = _MEDIA_TYPE.match(parts[0].strip())
    if m is None:
        return None
    for param in parts[1:]:
        param = param.strip()
        if not param:
            continue  # a trailing ';' is tolerated
        if _PARAM.match(param) is None:
            return None
    return f"{m.group(1)}/{m.group(2)}".lower()


def check_content_type(raw: str | None) -> None:
    """§2.3 step 1. A missing or empty header is allowed (plain curl)."""
    if raw is None or raw == "":
        return
    if parse_media_type(raw) != "application/json":
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
        members = scan_object(text)
    except JsonSyntaxError as exc:
        raise WireError(msg_malformed(str(exc))) from None
    if members is None:
        value = json.loads(text)
        if value is None:
            raise WireError(MSG_JOB_ID_REQUIRED)  # `null` decodes to an empty envelope
        raise WireError(
            msg_malformed(
                f"json: cannot unmarshal {json_kind(value)} into Go value of type "
                "fleetnode.dispatchRequest"
            )
        )
    for name, (value, _raw) in members.items():
        if name not in ENVELOPE_MEMBERS:
            raise WireError(msg_malformed(f"json: unknown field {go_quote(name)}"))
        if name in STRING_MEMBERS and value is not None and not isinstance(value, str):
            raise WireError(
                msg_malformed(
                    f"json: cannot unmarshal {json_kind(value)} into Go struct field "
                    f"dispatchRequest.{name} of type string"
                )
            )
    job_id = members.get("job_id", (None, ""))[0] or ""
    task_type = members.get("task_type", (None, ""))[0] or ""
    payload = members.get("payload")
    if not job_id:
        raise WireError(MSG_JOB_ID_REQUIRED)
    return DispatchRequest(
        job_id=job_id, task_type=task_type, payload_raw=None if payload is None else payload[1]
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
