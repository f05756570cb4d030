"""The optional bearer token of the node's routes and the worker's tail listener.

Compared in constant time (both sides hashed first, so neither length nor content leaks).
No token configured means every request is accepted (the CONTRACT v2 wire has no auth).
"""

from __future__ import annotations

import hashlib
import hmac


def bearer(header: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` value (scheme case-insensitive)."""
    if header and header[:7].lower() == "bearer ":
        return header[7:].strip()
    return ""


def token_ok(token: str | None, presented: str | None) -> bool:
    """Constant-time comparison of ``presented`` with ``token``; no token: always true."""
    if not token:
        return True
    want = hashlib.sha256(token.encode()).digest()
    got = hashlib.sha256((presented or "").encode()).digest()
    return hmac.compare_digest(want, got)


def bearer_ok(token: str | None, header: str | None) -> bool:
    """Whether an ``Authorization`` header value carries ``token`` (no token: always true)."""
    return token_ok(token, bearer(header))


__all__ = ["bearer", "bearer_ok", "token_ok"]
