"""Read replicas, the pure parts: how stale a replica may be, and which are refused."""

from __future__ import annotations

import math
import uuid

import pytest

from app.registry.replicas import ReplicaError, parse_lsn, recognise, staleness
from app.registry.shard_map import Identity, initial_map, route

CLUSTER, OTHER = uuid.UUID(int=1), uuid.UUID(int=2)
A, B, C = (uuid.UUID(int=n) for n in (0xA0, 0xB0, 0xC0))


def test_a_pg_lsn_is_read_as_one_number():
    assert parse_lsn("0/0") == 0
    assert parse_lsn("0/3000000") == 0x3000000
    assert parse_lsn("16/B374D848") == (0x16 << 32) + 0xB374D848
    assert parse_lsn("1/0") > parse_lsn("0/FFFFFFFF")


def test_a_replica_that_replayed_the_primarys_position_is_caught_up_however_old_its_last_commit():
    # An idle primary: the last commit replayed is an hour old, and nothing is missing.
    assert staleness(100, 100, 3600.0, [], now=50.0) == 0.0
    assert staleness(100, 120, 3600.0, [], now=50.0) == 0.0
    assert staleness(100, 100, None, [], now=50.0) == 0.0  # never replayed a commit, nothing missing


def test_a_replica_behind_is_as_stale_as_its_last_commit_or_the_newest_position_it_passed():
    samples = [(10.0, 50), (20.0, 80), (30.0, 90)]
    # Passed the position of t=20 (80 <= 85), not that of t=30: at most 40 - 20 s behind.
    assert staleness(100, 85, 3600.0, samples, now=40.0) == 20.0
    # A commit replayed 5 s ago bounds it more tightly.
    assert staleness(100, 85, 5.0, samples, now=40.0) == 5.0
    # Passed no sample: only its last commit says.
    assert staleness(100, 40, 7.5, samples, now=40.0) == 7.5
    # A position passed exactly counts as passed.
    assert staleness(100, 90, None, samples, now=40.0) == 10.0


def test_a_replica_behind_with_nothing_to_bound_it_is_infinitely_stale():
    assert math.isinf(staleness(100, 40, None, [(10.0, 50)], now=40.0))
    assert math.isinf(staleness(100, None, 1.0, [(10.0, 50)], now=40.0))  # never replayed anything


def test_a_negative_age_from_clock_skew_counts_as_zero():
    assert staleness(100, 40, -3.0, [], now=40.0) == 0.0
    assert staleness(100, 60, None, [(45.0, 50)], now=40.0) == 0.0


def routing():
    return route([Identity(A, CLUSTER, A, 0), Identity(B, CLUSTER, A, 1)], initial_map(CLUSTER, [A, B], 4), 4)


def system_ids(index: int) -> int:
    return 7000 + index


def test_a_replica_is_recognised_as_a_replica_of_the_primary_whose_identity_it_carries():
    assert recognise(0, Identity(B, CLUSTER, A, 1), True, 7001, routing(), system_ids) == 1
    assert recognise(3, Identity(A, CLUSTER, A, 0), True, 7000, routing(), system_ids) == 0


@pytest.mark.parametrize(
    "identity, in_recovery, system_id, says",
    [
        (None, True, 7000, r"PUNCTUAL_REPLICA_URLS\[2\] is not a Punctual database"),
        (Identity(C, OTHER, C, 0), True, 7000, r"PUNCTUAL_REPLICA_URLS\[2\] is database .* of cluster"),
        (
            Identity(C, CLUSTER, A, 2),
            True,
            7000,
            r"copies database .*, which is not in PUNCTUAL_DATABASE_URLS",
        ),
        (Identity(B, CLUSTER, A, 1), False, 7001, r"is not in recovery .*PUNCTUAL_DATABASE_URLS\[1\]"),
        (Identity(B, CLUSTER, A, 1), True, 7000, r"belongs to another PostgreSQL cluster"),
    ],
)
def test_anything_but_a_streaming_replica_of_a_listed_primary_is_refused_with_one_line(
    identity, in_recovery, system_id, says
):
    with pytest.raises(ReplicaError, match=says) as info:
        recognise(2, identity, in_recovery, system_id, routing(), system_ids)
    assert "\n" not in str(info.value)
