"""A declarative job's key (`PUT /jobs/by-key/{key}`): what it may be, and its job id.

As with an Idempotency-Key (app.services.idempotency), the job id is a uuid5 of the
owner and the key, so the key names the job's shard and the jobs primary key keeps it
unique per owner across every database, with no table of keys. The namespace differs
from the Idempotency-Key's: a job key and an Idempotency-Key of the same text name two
different jobs.
"""

from __future__ import annotations

import re
import uuid

from app.core.errors import ValidationError

# Fixed forever: changing it would give every keyed job a new id.
NAMESPACE = uuid.UUID("9d3c7a0e-61b4-4f0a-8c2e-3b5f1d7e9a46")
JOB_KEY_MAX = 200
# One path segment, never `.` or `..` (which clients and proxies rewrite).
JOB_KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
JOB_KEY_RULE = f"1 to {JOB_KEY_MAX} letters, digits, '.', '_', '-', starting with a letter or digit"

_KEY = re.compile(JOB_KEY_PATTERN)


def check_job_key(key: object, field: str = "key") -> str:
    """`key` when it is a valid job key; ValidationError on `field` otherwise."""
    if not isinstance(key, str) or not 1 <= len(key) <= JOB_KEY_MAX or not _KEY.match(key):
        raise ValidationError.single(field, f"must be {JOB_KEY_RULE}")
    return key


def job_id_for_key(owner: str, key: str) -> uuid.UUID:
    """The id of `owner`'s job with key `key` (a valid key: check_job_key)."""
    return uuid.uuid5(NAMESPACE, f"{owner}\n{key}")
