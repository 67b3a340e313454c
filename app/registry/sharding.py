"""Shard routing: pure functions, no I/O.

A job's logical shard is a stable hash of its id (not Python's `hash()`, which is
salted per process) modulo PUNCTUAL_SHARDS. Which database serves a logical shard
is the stored shard map (app.registry.shard_map), so moving a logical shard to a new
primary is a copy plus a map change, never a re-hash.
"""

from __future__ import annotations

import hashlib
import uuid


def shard_for(job_id: uuid.UUID | str, shards: int) -> int:
    """The logical shard of a job: the first 8 bytes of its id's SHA-1, mod shards."""
    raw = job_id.bytes if isinstance(job_id, uuid.UUID) else uuid.UUID(str(job_id)).bytes
    return int.from_bytes(hashlib.sha1(raw).digest()[:8], "big") % shards


def queue_name(shard: int) -> str:
    """The RabbitMQ queue that carries shard `shard`'s poll and dispatch work."""
    return f"shard-{shard:02d}"
