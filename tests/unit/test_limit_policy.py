"""Which limits apply to a run (docs/api.md "Limits"): app.limits.policy, pure."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.limits.policy import LimitSpec, limit_specs, target_origin


@dataclass(frozen=True)
class Ops:
    """The two operator defaults the policy reads from Settings (0 = none)."""

    target_rate_per_s: float = 0
    target_max_concurrency: int = 0


NONE = Ops()


def webhook(url: str, **limits) -> dict:
    target = {"type": "webhook", "url": url}
    if limits:
        target["limits"] = limits
    return target


@pytest.mark.parametrize(
    "url, origin",
    [
        ("https://api.example/run", "https://api.example:443"),
        ("http://api.example/run", "http://api.example:80"),
        ("https://API.Example:443/x?y=1", "https://api.example:443"),
        ("HTTPS://api.example.:8443/", "https://api.example:8443"),
        ("http://user:pw@api.example:8080/run", "http://api.example:8080"),
        ("https://[2001:DB8::1]/run", "https://[2001:db8::1]:443"),
        ("http://10.0.0.7:9000", "http://10.0.0.7:9000"),
    ],
)
def test_origin_always_writes_the_port(url, origin):
    assert target_origin(webhook(url)) == origin


def _origin_of_whole_url(url: str, authority: str) -> str:
    """The origin as urlsplit reads it from the whole URL; a URL it cannot read (the
    API never accepts one) is keyed by its scheme://authority as written."""
    parts = urlsplit(url)
    try:
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme.lower(), 0)
    except ValueError:
        return authority
    host = (parts.hostname or "").rstrip(".")
    return f"{parts.scheme.lower()}://{f'[{host}]' if ':' in host else host}:{port}"


@settings(max_examples=500, deadline=None)
@given(
    st.sampled_from(["http", "https", "HTTP", "ftp"]),
    st.text(alphabet="abcAB.-:@[]19\t%", max_size=16),
    st.sampled_from(["", "/", "/hook/1", "?a=1", "#f", "/x?y#z", "/p:8080/q"]),
)
def test_origin_read_from_the_authority_alone_is_the_whole_urls(scheme, authority, rest):
    # The origin is worked out once per scheme://authority; for any URL that must be
    # what the whole URL gives.
    url = f"{scheme}://{authority}{rest}"
    try:
        expected = _origin_of_whole_url(url, f"{scheme}://{authority}")
    except ValueError:  # an unbalanced [ in the authority
        expected = f"{scheme}://{authority}"
    assert target_origin(webhook(url)) == expected
    assert target_origin(webhook(url)) == expected  # and again, from the cache


def test_many_paths_of_one_host_share_its_origin():
    origins = {target_origin(webhook(f"https://api.example/hook/{i}")) for i in range(2000)}
    assert origins == {"https://api.example:443"}


def test_origin_of_a_queue_target_is_its_topic():
    assert target_origin({"type": "queue", "topic": "reports.daily"}) == "topic:reports.daily"


def test_no_limits_anywhere_means_no_specs():
    assert limit_specs("alice", webhook("https://api.example/run"), NONE) == []


def test_a_named_key_is_scoped_to_the_owner():
    target = webhook("https://billing.example/run", key="billing-api", rate_per_s=50, max_concurrency=20)
    assert limit_specs("alice", target, NONE) == [LimitSpec("owner:alice:key:billing-api", 50.0, 20)]
    bob = limit_specs("bob", target, NONE)
    assert bob[0].key != "owner:alice:key:billing-api"


def test_jobs_with_the_same_named_key_share_it_whatever_their_urls():
    one = limit_specs("alice", webhook("https://a.example/x", key="k", rate_per_s=5), NONE)
    two = limit_specs("alice", webhook("https://b.example/y", key="k", rate_per_s=5), NONE)
    assert one[0].key == two[0].key


def test_without_a_key_the_owner_shares_one_bucket_per_origin():
    one = limit_specs("alice", webhook("https://api.example/a", rate_per_s=5), NONE)
    two = limit_specs("alice", webhook("https://API.example:443/b", rate_per_s=5), NONE)
    assert one == two == [LimitSpec("owner:alice:https://api.example:443", 5.0, None)]
    other_port = limit_specs("alice", webhook("https://api.example:8443/a", rate_per_s=5), NONE)
    assert other_port[0].key != one[0].key


def test_only_the_limits_a_job_sets_apply():
    [spec] = limit_specs("alice", webhook("https://api.example/a", max_concurrency=3), NONE)
    assert spec.rate_per_s is None and spec.max_concurrency == 3
    [spec] = limit_specs("alice", webhook("https://api.example/a", rate_per_s=0.5), NONE)
    assert spec.rate_per_s == 0.5 and spec.max_concurrency is None


def test_a_key_without_numbers_limits_nothing_by_itself():
    assert limit_specs("alice", webhook("https://api.example/a", key="k"), NONE) == []


def test_operator_defaults_apply_per_origin_across_all_owners_on_top():
    ops = Ops(target_rate_per_s=100, target_max_concurrency=200)
    alice = limit_specs("alice", webhook("https://api.example/a", key="k", rate_per_s=5), ops)
    bob = limit_specs("bob", webhook("https://api.example:443/b"), ops)
    assert alice == [
        LimitSpec("owner:alice:key:k", 5.0, None),
        LimitSpec("all:https://api.example:443", 100.0, 200),
    ]
    assert bob == [LimitSpec("all:https://api.example:443", 100.0, 200)]


def test_each_operator_default_can_be_off():
    assert limit_specs("o", webhook("https://api.example/"), Ops(target_max_concurrency=200)) == [
        LimitSpec("all:https://api.example:443", None, 200)
    ]
    assert limit_specs("o", webhook("https://api.example/"), Ops(target_rate_per_s=2.5)) == [
        LimitSpec("all:https://api.example:443", 2.5, None)
    ]


def test_queue_targets_are_keyed_by_topic():
    ops = Ops(target_max_concurrency=200)
    target = {"type": "queue", "topic": "reports.daily", "limits": {"rate_per_s": 10}}
    assert limit_specs("alice", target, ops) == [
        LimitSpec("owner:alice:topic:reports.daily", 10.0, None),
        LimitSpec("all:topic:reports.daily", None, 200),
    ]
    named = {"type": "queue", "topic": "reports.daily", "limits": {"key": "reports", "max_concurrency": 1}}
    assert limit_specs("alice", named, NONE) == [LimitSpec("owner:alice:key:reports", None, 1)]


def test_an_owner_name_cannot_forge_another_owners_key():
    forged = limit_specs("alice:key:x", webhook("https://a.example/", key="y", rate_per_s=1), NONE)
    real = limit_specs("alice", webhook("https://a.example/", key="x:key:y", rate_per_s=1), NONE)
    assert forged[0].key != real[0].key


def test_the_default_settings_cap_concurrency_at_200():
    from app.settings import Settings

    specs = limit_specs("alice", webhook("https://api.example/"), Settings.from_env({}))
    assert specs == [LimitSpec("all:https://api.example:443", None, 200)]


def test_limited():
    assert not LimitSpec("k").limited
    assert LimitSpec("k", rate_per_s=1).limited and LimitSpec("k", max_concurrency=1).limited


def test_a_named_key_takes_the_limits_recorded_for_it_not_the_runs_snapshot():
    from types import SimpleNamespace

    no_defaults = SimpleNamespace(target_rate_per_s=0, target_max_concurrency=0)
    target = {
        "type": "webhook",
        "url": "https://a.example/x",
        "limits": {"key": "billing", "rate_per_s": 50, "max_concurrency": 20},
    }
    recorded = {("acme", "billing"): (5.0, None)}
    (spec,) = limit_specs("acme", target, no_defaults, recorded)
    assert (spec.rate_per_s, spec.max_concurrency) == (5.0, None)
    # Another owner's record of the same name is not this owner's key.
    (own,) = limit_specs("other", target, no_defaults, recorded)
    assert (own.rate_per_s, own.max_concurrency) == (50.0, 20)
    # The most recent job named the key without numbers: the key has no limits.
    assert limit_specs("acme", target, no_defaults, {("acme", "billing"): (None, None)}) == []
    # No named key: the record is irrelevant.
    unnamed = {"type": "webhook", "url": "https://a.example/x", "limits": {"rate_per_s": 3}}
    assert limit_specs("acme", unnamed, no_defaults, recorded)[0].rate_per_s == 3.0


@dataclass(frozen=True)
class Quota(Ops):
    owner_max_in_flight: int = 0


def test_the_owner_quota_caps_every_run_of_the_owner_whatever_its_target():
    settings = Quota(owner_max_in_flight=7)
    a = limit_specs("acme", webhook("https://a.example/x"), settings)
    b = limit_specs("acme", {"type": "queue", "topic": "t"}, settings)
    other = limit_specs("globex", webhook("https://a.example/x"), settings)
    assert a == b == [LimitSpec("owner-total:acme", None, 7)]
    assert other == [LimitSpec("owner-total:globex", None, 7)]


def test_the_owner_quota_comes_on_top_of_the_jobs_limits_and_the_operators_defaults():
    settings = Quota(target_max_concurrency=200, owner_max_in_flight=3)
    specs = limit_specs("acme", webhook("https://a.example/x", max_concurrency=5), settings)
    assert [spec.key for spec in specs] == [
        "owner:acme:https://a.example:443",
        "all:https://a.example:443",
        "owner-total:acme",
    ]
    assert limit_specs("acme", webhook("https://a.example/x"), Quota()) == []


def test_no_owner_name_or_job_key_can_reach_another_owners_quota():
    settings = Quota(owner_max_in_flight=1)
    [quota] = limit_specs("a/b:c", webhook("https://x.example/"), settings)
    assert quota.key == "owner-total:a%2Fb%3Ac"
    forged = webhook("https://x.example/", key="owner-total:acme", max_concurrency=1)
    keyed = limit_specs("acme", forged, settings)
    assert [spec.key for spec in keyed] == ["owner:acme:key:owner-total:acme", "owner-total:acme"]
