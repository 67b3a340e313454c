"""The shard map resolved against a DSN list: pure, every refusal and the served cases."""

from __future__ import annotations

import uuid

import pytest

from app.registry.shard_map import Identity, Placement, ShardMap, ShardMapError, initial_map, route

CLUSTER = uuid.UUID(int=1)
A, B, C = (uuid.UUID(int=n) for n in (0xA0, 0xB0, 0xC0))


def ident(
    database_id: uuid.UUID, index: int = 0, cluster: uuid.UUID = CLUSTER, home: uuid.UUID = A
) -> Identity:
    return Identity(database_id, cluster, home, index)


def two_db_map(shards: int = 8) -> ShardMap:
    return initial_map(CLUSTER, [A, B], shards)


def test_initial_map_puts_shard_s_on_database_s_mod_n_and_the_first_is_home():
    value = initial_map(CLUSTER, [A, B, C], 8)
    assert [p.database_id for p in value.placements] == [A, B, C, A, B, C, A, B]
    assert value.home_id == A and value.version == 1
    assert value.shards_on(C) == [2, 5]


def test_the_list_in_order_routes_shard_s_to_dsn_s_mod_n():
    routing = route([ident(A, 0), ident(B, 1)], two_db_map(), 8)
    assert routing.shard_index == (0, 1, 0, 1, 0, 1, 0, 1)
    assert routing.home_index == 0
    assert routing.shards_of(1) == [1, 3, 5, 7]


def test_a_swapped_list_is_served_by_identity_not_position():
    routing = route([ident(B, 1), ident(A, 0)], two_db_map(), 8)
    assert routing.shard_index == (1, 0, 1, 0, 1, 0, 1, 0)
    assert routing.home_index == 1


def test_a_new_database_at_the_end_holds_nothing():
    routing = route([ident(A, 0), ident(B, 1), ident(C, 2)], two_db_map(), 8)
    assert routing.shards_of(2) == []
    assert routing.shard_index == (0, 1, 0, 1, 0, 1, 0, 1)


def test_a_dropped_database_holding_shards_is_refused_naming_it_and_its_shards():
    with pytest.raises(ShardMapError) as caught:
        route([ident(A, 0)], two_db_map(), 8)
    message = str(caught.value)
    assert "shards 1,3,5,7" in message and B.hex[:8] in message and "\n" not in message


def test_a_database_replaced_by_a_new_one_in_its_place_is_refused():
    with pytest.raises(ShardMapError, match="shards 1,3,5,7 on database " + B.hex[:8]):
        route([ident(A, 0), ident(C, 1)], two_db_map(), 8)


def test_a_missing_home_is_refused_naming_it():
    with pytest.raises(ShardMapError, match="home database " + A.hex[:8]):
        route([ident(B, 1)], two_db_map(), 8)


def test_a_database_listed_twice_is_refused():
    with pytest.raises(ShardMapError, match=r"\[0\] and \[2\] are the same database"):
        route([ident(A, 0), ident(B, 1), ident(A, 0)], two_db_map(), 8)


def test_a_database_of_another_cluster_is_refused():
    stranger = ident(C, 0, cluster=uuid.UUID(int=99), home=C)
    with pytest.raises(ShardMapError, match=r"PUNCTUAL_DATABASE_URLS\[1\] is database .* of cluster"):
        route([ident(A, 0), stranger], two_db_map(), 8)


def test_a_database_never_migrated_is_refused():
    with pytest.raises(ShardMapError, match=r"PUNCTUAL_DATABASE_URLS\[1\] is not a migrated"):
        route([ident(A, 0), None], two_db_map(), 8)


def test_another_shard_count_is_refused():
    with pytest.raises(ShardMapError, match="PUNCTUAL_SHARDS=16, but .* has 8 shards"):
        route([ident(A, 0), ident(B, 1)], two_db_map(8), 16)


def test_a_move_in_progress_needs_both_ends_and_marks_the_copy_foreign():
    placements = list(two_db_map().placements)
    placements[3] = Placement(B, C, "copying")
    placements[5] = Placement(C, B, "switched")
    value = ShardMap(CLUSTER, A, 7, tuple(placements))
    with pytest.raises(ShardMapError, match=r"shards 3,5 on database " + C.hex[:8]):
        route([ident(A, 0), ident(B, 1)], value, 8)
    routing = route([ident(A, 0), ident(B, 1), ident(C, 2)], value, 8)
    assert routing.shard_index[3] == 1 and routing.shard_index[5] == 2
    assert routing.foreign_shards(2) == [3] and routing.foreign_shards(1) == [5]
    assert not routing.fenced(3)
    placements[3] = Placement(B, C, "fenced")
    fenced = route([ident(A, 0), ident(B, 1), ident(C, 2)], ShardMap(CLUSTER, A, 8, tuple(placements)), 8)
    assert fenced.fenced(3) and not fenced.fenced(5)
