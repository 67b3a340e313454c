"""Idempotency-Key on create: the job id a key stands for, and what "the same body" means.

No global table: the job id is uuid5(namespace, owner + key), so the key names the
job's shard and the jobs primary key is the uniqueness check; keys are scoped to
their owner because the owner is part of the name. "The same body" is equal JSON:
a hash of the body as canonical JSON (keys sorted, 1.0 written as 1), stored with
the job and compared when the key comes again.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator
from json.encoder import encode_basestring
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
    """sha256 of the body as canonical JSON: equal JSON gives equal hashes (1 == 1.0).

    The text is what json.dumps(body, sort_keys=True, separators=(",", ":"),
    ensure_ascii=False) writes, with integral floats written as integers, built
    without recursion: a body is hashed before it is validated, and one nested as
    deep as the parser allows must still be answered 422, not fail on Python's stack.
    """
    text = "".join(_canonical_pieces(body))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _canonical_pieces(value: Any) -> Iterator[str]:
    """The canonical JSON text of `value` in pieces, depth first, on a stack of its own
    (entries: (True, text to write) or (False, a value still to encode))."""
    stack: list[tuple[bool, Any]] = [(False, value)]
    while stack:
        is_text, item = stack.pop()
        if is_text:
            yield item
        elif isinstance(item, dict):
            keys = sorted(item)
            stack.append((True, "}"))
            for index in range(len(keys) - 1, -1, -1):
                stack.append((False, item[keys[index]]))
                stack.append((True, ("," if index else "") + encode_basestring(keys[index]) + ":"))
            yield "{"
        elif isinstance(item, list):
            stack.append((True, "]"))
            for index in range(len(item) - 1, -1, -1):
                stack.append((False, item[index]))
                if index:
                    stack.append((True, ","))
            yield "["
        else:
            yield _scalar(item)


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return encode_basestring(value)
    if isinstance(value, float):
        return int.__repr__(int(value)) if value.is_integer() else float.__repr__(value)
    if isinstance(value, int):
        return int.__repr__(value)
    raise TypeError(f"{type(value).__name__} is not JSON")
