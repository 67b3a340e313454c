"""The real API (on the module's Postgres shards) with any body at all, with and without
idempotency keys: never a 500, every refusal a problem+json naming its fields, and a
refused job changes nothing (the owner's jobs grow by exactly the jobs answered 201).

Host names are not looked up (IP literals pass, names do not: the `no_dns` fixture),
so a drawn host never waits on DNS.
"""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa
from hypothesis import example, given
from hypothesis import strategies as st

from app.registry.engines import registry_for
from app.registry.schema import jobs
from app.services.validation import JOB_FIELDS
from tests.fuzz.budget import fuzz_settings
from tests.integration.api_fixtures import job_body

pytestmark = [pytest.mark.integration, pytest.mark.fuzz, pytest.mark.usefixtures("no_dns")]


# Strings as a hostile client sends them: control characters, a final newline, NUL,
# lone surrogates (JSON's \ud800), any script, digits of other scripts.
_TEXT = st.one_of(
    st.text(max_size=30),
    st.text(alphabet=st.sampled_from("\x00\n\r\t\x7f\x85\u2028\ud800\u0661 aZ9.-_:/@*,#?"), max_size=30),
    st.sampled_from(
        [
            "X-Evil\n",
            "reports.daily\n",
            "http://134744072/",
            "http://127.1:9/",
            "http://127.0.0.1:9/a\x7fb",
            "http://[::1",
            "0 0 * * *\n",
            ",".join(["1"] * 2000) + " * * * *",
            "2026-12-01T00:00:00Z\n",
        ]
    ),
)
_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False), _TEXT
)
_JSON = st.recursive(
    _SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_TEXT, children, max_size=4),
    max_leaves=15,
)


def _nested(levels: int) -> object:
    value: object = 1
    for _ in range(levels):
        value = [value]
    return value


_PATHS = [
    ("name",),
    ("target",),
    ("target", "url"),
    ("target", "headers"),
    ("target", "method"),
    ("target", "timeout_s"),
    ("target", "limits"),
    ("schedule",),
    ("schedule", "cron"),
    ("schedule", "timezone"),
    ("schedule", "start_at"),
    ("payload",),
    ("retry",),
    ("retry", "max_attempts"),
    ("misfire",),
    ("dst",),
    ("jitter_s",),
    ("colour",),
]


@st.composite
def job_bodies(draw) -> object:
    """Mostly a valid body with a few of its fields (at any depth) replaced by anything."""
    if draw(st.integers(0, 9)) == 0:
        return draw(_JSON)
    body = job_body(target={"type": "webhook", "url": "http://127.0.0.1:9/hook", "headers": {"X-Team": "a"}})
    for path in draw(st.lists(st.sampled_from(_PATHS), max_size=3)):
        value = draw(st.one_of(_JSON, st.integers(60, 900).map(_nested)))
        holder = body
        for key in path[:-1]:
            if not isinstance(holder.get(key), dict):
                holder[key] = {}
            holder = holder[key]
        holder[path[-1]] = value
    if draw(st.booleans()):
        headers = draw(st.dictionaries(_TEXT, _TEXT, max_size=3))
        body["target"] = {"type": "webhook", "url": "http://127.0.0.1:9/hook", "headers": headers}
    return body


_KEYS = st.one_of(
    st.none(), st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=300)
)


def _owner_jobs(settings, owner: str) -> int:
    total = 0
    for engine in registry_for(settings).engines:
        with engine.connect() as conn:
            total += conn.execute(sa.select(sa.func.count()).where(jobs.c.owner == owner)).scalar_one()
    return total


def _check_problem(status: int, mimetype: str, body: dict) -> None:
    assert status < 500, body
    if status >= 400:
        assert mimetype == "application/problem+json" and body["status"] == status
        assert isinstance(body["errors"], list)
        if status == 422:
            assert body["errors"] and all(isinstance(e["field"], str) for e in body["errors"])


@fuzz_settings(examples=120)
@given(
    body=job_bodies(),
    key=_KEYS,
    batch=st.lists(st.tuples(job_bodies(), st.one_of(st.none(), _JSON, _KEYS)), max_size=4),
)
@example(
    body={**job_body(), "payload": _nested(600)},
    key="deep",
    batch=[({**job_body(), "payload": _nested(600)}, "deep")],
)
@example(body=None, key=None, batch=[(None, None), (job_body(), None)])
@example(body={"\ud800": 1}, key=None, batch=[({**job_body(), "\ud800": 1}, None)])  # echoed in a field path
def test_no_body_is_a_500_and_a_refused_job_changes_nothing(api_settings, alice, body, key, batch):
    before = _owner_jobs(api_settings, alice.owner)
    created = 0

    headers = {"Idempotency-Key": key} if key is not None else None
    response = alice.post(
        "/jobs", data=json.dumps(body), headers={"Content-Type": "application/json", **(headers or {})}
    )
    _check_problem(response.status_code, response.mimetype, response.get_json())
    created += response.status_code == 201

    items = []
    for item, item_key in batch:
        if isinstance(item, dict) and item_key is not None:
            item = {**item, "idempotency_key": item_key}
        items.append(item)
    response = alice.post("/jobs/batch", json={"jobs": items})
    answer = response.get_json()
    _check_problem(response.status_code, response.mimetype, answer)
    assert response.status_code == 200 and len(answer["items"]) == len(items)
    for item in answer["items"]:
        if "problem" in item:
            _check_problem(item["status"], "application/problem+json", item["problem"])
        created += item["status"] == 201

    assert _owner_jobs(api_settings, alice.owner) == before + created


@fuzz_settings(examples=80)
@given(changes=st.one_of(_JSON, st.dictionaries(st.sampled_from([*JOB_FIELDS, "colour"]), _JSON, max_size=3)))
def test_no_patch_is_a_500_and_a_refused_one_changes_nothing(alice, changes):
    job = alice.create()
    response = alice.patch(f"/jobs/{job['id']}", json=changes)
    _check_problem(response.status_code, response.mimetype, response.get_json())
    if response.status_code != 200:
        after = alice.get(f"/jobs/{job['id']}").get_json()
        assert {k: v for k, v in after.items() if k != "updated_at"} == {
            k: v for k, v in job.items() if k != "updated_at"
        }


@fuzz_settings(examples=100)
@given(
    raw=st.one_of(
        st.binary(max_size=200), st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass"))
    )
)
def test_no_bytes_are_a_500(alice, raw):
    for path in ("/jobs", "/jobs/batch"):
        response = alice.post(path, data=raw, headers={"Content-Type": "application/json"})
        _check_problem(response.status_code, response.mimetype, response.get_json())
