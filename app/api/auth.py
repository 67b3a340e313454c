"""Bearer authentication: `Authorization: Bearer <api key>` -> the owner, in `g.owner`.

The lookup goes through app.services.owners.OwnerDirectory: the key is hashed, looked up
on the home DSN, compared in constant time, and the answer cached per process for
KEY_CACHE_TTL_S (2 s): the create path costs no extra round trip once a key is warm,
and a revoked key is refused by every API process within those seconds.
"""

from __future__ import annotations

from flask import Blueprint, current_app, g, request

from app.api.problems import Unauthorized


def bearer_key(header: str | None) -> str | None:
    """The key of an `Authorization: Bearer <key>` header (scheme case-insensitive)."""
    if not header:
        return None
    scheme, _, key = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return key.strip() or None


def authenticate() -> None:
    """before_request hook: sets g.owner or raises Unauthorized (401)."""
    owner = current_app.extensions["punctual"].owners.authenticate(
        bearer_key(request.headers.get("Authorization"))
    )
    if owner is None:
        raise Unauthorized()
    g.owner = owner


def protect(blueprint: Blueprint) -> Blueprint:
    """Every route of `blueprint` requires an API key."""
    blueprint.before_request(authenticate)
    return blueprint
