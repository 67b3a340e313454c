"""PUNCTUAL_PRIVATE_TARGETS: networks and host names the operator allows although private.

The list is pure (app.core.private_targets); resolve_target applies it at create
and PATCH, with DNS answered by a table (the call-time check on the socket is
tests/integration/test_webhook_caller.py).
"""

from __future__ import annotations

import ipaddress

import pytest

from app.core.errors import SettingsError
from app.core.private_targets import PrivateTargets, policy_of
from app.services.addresses import PrivateAddress, resolve_target
from app.settings import Settings
from tests.unit.test_addresses import fake_dns  # noqa: F401  (the fixture)

LIST = PrivateTargets.parse("10.0.0.0/8, fd00::/8,192.168.1.5,db.internal,*.svc.internal,")


def test_entries_are_networks_addresses_and_host_names():
    assert LIST.networks == (
        ipaddress.ip_network("10.0.0.0/8"),
        ipaddress.ip_network("fd00::/8"),
        ipaddress.ip_network("192.168.1.5/32"),
    )
    assert LIST.hosts == ("db.internal", "*.svc.internal")
    assert not LIST.allow_all and LIST and not PrivateTargets.parse("")


@pytest.mark.parametrize(
    "host, address, allowed",
    [
        (None, "10.9.8.7", True),
        (None, "::ffff:10.9.8.7", True),  # IPv4-mapped: judged by its IPv4 address
        (None, "fd12::1", True),
        (None, "192.168.1.5", True),
        (None, "192.168.1.6", False),
        (None, "127.0.0.1", False),
        ("db.internal", "127.0.0.1", True),  # a listed name may resolve anywhere private
        ("DB.Internal.", "172.16.0.1", True),
        ("x.db.internal", "172.16.0.1", False),  # a name, not its subdomains
        ("api.svc.internal", "172.16.0.1", True),
        ("a.b.svc.internal", "172.16.0.1", True),
        ("svc.internal", "172.16.0.1", False),  # *.x is what lies below x
        ("evilsvc.internal", "172.16.0.1", False),
    ],
)
def test_what_the_list_allows(host, address, allowed):
    assert LIST.allows(host, address) is allowed


def test_allow_all_and_bools_mean_all_or_nothing():
    assert PrivateTargets(allow_all=True).allows(None, "127.0.0.1")
    assert policy_of(True).allow_all and not policy_of(False)
    assert policy_of(LIST) is LIST


def test_each_bad_entry_gets_a_line_naming_the_variable():
    with pytest.raises(SettingsError) as exc:
        PrivateTargets.parse("10.0.0.1/8,ok.internal,not a host,10.0.0.0/33,-bad-.internal")
    lines = str(exc.value).splitlines()
    assert lines == [
        "PUNCTUAL_PRIVATE_TARGETS: '10.0.0.1/8' has bits set after its prefix: the network is 10.0.0.0/8",
        "PUNCTUAL_PRIVATE_TARGETS: 'not a host' is not a network, an address or a host name"
        " (say 10.0.0.0/8, 10.1.2.3, db.internal or *.internal)",
        "PUNCTUAL_PRIVATE_TARGETS: '10.0.0.0/33' is not a network"
        " (an address and a prefix length, say 10.0.0.0/8)",
        "PUNCTUAL_PRIVATE_TARGETS: '-bad-.internal' is not a network, an address or a host name"
        " (say 10.0.0.0/8, 10.1.2.3, db.internal or *.internal)",
    ]


def test_settings_read_the_list_beside_the_all_or_nothing_flag():
    settings = Settings.from_env({"PUNCTUAL_PRIVATE_TARGETS": "10.0.0.0/8,db.internal"})
    policy = settings.private_target_policy
    assert not policy.allow_all and policy.allows("db.internal", "10.1.1.1")
    everything = Settings.from_env({"PUNCTUAL_ALLOW_PRIVATE_TARGETS": "1"}).private_target_policy
    assert everything.allow_all
    with pytest.raises(SettingsError, match="PUNCTUAL_PRIVATE_TARGETS: 'x/y'"):
        Settings.from_env({"PUNCTUAL_PRIVATE_TARGETS": "x/y"})


def test_create_time_resolution_applies_the_list(fake_dns):  # noqa: F811
    fake_dns["db.internal"] = ["172.16.0.9"]
    fake_dns["reports.example"] = ["10.1.2.3"]
    fake_dns["mixed.example"] = ["10.1.2.3", "172.16.0.9"]
    fake_dns["other.example"] = ["172.16.0.9"]
    assert resolve_target("http://db.internal/run", LIST) == ["172.16.0.9"]
    assert resolve_target("http://reports.example/run", LIST) == ["10.1.2.3"]
    fake_dns["10.20.30.40"] = ["10.20.30.40"]  # an address literal resolves to itself
    assert resolve_target("http://10.20.30.40:8080/", LIST) == ["10.20.30.40"]
    fake_dns["127.0.0.1"] = ["127.0.0.1"]
    for refused in ("http://mixed.example/run", "http://other.example/run", "http://127.0.0.1/"):
        with pytest.raises(PrivateAddress, match="PUNCTUAL_PRIVATE_TARGETS"):
            resolve_target(refused, LIST)
