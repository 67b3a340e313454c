"""app.services.validation: one validator for create and patch, every bad field at once."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.errors import ValidationError
from app.core.retries import RetryPolicy
from app.core.schedules import DstPolicy
from app.services import addresses
from app.services.validation import JOB_FIELDS, validate_changes, validate_job

PUBLIC_URL = "http://93.184.215.14/hook"  # an IP literal: no DNS needed


def body(**overrides):
    data = {
        "name": "nightly",
        "target": {"type": "webhook", "url": PUBLIC_URL},
        "schedule": {"cron": "0 0 * * *", "timezone": "Europe/Berlin"},
    }
    data.update(overrides)
    return data


def fields_of(exc: pytest.ExceptionInfo) -> list[str]:
    return [e.field for e in exc.value.errors]


def test_minimal_body_takes_every_default():
    spec = validate_job(body(), allow_private=False)
    assert spec.target == {
        "type": "webhook",
        "url": PUBLIC_URL,
        "method": "POST",
        "headers": {},
        "timeout_s": 30,
    }
    assert spec.retry == RetryPolicy(5, 10, 3600)
    assert spec.dst == DstPolicy("shift", "once")
    assert (spec.misfire, spec.jitter_s, spec.payload) == ("run_once", 0, None)
    assert spec.schedule.cron == "0 0 * * *" and spec.schedule.timezone == "Europe/Berlin"


def test_every_bad_field_is_listed_with_dotted_paths():
    bad = {
        "name": "",
        "target": {
            "type": "webhook",
            "url": "ftp://x.example/",
            "method": "FETCH",
            "timeout_s": 901,
            "limits": {"rate_per_s": 0, "max_concurrency": 10_001, "burst": 1},
        },
        "schedule": {"cron": "61 * * * *"},
        "retry": {"max_attempts": 0},
        "misfire": "sometimes",
        "dst": {"gap": "jump"},
        "jitter_s": 3601,
        "colour": "blue",
    }
    with pytest.raises(ValidationError) as exc:
        validate_job(bad, allow_private=False)
    assert set(fields_of(exc)) == {
        "colour",
        "name",
        "target.url",
        "target.method",
        "target.timeout_s",
        "target.limits.burst",
        "target.limits.rate_per_s",
        "target.limits.max_concurrency",
        "schedule.cron",
        "retry.max_attempts",
        "misfire",
        "dst.gap",
        "jitter_s",
    }


def test_required_fields_are_named():
    with pytest.raises(ValidationError) as exc:
        validate_job({}, allow_private=False)
    assert fields_of(exc) == ["name", "target", "schedule"]


@pytest.mark.parametrize("schedule", [{}, {"cron": "* * * * *", "interval_s": 30}])
def test_two_schedule_kinds_or_none_name_schedule(schedule):
    with pytest.raises(ValidationError) as exc:
        validate_job(body(schedule=schedule), allow_private=False)
    assert "schedule" in fields_of(exc)


def test_body_must_be_an_object():
    with pytest.raises(ValidationError) as exc:
        validate_job([1, 2], allow_private=False)
    assert fields_of(exc) == ["body"]


def test_queue_target_and_limits():
    spec = validate_job(
        body(
            target={
                "type": "queue",
                "topic": "reports.daily",
                "limits": {"key": "reports", "rate_per_s": 0.5, "max_concurrency": 3},
            }
        ),
        allow_private=False,
    )
    assert spec.target == {
        "type": "queue",
        "topic": "reports.daily",
        "limits": {"key": "reports", "rate_per_s": 0.5, "max_concurrency": 3},
    }


@pytest.mark.parametrize(
    "target, field",
    [
        ({"type": "queue", "topic": "reports.#"}, "target.topic"),
        ({"type": "queue", "topic": "x", "url": PUBLIC_URL}, "target.url"),
        ({"type": "email"}, "target.type"),
        ({"type": "webhook"}, "target.url"),
        ({"type": "webhook", "url": "http://:80/"}, "target.url"),
        (
            {"type": "webhook", "url": PUBLIC_URL, "headers": {"Punctual-Signature": "forged"}},
            "target.headers.Punctual-Signature",
        ),
        (
            {"type": "webhook", "url": PUBLIC_URL, "headers": {"Idempotency-Key": "x"}},
            "target.headers.Idempotency-Key",
        ),
        (
            {"type": "webhook", "url": PUBLIC_URL, "headers": {"X-Ok": "a\r\nInjected: 1"}},
            "target.headers.X-Ok",
        ),
        ({"type": "webhook", "url": PUBLIC_URL, "headers": {"bad name": "v"}}, "target.headers.bad name"),
        ({"type": "webhook", "url": PUBLIC_URL, "timeout_s": 0}, "target.timeout_s"),
        ({"type": "webhook", "url": PUBLIC_URL, "timeout_s": True}, "target.timeout_s"),
        ({"type": "webhook", "url": PUBLIC_URL, "limits": {"key": ""}}, "target.limits.key"),
        (
            {"type": "webhook", "url": PUBLIC_URL, "limits": {"rate_per_s": 100_001}},
            "target.limits.rate_per_s",
        ),
        (
            {"type": "webhook", "url": PUBLIC_URL, "limits": {"max_concurrency": 1.5}},
            "target.limits.max_concurrency",
        ),
    ],
)
def test_bad_targets(target, field):
    with pytest.raises(ValidationError) as exc:
        validate_job(body(target=target), allow_private=False)
    assert field in fields_of(exc)


def test_target_bounds_are_inclusive():
    target = {
        "type": "webhook",
        "url": PUBLIC_URL,
        "method": "DELETE",
        "timeout_s": 900,
        "limits": {"rate_per_s": 0.01, "max_concurrency": 10_000},
    }
    assert validate_job(body(target=target), allow_private=False).target["timeout_s"] == 900


def test_private_targets_are_refused_unless_allowed():
    private = {"type": "webhook", "url": "http://10.1.2.3/hook"}
    with pytest.raises(ValidationError) as exc:
        validate_job(body(target=private), allow_private=False)
    assert fields_of(exc) == ["target.url"]
    assert validate_job(body(target=private), allow_private=True).target["url"] == "http://10.1.2.3/hook"


def test_an_unresolvable_host_is_refused_even_when_private_is_allowed(monkeypatch):
    def unresolvable(url, allow_private):
        raise addresses.UnresolvableHost("host 'nowhere.invalid' cannot be resolved")

    monkeypatch.setattr(addresses, "resolve_target", unresolvable)
    with pytest.raises(ValidationError) as exc:
        validate_job(body(target={"type": "webhook", "url": "https://nowhere.invalid/x"}), allow_private=True)
    assert exc.value.errors[0].field == "target.url"
    assert "cannot be resolved" in exc.value.errors[0].message


@pytest.mark.parametrize(
    "payload, field",
    [
        ({"a": "nul\x00byte"}, "payload.a"),
        ({"list": [1, "\ud800"]}, "payload.list.1"),
    ],
)
def test_strings_postgres_cannot_store_are_422_not_500(payload, field):
    with pytest.raises(ValidationError) as exc:
        validate_job(body(payload=payload), allow_private=False)
    assert fields_of(exc) == [field]


def test_absurd_nesting_is_refused_without_recursion():
    deep: object = "leaf"
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(ValidationError) as exc:
        validate_job(body(payload=deep), allow_private=False)
    assert fields_of(exc) == ["payload"]


def test_any_json_payload_is_kept():
    payload = {"nested": [1, 2.5, None, True, {"x": "ü"}]}
    assert validate_job(body(payload=payload), allow_private=False).payload == payload


def test_patch_validates_only_named_fields_and_null_means_default():
    assert validate_changes({}, allow_private=False) == {}
    changes = validate_changes(
        {"retry": None, "dst": None, "misfire": None, "jitter_s": None, "payload": None}, allow_private=False
    )
    assert changes == {
        "retry": RetryPolicy(),
        "dst": DstPolicy(),
        "misfire": "run_once",
        "jitter_s": 0,
        "payload": None,
    }


def test_patch_refuses_null_for_what_a_job_must_have():
    with pytest.raises(ValidationError) as exc:
        validate_changes({"name": None, "target": None, "schedule": None, "id": "x"}, allow_private=False)
    assert set(fields_of(exc)) == {"name", "target", "schedule", "id"}


def test_patch_and_create_share_the_field_list():
    with pytest.raises(ValidationError) as exc:
        validate_changes(
            {field: {"bogus": True} for field in JOB_FIELDS if field != "payload"}, allow_private=False
        )
    named = {f.split(".")[0] for f in fields_of(exc)}
    assert named == set(JOB_FIELDS) - {"payload"}


@pytest.mark.parametrize(
    "schedule, field",
    [
        (
            {"run_at": "0001-01-01T00:00:00+08:00"},
            "schedule.run_at",
        ),  # before year 1 once made UTC: refused on its field
        ({"run_at": "0665-02-09T23:52:43Z"}, "schedule.run_at"),  # would print as '665-...'
        ({"interval_s": 60, "start_at": "0999-12-31T23:59:59Z"}, "schedule.start_at"),
    ],
)
def test_instants_outside_years_1000_to_9999_are_422(schedule, field):
    with pytest.raises(ValidationError) as exc:
        validate_job(body(schedule=schedule), allow_private=False)
    assert fields_of(exc) == [field]


def test_idempotency_keys_name_one_job_per_owner_and_equal_json_hashes_alike():
    from app.services.idempotency import body_hash, job_id_for

    assert job_id_for("alice", "k") == job_id_for("alice", "k") != job_id_for("bob", "k")
    assert body_hash({"a": 1, "b": [1.0, {"c": 2}]}) == body_hash({"b": [1, {"c": 2.0}], "a": 1.0})
    assert body_hash({"a": 1}) != body_hash({"a": 2})
    for bad in ("", "k" * 256):
        with pytest.raises(ValidationError) as exc:
            job_id_for("alice", bad)
        assert fields_of(exc) == ["Idempotency-Key"]


# --- the hostile inputs: exact patterns, control characters, bounds --------------------------


def nested(levels: int, leaf: object = 1, kind: str = "list") -> object:
    value = leaf
    for _ in range(levels):
        value = [value] if kind == "list" else {"k": value}
    return value


@pytest.mark.parametrize("kind", ["list", "dict"])
@pytest.mark.parametrize("leaf", [1, [], {}])
def test_a_payload_may_be_nested_64_levels_and_not_65(kind, leaf):
    # `[]` and `{}` as the leaf are containers too: 64 wrappers around one make 65 levels.
    inner = 63 if isinstance(leaf, (list, dict)) else 64
    assert validate_job(body(payload=nested(inner, leaf, kind)), allow_private=False).payload is not None
    with pytest.raises(ValidationError) as exc:
        validate_job(body(payload=nested(inner + 1, leaf, kind)), allow_private=False)
    assert fields_of(exc) == ["payload"] and "64 levels" in exc.value.errors[0].message


@pytest.mark.parametrize(
    "target, field",
    [
        ({"type": "webhook", "url": PUBLIC_URL, "headers": {"X-Evil\n": "v"}}, "target.headers.X-Evil\n"),
        (
            {"type": "webhook", "url": PUBLIC_URL, "headers": {"X-A" * 90: "v"}},
            "target.headers." + "X-A" * 90,
        ),
        ({"type": "webhook", "url": PUBLIC_URL, "headers": {"X-Nel": "a\u0085b"}}, "target.headers.X-Nel"),
        ({"type": "webhook", "url": PUBLIC_URL, "headers": {"X-Del": "a\x7fb"}}, "target.headers.X-Del"),
        ({"type": "queue", "topic": "reports.daily\n"}, "target.topic"),
        ({"type": "webhook", "url": "http://93.184.215.14/a\x7fb"}, "target.url"),
        ({"type": "webhook", "url": "http://93.184.215.14/a\u0085b"}, "target.url"),
        ({"type": "webhook", "url": "http://93.184.215.14/a\u2003b"}, "target.url"),  # an em space
        ({"type": "webhook", "url": "http://134744072/"}, "target.url"),
        ({"type": "webhook", "url": "http://127.1/"}, "target.url"),
        ({"type": "webhook", "url": "http://0177.0.0.1/"}, "target.url"),
        ({"type": "webhook", "url": "http://93.184.215.14:0/"}, "target.url"),
        ({"type": "webhook", "url": "http://a.example\\@93.184.215.14/"}, "target.url"),  # yarl refuses it
    ],
)
def test_what_the_contract_refuses_is_refused_at_its_path(target, field):
    with pytest.raises(ValidationError) as exc:
        validate_job(body(target=target), allow_private=True)
    assert fields_of(exc) == [field]


def test_a_header_value_may_hold_a_tab_and_any_printable_text():
    target = {"type": "webhook", "url": PUBLIC_URL, "headers": {"X-Ok": "a\tb ü 日本", "X-" + "a" * 254: "v"}}
    assert validate_job(body(target=target), allow_private=False).target["headers"]["X-Ok"] == "a\tb ü 日本"


def test_a_numeric_host_is_refused_with_why():
    with pytest.raises(ValidationError) as exc:
        validate_job(body(target={"type": "webhook", "url": "http://134744072/"}), allow_private=True)
    assert "not a dotted-quad IPv4 address" in exc.value.errors[0].message


def test_every_hostile_field_of_one_body_is_listed():
    bad = body(
        target={"type": "webhook", "url": "http://134744072/", "headers": {"X-Evil\n": "\u0085"}},
        schedule={"cron": ",".join(["1"] * 20_000) + " * * * *"},
        payload=nested(600),
    )
    with pytest.raises(ValidationError) as exc:
        validate_job(bad, allow_private=True)
    # The header is named twice: its name and its value are both wrong.
    assert fields_of(exc) == [
        "target.url",
        "target.headers.X-Evil\n",
        "target.headers.X-Evil\n",
        "payload",
        "schedule.cron",
    ]


def test_a_batch_resolves_with_the_resolver_it_is_given():
    asked: list[tuple[str, bool]] = []

    def resolve(url, allow_private):
        asked.append((url, allow_private))
        raise addresses.UnresolvableHost("host 'x' did not resolve within 5 s")

    with pytest.raises(ValidationError) as exc:
        validate_job(body(), allow_private=False, resolve=resolve)
    assert asked == [(PUBLIC_URL, False)] and "within 5 s" in exc.value.errors[0].message


def test_webhook_urls_lists_the_urls_validation_would_resolve():
    from app.services.validation import webhook_urls

    bodies = [
        body(),
        body(target={"type": "queue", "topic": "a"}),
        body(target={"type": "webhook", "url": "http://a b/"}),
        None,
        body(target={"type": "webhook", "url": "http://b.example/x"}),
    ]
    assert webhook_urls(bodies) == [PUBLIC_URL, "http://b.example/x"]


def test_an_idempotency_hash_of_a_body_nested_past_any_stack_is_made():
    from app.services.idempotency import body_hash

    assert len(body_hash({"payload": nested(5000)})) == 64
    assert body_hash({"payload": nested(5000)}) != body_hash({"payload": nested(4999)})


@settings(max_examples=400, derandomize=True)
@given(
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(),
        lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
        max_leaves=20,
    )
)
def test_the_idempotency_hash_is_the_hash_of_canonical_json(value):
    """The hash is built without recursion, yet is exactly what it always was: the sha256 of
    sorted, compact json.dumps with integral floats as integers (stored hashes stay valid)."""
    import hashlib
    import json

    from app.services.idempotency import body_hash

    def canonical(v):
        if isinstance(v, float) and v.is_integer():
            return int(v)
        if isinstance(v, dict):
            return {k: canonical(c) for k, c in v.items()}
        if isinstance(v, list):
            return [canonical(c) for c in v]
        return v

    text = json.dumps(canonical(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert body_hash(value) == hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
