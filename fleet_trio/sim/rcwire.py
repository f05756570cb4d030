"""Wire types of the worker-facing rc protocol, as the simulated controller reads and writes them.

Field names and ``omitempty`` rules are exactly those of worker-protocol.md §3 and
rc-wire-capture.md. cattrs is used only here, at the wire edge, with a converter configured by
:func:`register_hooks`. JSON responses are encoded the way Go's ``encoding/json`` encoder does
(compact, ``<``/``>``/``&`` and U+2028/U+2029 escaped, one trailing newline): the capture's
``Content-Length`` values (53, 307, 68, …) are reproduced byte for byte.

Declared separately on purpose: this module is the sim's independent oracle of the wire. It
imports nothing from the production parser (``fleet_trio.worker.client``) nor the node's wire
edge (``fleet_trio.node.wire``), so a mistake there cannot hide here too; where its types and
converter set-up mirror theirs in shape, that is the same wire declared a second time.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, TypeVar

import attrs
import cattrs

from fleet_trio.errors import WireError

MAX_SHEET = 65536
"""A usage sheet longer than this many bytes is refused with 413 (§9.2)."""
MAX_HEARTBEAT_BODY = 65536
"""§3.3: a heartbeat body over 64 KiB is refused with 413."""
MAX_LOG_CHUNK = 1048576
"""§3.6: a log chunk over 1 MiB is refused with 413."""

Labels = dict[str, dict[str, str]]

T = TypeVar("T")


@attrs.frozen
class Recovery:
    """§10.2 recovery proof; every member is omitted when false."""

    isolated: bool = False
    survivors_checked: bool = False
    survivors_found: bool = False

    @property
    def proves_nothing_survived(self) -> bool:
        """§10.3: ``isolated``, or ``survivors_checked && !survivors_found``."""
        return self.isolated or (self.survivors_checked and not self.survivors_found)


@attrs.frozen
class DeviceDecl:
    """One ``devices[]`` entry of a registration."""

    name: str = ""
    max_runtime_seconds: int = 0


@attrs.frozen
class Registration:
    """E1 request body (§3.1). ``None`` stands for an absent (or ``null``) key."""

    host: str = ""
    boot_id: str = ""
    recovery: Recovery | None = None
    devices: tuple[DeviceDecl, ...] = ()
    labels: Labels | None = None
    declared_labels: dict[str, dict[str, str] | None] | None = None
    sheet: str | None = None
    device_sheets: dict[str, str] | None = None


@attrs.frozen
class LabelsPush:
    """E2 request body (§3.2)."""

    host: str = ""
    devices: tuple[str, ...] = ()
    labels: Labels | None = None
    declared_labels: dict[str, dict[str, str] | None] | None = None
    sheet: str | None = None
    device_sheets: dict[str, str] | None = None


@attrs.frozen
class Heartbeat:
    """E3 request body (§3.3); ``{}`` when idle."""

    running_job_ids: tuple[str, ...] = ()


@attrs.frozen
class StatusReport:
    """E5 request body (§3.5)."""

    worker_id: str = ""
    state: str = ""
    exit_code: int | None = None
    reason: str = ""


@attrs.frozen
class FaultReport:
    """E7 request body (§3.7)."""

    reason: str = ""


@attrs.frozen
class Assignment:
    """One entry of an E4 answer (§3.4); zero values are omitted on the wire."""

    job_id: str
    device_id: str
    command: tuple[str, ...]
    cwd: str = ""
    env: Mapping[str, str] = attrs.field(factory=dict)
    max_runtime_seconds: int = 0
    idle_timeout_seconds: int = 0
    submitter: str = ""
    kind: str = ""
    stdio: str = ""


@attrs.frozen
class Assignments:
    """The E4 200 body: ``assignments`` always present, ``kills`` omitted when empty."""

    assignments: tuple[Assignment, ...] = ()
    kills: tuple[str, ...] = ()


@attrs.frozen
class RegisterResponse:
    worker_id: str


@attrs.frozen
class ErrorBody:
    """§1.4 error envelope."""

    error: str
    message: str


def _unstructure_recovery(r: Recovery) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if r.isolated:
        out["isolated"] = True
    if r.survivors_checked:
        out["survivors_checked"] = True
    if r.survivors_found:
        out["survivors_found"] = True
    return out


def _unstructure_assignment(a: Assignment) -> dict[str, Any]:
    out: dict[str, Any] = {"job_id": a.job_id, "device_id": a.device_id, "command": list(a.command)}
    if a.cwd:
        out["cwd"] = a.cwd
    if a.env:
        out["env"] = dict(a.env)
    if a.max_runtime_seconds:
        out["max_runtime_seconds"] = a.max_runtime_seconds
    if a.idle_timeout_seconds:
        out["idle_timeout_seconds"] = a.idle_timeout_seconds
    if a.submitter:
        out["submitter"] = a.submitter
    if a.kind:
        out["kind"] = a.kind
    if a.stdio:
        out["stdio"] = a.stdio
    return out


def _unstructure_assignments(body: Assignments) -> dict[str, Any]:
    out: dict[str, Any] = {"assignments": [_unstructure_assignment(a) for a in body.assignments]}
    if body.kills:
        out["kills"] = list(body.kills)
    return out


def register_hooks(converter: cattrs.Converter) -> None:
    """The rc wire edge: ``omitempty`` on the controller's answers, lenient decoding of requests.

    Unknown keys are ignored on structure (cattrs' default), like Go's decoder.
    """
    converter.register_unstructure_hook(Recovery, _unstructure_recovery)
    converter.register_unstructure_hook(Assignment, _unstructure_assignment)
    converter.register_unstructure_hook(Assignments, _unstructure_assignments)


def make_converter() -> cattrs.Converter:
    converter = cattrs.Converter()
    register_hooks(converter)
    return converter


def go_json(obj: Any) -> bytes:
    """Encode like Go's ``json.NewEncoder(w).Encode(v)`` (HTML-safe, trailing newline; a
    string Go could not hold, with a lone surrogate, is sent with U+FFFD in its place)."""
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    text = re.sub("[\ud800-\udfff]", "\ufffd", text)
    text = (
        text.replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )
    return (text + "\n").encode()


def decode_json(body: bytes) -> Any:
    """Parse a JSON request body; a :class:`WireError` (400) carries the decoder's text."""
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WireError(str(exc)) from None


def structure_body(converter: cattrs.Converter, body: bytes, cls: type[T]) -> T:
    """Decode a JSON object body into ``cls``; malformed JSON or wrong types → 400."""
    raw = decode_json(body)
    if not isinstance(raw, dict):
        raise WireError(f"json: cannot unmarshal {type(raw).__name__} into Go value")
    try:
        return converter.structure(raw, cls)
    except (cattrs.BaseValidationError, TypeError, ValueError) as exc:
        raise WireError(f"json: {exc}") from None


__all__ = [
    "MAX_HEARTBEAT_BODY",
    "MAX_LOG_CHUNK",
    "MAX_SHEET",
    "Assignment",
    "Assignments",
    "DeviceDecl",
    "ErrorBody",
    "FaultReport",
    "Heartbeat",
    "Labels",
    "LabelsPush",
    "Recovery",
    "RegisterResponse",
    "Registration",
    "StatusReport",
    "decode_json",
    "go_json",
    "make_converter",
    "register_hooks",
    "structure_body",
]
