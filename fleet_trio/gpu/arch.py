"""``gpu_arch`` from the product name (node.md §7.2), extended for data-centre parts.

The spec's six rules come first, in order, and keep their exact outputs (checklist 82). The
extra rules (fleet-trio, §11 G) only classify names the spec leaves as ``"nvidia"``, matched
on word boundaries so that e.g. ``L4`` never matches inside ``L40``; anything still unmatched,
including ``""`` and ``TITAN X (Pascal)``, stays ``"nvidia"``.
"""

from __future__ import annotations

import re

GPU_VENDOR = "nvidia"

_SPEC_RULES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("RTX PRO", "BLACKWELL", "RTX 50"), "blackwell"),
    (("RTX 40",), "ada"),
    (("RTX 30",), "ampere"),
    (("RTX 20", "GTX 16"), "turing"),
    (("V100",), "volta"),
)

_DATACENTRE_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\bG?B(100|200|300)\b"), "blackwell"),
    (re.compile(r"\bG?H(100|200|800|20)\b"), "hopper"),
    (re.compile(r"\bL(4|40|40S|40G|20)\b|\bADA\b"), "ada"),
    (re.compile(r"\bA(2|10|10G|10M|16|30|40|100|800)\b|\bRTX A\d{3,4}\b"), "ampere"),
    (re.compile(r"\bT4\b|\bQUADRO RTX\b|\bTITAN RTX\b"), "turing"),
    (re.compile(r"\bTITAN V\b"), "volta"),
)


def gpu_arch(device_name: str) -> str:
    """The architecture class advertised as ``gpu_arch``; never ``""``."""
    name = device_name.upper()
    for needles, arch in _SPEC_RULES:
        if any(n in name for n in needles):
            return arch
    for pattern, arch in _DATACENTRE_RULES:
        if pattern.search(name):
            return arch
    return "nvidia"


__all__ = ["GPU_VENDOR", "gpu_arch"]
