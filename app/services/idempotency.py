"""Idempotency-Key on create: the job id a key stands for, and what "the same body" means.

No global table: the job id is uuid5(namespace, owner + key), so the key names the
job's shard and the jobs primary key is the uniqueness check; keys are scoped to
their owner because the owner is part of the name. "The same body" is equal JSON:
a hash of the body as canonical JSON (keys sorted, 1.0 written as 1), stored with
the job and compared when the key comes again.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any

from app.core.errors import ValidationError

# Fixed forever: changing it would give every existing Idempotency-Key a new job id.
NAMESPACE = uuid.UUID("5b0e4f3c-2f6a-4d7e-9a51-7c1f0d3e8b21")
KEY_MAX = 255


def job_id_for(owner: str, key: str) -> uuid.UUID:
    """The id of the job `owner` creates with `key`; 422 on `Idempotency-Key` for a bad key."""
    if not 1 <= len(key) <= KEY_MAX:
        raise ValidationError.single("Idempotency-Key", f"must be 1 to {KEY_MAX} characters")
    return uuid.uuid5(NAMESPACE, f"{owner}\n{key}")


def body_hash(body: object) -> str:
    """sha256 of the body as canonical JSON: equal JSON gives equal hashes (1 == 1.0)."""
    text = json.dumps(_canonical(body), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _canonical(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {key: _canonical(child) for key, child in value.items()}
    if isinstance(value, list):
        return [_canonical(child) for child in value]
    return value
