"""Webhook signatures: `Punctual-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256>`.

The MAC covers "<t>.<body>" under the owner's signing secret, taken as the UTF-8
bytes of the string `punctual keys create` printed. Workers sign with
`signature_header`; receivers check with `verify_signature`. Standard library only:
this module is part of the SDK.
"""
from __future__ import annotations

import hashlib
import hmac
import time

__all__ = ["signature_header", "verify_signature", "SignatureError"]


class SignatureError(ValueError):
    """The Punctual-Signature header is missing, malformed, stale, or does not match."""


def _mac(secret: str, timestamp: int, body: bytes) -> str:
    message = str(timestamp).encode("ascii") + b"." + body
    return hmac.new(secret.encode("utf-8"), message, hashlib.sha256).hexdigest()


def signature_header(secret: str, body: bytes, timestamp: int | None = None) -> str:
    """The Punctual-Signature value for `body` sent at `timestamp` (default: now)."""
    t = int(time.time()) if timestamp is None else int(timestamp)
    return f"t={t},v1={_mac(secret, t, body)}"


def verify_signature(
    secret: str,
    header: str | None,
    body: bytes | str,
    tolerance_s: float = 300,
    now: float | None = None,
) -> bool:
    """Check a Punctual-Signature header against the raw request body.

    Returns True when valid. Raises SignatureError saying why otherwise: a missing
    or malformed header, a timestamp more than `tolerance_s` away from `now`
    (replay protection), or no `v1` that matches. Several `v1=` entries are
    accepted so that a secret can be rotated.
    """
    if not header:
        raise SignatureError("missing Punctual-Signature header")
    if isinstance(body, str):
        body = body.encode("utf-8")
    timestamp: int | None = None
    candidates: list[str] = []
    for part in header.split(","):
        key, _, value = part.strip().partition("=")
        if key == "t":
            try:
                timestamp = int(value)
            except ValueError:
                raise SignatureError("malformed Punctual-Signature: t is not an integer") from None
        elif key == "v1" and value:
            candidates.append(value)
    if timestamp is None or not candidates:
        raise SignatureError("malformed Punctual-Signature: expected t=<unix seconds>,v1=<hex>")
    current = time.time() if now is None else now
    if tolerance_s is not None and abs(current - timestamp) > tolerance_s:
        raise SignatureError(f"Punctual-Signature timestamp is more than {tolerance_s:g}s away from now")
    expected = _mac(secret, timestamp, body)
    if not any(hmac.compare_digest(expected, candidate) for candidate in candidates):
        raise SignatureError("Punctual-Signature does not match the body")
    return True
