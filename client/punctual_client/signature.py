"""Webhook signatures: `Punctual-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256>[,v1=...]`.

The MAC covers "<t>.<body>" under the owner's signing secret, taken as the UTF-8
bytes of the string `punctual keys create` printed. During a rotation window
(`punctual keys rotate`) a call carries one `v1` per secret, the new one first:
`t=...,v1=<new>,v1=<old>`, so a receiver holding either secret verifies it.
Workers sign with `signature_header`; receivers check with `verify_signature`.
Standard library only: this module is part of the client distribution.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Iterable

__all__ = ["signature_header", "verify_signature", "SignatureError"]


class SignatureError(ValueError):
    """The Punctual-Signature header is missing, malformed, stale, or does not match."""


def _mac(secret: str, timestamp: int, body: bytes) -> str:
    message = str(timestamp).encode("ascii") + b"." + body
    return hmac.new(secret.encode("utf-8"), message, hashlib.sha256).hexdigest()


def _secrets(secret: str | Iterable[str]) -> list[str]:
    return [secret] if isinstance(secret, str) else list(secret)


def signature_header(secret: str | Iterable[str], body: bytes, timestamp: int | None = None) -> str:
    """The Punctual-Signature value for `body` sent at `timestamp` (default: now), one
    `v1` per secret in the order given."""
    t = int(time.time()) if timestamp is None else int(timestamp)
    return ",".join([f"t={t}"] + [f"v1={_mac(s, t, body)}" for s in _secrets(secret)])


def verify_signature(
    secret: str | Iterable[str],
    header: str | None,
    body: bytes | str,
    tolerance_s: float = 300,
    now: float | None = None,
) -> None:
    """Check a Punctual-Signature header against the raw request body.

    `secret` is the owner's signing secret, or several (say the old and the new one
    while you switch a receiver over): any of them matching any `v1` passes.
    Returns None when valid; raises SignatureError saying why otherwise: a missing
    or malformed header, a timestamp more than `tolerance_s` away from `now`
    (replay protection), or no `v1` that matches. One behaviour, so a receiver
    cannot mistake a falsy return for a pass.
    """
    if not header:
        raise SignatureError("missing Punctual-Signature header")
    if isinstance(body, str):
        body = body.encode("utf-8")
    secrets = _secrets(secret)
    if not secrets:
        raise SignatureError("no signing secret to verify with")
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
    expected = [_mac(s, timestamp, body) for s in secrets]
    # Every comparison runs (no early exit), so timing says nothing about which matched.
    matched = [hmac.compare_digest(e, c) for e in expected for c in candidates]
    if not any(matched):
        raise SignatureError("Punctual-Signature does not match the body")
