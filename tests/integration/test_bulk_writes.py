"""Bulk writes on PostgreSQL (app.registry.bulk): what goes in comes back out.

The statements go to the driver as they are, each batch's shared values bound once,
cast to their column's type; so every type the registry writes is sent both ways
here (per row in the JSON recordset and once for the batch) and read back, and a
naive datetime is refused either way before anything is written.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest
import sqlalchemy as sa

from app.registry.bulk import Update, insert_many, insert_new, key_in, update_many, update_together
from app.registry.engines import create_engine_for, statement_connection
from app.registry.schema import JSONType, UTCDateTime

probe = sa.Table(
    "bulk_probe",
    sa.MetaData(),
    sa.Column("id", sa.Uuid(), primary_key=True),
    sa.Column("token", sa.Uuid()),
    sa.Column("at", UTCDateTime()),
    sa.Column("flag", sa.Boolean()),
    sa.Column("n", sa.SmallInteger()),
    sa.Column("label", sa.Text()),
    sa.Column("doc", JSONType),
)

AT = datetime(2026, 12, 2, 3, 4, 5, 678901, tzinfo=UTC)


@pytest.fixture
def engine(pg_dsns):
    engine = create_engine_for(pg_dsns[0], pool_size=1)
    probe.create(engine)
    yield engine
    probe.drop(engine)
    engine.dispose()


def _rows(count: int, **values) -> list[dict]:
    base = {"token": None, "at": AT, "flag": True, "n": 7, "label": "x", "doc": {"k": [1, "ü"]}}
    return [{"id": uuid.uuid4(), **base, **values} for _ in range(count)]


def _read(engine) -> dict:
    with engine.connect() as conn:
        return {row["id"]: dict(row) for row in conn.execute(sa.select(probe)).mappings()}


def _insert(engine, rows: list[dict]) -> None:
    """INSERT INTO bulk_probe (id, token, at, flag, n, label, doc) SELECT v.id, v.token, v.at, v.flag,
    v.n, v.label, v.doc FROM jsonb_to_recordset(:rows) AS v(id uuid, token uuid, at timestamptz,
    flag boolean, n smallint, label text, doc jsonb);
    """
    with engine.begin() as conn:
        insert_many(conn, probe, rows)


def _insert_new(engine, rows: list[dict]) -> set:
    """INSERT INTO bulk_probe (id, token, at, flag, n, label, doc) SELECT v.id, v.token, v.at, v.flag,
    v.n, v.label, v.doc FROM jsonb_to_recordset(:rows) AS v(id uuid, token uuid, at timestamptz,
    flag boolean, n smallint, label text, doc jsonb) ON CONFLICT (id) DO NOTHING RETURNING id;
    """
    with engine.begin() as conn:
        return insert_new(conn, probe, rows, "id")


def _update(engine, rows: list[dict], constants: dict) -> list:
    """UPDATE bulk_probe SET label = v.label, n = v.n, at = :at, flag = :flag, token = :token FROM
    jsonb_to_recordset(:rows) AS v(id uuid, label text, n smallint) WHERE bulk_probe.id = v.id AND
    bulk_probe.id = ANY(:keys) RETURNING bulk_probe.id;
    """
    with engine.begin() as conn:
        return update_many(
            conn, probe, rows, match=("id",), columns=("label", "n"), constants=constants, returning="id"
        )


def test_values_shared_by_the_batch_and_values_per_row_come_back_as_written(engine):
    shared = _rows(3)  # every scalar the same: bound once for the batch
    varied = [
        {**_rows(1)[0], "token": uuid.uuid4(), "at": AT + timedelta(seconds=i), "flag": i == 0, "n": i}
        for i in range(3)
    ]
    _insert(engine, shared + varied)
    found = _read(engine)
    assert len(found) == 6
    for row in shared + varied:
        assert found[row["id"]] == row
    assert all(found[row["id"]]["at"].tzinfo is UTC for row in shared + varied)


def test_documents_past_what_the_fast_encoder_takes_and_instants_at_any_offset_come_back_as_written(engine):
    berlin = timezone(timedelta(hours=1))
    rows = [
        {
            **row,
            "doc": {"big": 2**70 + i, "list": [None, 1.5, "ü"]},
            "at": AT.astimezone(berlin) + timedelta(i),
        }
        for i, row in enumerate(_rows(2))
    ]
    _insert(engine, rows)  # per row: the documents and the instants differ
    found = _read(engine)
    for row in rows:
        assert found[row["id"]] == row
        assert found[row["id"]]["at"].tzinfo is UTC


def test_an_update_sets_per_row_columns_and_batch_constants_of_every_type(engine):
    rows = _rows(4)
    _insert(engine, rows)
    token = uuid.uuid4()
    berlin = timezone(timedelta(hours=1))
    changes = [{"id": row["id"], "label": f"label {i}", "n": i} for i, row in enumerate(rows[:3])]
    written = _update(engine, changes, {"at": AT.astimezone(berlin), "flag": False, "token": token})
    assert sorted(written) == sorted(row["id"] for row in rows[:3])
    found = _read(engine)
    for i, row in enumerate(rows[:3]):
        expected = {**row, "label": f"label {i}", "n": i, "at": AT, "flag": False, "token": token}
        assert found[row["id"]] == expected
    assert found[rows[3]["id"]] == rows[3]  # not in the batch: untouched
    # None as a batch constant clears the column.
    _update(engine, changes[:1], {"at": None, "flag": None, "token": None})
    assert _read(engine)[rows[0]["id"]]["at"] is None


def test_the_batch_keys_select_their_rows_whether_they_are_uuids_or_text(engine):
    """A batch's keys travel as one array: UUIDs as an array literal (key_in) or in
    binary (update_many); keys given as text, and no keys at all, select the same."""
    rows = _rows(5)
    _insert(engine, rows)
    wanted = [row["id"] for row in rows[:3]]
    with engine.connect() as conn:
        for keys in (wanted, [str(key) for key in wanted], wanted[:1], []):
            found = conn.execute(sa.select(probe.c.id).where(key_in(conn, probe.c.id, keys))).scalars()
            assert sorted(found) == sorted(uuid.UUID(str(key)) for key in keys)
    as_text = [{"id": str(key), "label": "text key", "n": 1} for key in wanted[:2]]
    assert sorted(_update(engine, as_text, {})) == sorted(wanted[:2])
    assert [row["label"] for row in _read(engine).values()].count("text key") == 2


def test_insert_new_returns_only_the_keys_it_inserted(engine):
    first = _rows(2)
    assert _insert_new(engine, first) == {row["id"] for row in first}
    second = _rows(1)
    assert _insert_new(engine, first + second) == {second[0]["id"]}
    assert len(_read(engine)) == 3


def test_a_naive_datetime_is_refused_per_row_or_for_the_batch_and_nothing_is_written(engine):
    naive = datetime(2026, 12, 2, 3, 4, 5)
    with pytest.raises(ValueError, match="naive"):
        _insert(engine, _rows(1, at=naive) + _rows(1))
    with pytest.raises(ValueError, match="naive"):
        _insert(engine, _rows(3, at=naive))  # shared by every row: the batch constant
    assert _read(engine) == {}
    rows = _rows(2)
    _insert(engine, rows)
    with pytest.raises(ValueError, match="naive"):
        change = [{"id": rows[0]["id"], "label": "y", "n": 1}]
        _update(engine, change, {"at": naive, "flag": True, "token": None})
    assert _read(engine)[rows[0]["id"]] == rows[0]


def _update_together(engine, first: list[dict], second: list[dict], third: list[dict]) -> list[list]:
    """UPDATE bulk_probe SET label = v.label, n = :n FROM jsonb_to_recordset(:rows) AS v(id uuid,
    label text) WHERE bulk_probe.id = v.id AND bulk_probe.id = ANY(:keys) RETURNING bulk_probe.id;

    UPDATE bulk_probe SET label = :label, n = :n FROM jsonb_to_recordset(:rows) AS v(id uuid, token
    uuid) WHERE bulk_probe.id = v.id AND bulk_probe.id = ANY(:keys) AND bulk_probe.token IS NOT
    DISTINCT FROM v.token AND v.token IS NOT NULL;
    """
    with statement_connection(engine) as conn:
        return update_together(
            conn,
            [
                Update(probe, first, match=("id",), columns=("label",), constants={"n": 1}, returning="id"),
                Update(probe, second, match=("id",), columns=("label",), constants={"n": 2}, returning="id"),
                Update(probe, third, match=("id", "token"), constants={"label": "third", "n": 3}),
            ],
        )


def test_updates_together_are_one_statement_each_with_its_own_values_and_returning(engine):
    rows = _rows(5, token=uuid.uuid4())
    _insert(engine, rows)
    first = [{"id": row["id"], "label": f"first {i}"} for i, row in enumerate(rows[:2])]
    third = [{"id": row["id"], "token": row["token"]} for row in rows[2:4]]
    third.append({"id": rows[4]["id"], "token": uuid.uuid4()})  # its token does not match: untouched
    returned = _update_together(engine, first, [], third)
    # Each part's own constants (both bind an `n`), an empty part skipped, no RETURNING: [].
    assert sorted(returned[0]) == sorted(r["id"] for r in rows[:2]) and returned[1:] == [[], []]
    found = _read(engine)
    assert [(found[r["id"]]["label"], found[r["id"]]["n"]) for r in rows] == [
        ("first 0", 1),
        ("first 1", 1),
        ("third", 3),
        ("third", 3),
        ("x", 7),
    ]
    assert _update_together(engine, [], [], []) == [[], [], []]
