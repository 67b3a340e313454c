"""The private-address policy (docs/api.md "Private addresses")."""

from __future__ import annotations

import socket

import pytest

from app.services.addresses import (
    PrivateAddress,
    TargetAddressError,
    UnresolvableHost,
    is_public_address,
    resolve_target,
)

PUBLIC = [
    "8.8.8.8",
    "1.1.1.1",
    "93.184.216.34",
    "100.63.255.255",  # just below CGNAT
    "100.128.0.0",  # just above CGNAT
    "172.15.255.255",  # just below 172.16/12
    "172.32.0.0",  # just above
    "223.255.255.254",  # last unicast below multicast
    "2606:4700:4700::1111",
    "2001:4860:4860::8888",
    "::ffff:8.8.8.8",  # IPv4-mapped, judged by 8.8.8.8
    "::ffff:0808:0808",
    "2002:0808:0808::1",  # 6to4 of 8.8.8.8
    "64:ff9b::808:808",  # NAT64 of 8.8.8.8
]

PRIVATE = [
    # loopback
    "127.0.0.1",
    "127.255.255.254",
    "::1",
    # RFC 1918
    "10.0.0.1",
    "10.255.255.255",
    "172.16.0.1",
    "172.31.255.255",
    "192.168.0.1",
    "192.168.255.255",
    # CGNAT 100.64.0.0/10
    "100.64.0.0",
    "100.64.0.1",
    "100.127.255.255",
    # 0.0.0.0/8 ("this network") and the unspecified addresses
    "0.0.0.0",
    "0.1.2.3",
    "0.255.255.255",
    "::",
    # link-local (cloud metadata lives here)
    "169.254.0.1",
    "169.254.169.254",
    "fe80::1",
    "fe80::1%eth0",
    "febf:ffff::1",
    # IPv6 unique-local fc00::/7
    "fc00::1",
    "fd00::1",
    "fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
    # multicast
    "224.0.0.1",
    "233.252.0.1",
    "239.255.255.250",
    "ff02::1",
    "ff0e::1",
    # reserved, broadcast, documentation, benchmarking, protocol assignments
    "240.0.0.1",
    "255.255.255.255",
    "192.0.0.8",
    "192.0.2.1",
    "198.18.0.1",
    "198.51.100.1",
    "203.0.113.1",
    "2001:db8::1",
    "fec0::1",
    "100::1",
    # IPv4-mapped IPv6 judged by the IPv4 address
    "::ffff:127.0.0.1",
    "::ffff:7f00:1",
    "::ffff:10.0.0.1",
    "::ffff:169.254.169.254",
    "::ffff:100.64.0.1",
    "::ffff:0.0.0.0",
    # other IPv6 forms that lead to a private IPv4
    "2002:7f00:0001::1",  # 6to4 of 127.0.0.1
    "64:ff9b::a00:1",  # NAT64 of 10.0.0.1
    "::127.0.0.1",  # deprecated IPv4-compatible form
]

NOT_ADDRESSES = ["", "localhost", "example.com", "256.0.0.1", "1.2.3", "::g", "[::1]"]


@pytest.mark.parametrize("ip", PUBLIC)
def test_public(ip):
    assert is_public_address(ip) is True


@pytest.mark.parametrize("ip", PRIVATE)
def test_private(ip):
    assert is_public_address(ip) is False


@pytest.mark.parametrize("text", NOT_ADDRESSES)
def test_not_an_address_is_not_public(text):
    assert is_public_address(text) is False


@pytest.fixture
def fake_dns(monkeypatch):
    """Resolve names from a table, never from the network."""
    table: dict[str, list[str]] = {}

    def getaddrinfo(host, port, *args, **kwargs):
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [
            (
                socket.AF_INET6 if ":" in a else socket.AF_INET,
                socket.SOCK_STREAM,
                6,
                "",
                (a, port, 0, 0) if ":" in a else (a, port),
            )
            for a in table[host]
        ]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return table


def test_resolve_returns_each_address_once(fake_dns):
    fake_dns["api.example"] = ["93.184.216.34", "2606:4700::1", "93.184.216.34"]
    assert resolve_target("https://api.example/run", allow_private=False) == ["93.184.216.34", "2606:4700::1"]


def test_one_private_address_is_enough_to_refuse(fake_dns):
    fake_dns["mixed.example"] = ["93.184.216.34", "10.0.0.7"]
    with pytest.raises(PrivateAddress, match=r"10\.0\.0\.7.*not a public address"):
        resolve_target("https://mixed.example/run", allow_private=False)


def test_private_is_allowed_when_the_operator_says_so(fake_dns):
    fake_dns["internal.example"] = ["10.0.0.7"]
    assert resolve_target("http://internal.example:8080/", allow_private=True) == ["10.0.0.7"]


@pytest.mark.parametrize("allow_private", [False, True])
def test_unresolvable_host_is_refused_either_way(fake_dns, allow_private):
    with pytest.raises(UnresolvableHost, match="cannot be resolved"):
        resolve_target("https://nowhere.example/run", allow_private=allow_private)


@pytest.mark.parametrize("url", ["https:///path", "not a url", "http://host:notaport/", "http://[::1/"])
def test_a_url_without_a_usable_host_is_unresolvable(url):
    with pytest.raises(UnresolvableHost):
        resolve_target(url, allow_private=True)


def test_ip_literals_resolve_to_themselves():
    assert resolve_target("http://127.0.0.1:9/", allow_private=True) == ["127.0.0.1"]
    assert resolve_target("http://[::1]:9/", allow_private=True) == ["::1"]
    with pytest.raises(PrivateAddress):
        resolve_target("http://[::ffff:127.0.0.1]/", allow_private=False)


def test_errors_share_one_base_that_is_a_value_error():
    assert issubclass(UnresolvableHost, TargetAddressError)
    assert issubclass(PrivateAddress, TargetAddressError)
    assert issubclass(TargetAddressError, ValueError)


# --- a URL read as the webhook caller reads it -------------------------------------------


@pytest.mark.parametrize(
    "host",
    [
        "134744072",
        "127.1",
        "0177.0.0.1",
        "0x7f.0.0.1",
        "1.2.3.4",
        "01.2.3.4",
        "256.1.1.1",
        "1.2.3.4.",
        "1.2.3",
        "0.0.0.0",
        "255.255.255.255",
        "8.8.8.08",
        "example.com",
        "1e3",
        "[::1]",
        "[::ffff:1.2.3.4]",
    ],
)
def test_a_numeric_host_is_refused_exactly_when_the_webhook_caller_refuses_it(host):
    from aiohttp.helpers import is_canonical_ipv4_address, is_ip_address
    from yarl import URL

    from app.services.addresses import target_host

    raw = URL(f"http://{host}/").raw_host
    assert raw is not None
    caller_refuses = is_ip_address(raw) and ":" not in raw and not is_canonical_ipv4_address(raw)
    if caller_refuses:
        with pytest.raises(UnresolvableHost, match="dotted-quad"):
            target_host(f"http://{host}/")
    else:
        assert target_host(f"http://{host}:81/") == (raw, 81)


def test_the_host_resolved_is_the_one_the_caller_connects_to():
    from app.services.addresses import target_host

    assert target_host("http://Ex\u00e4mple.COM/x") == ("xn--exmple-cua.com", 80)
    assert target_host("https://user:pw@93.184.215.14/") == ("93.184.215.14", 443)
    for url in ("http://a.example\\@b.example/", "http://example.com:0/", "http://example.com:99999/"):
        with pytest.raises(UnresolvableHost):
            target_host(url)


def test_a_batch_resolves_each_host_once_in_parallel_within_one_deadline(monkeypatch):
    import threading
    import time

    from app.services.addresses import resolve_targets

    asked: list[str] = []
    both_in_flight = threading.Barrier(2, timeout=5)

    def getaddrinfo(host, port, *args, **kwargs):
        asked.append(host)
        if host == "slow.example":
            time.sleep(3)
        elif host in ("a.example", "b.example"):
            both_in_flight.wait()  # fails unless the two are looked up at the same time
        address = {"a.example": "93.184.215.14", "b.example": "10.0.0.1"}.get(host)
        if address is None:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    urls = [
        "http://a.example/1",
        "http://a.example/2",
        "http://b.example/",
        "http://slow.example/",
        "http://",
    ]
    started = time.monotonic()
    resolve = resolve_targets(urls, deadline_s=0.5)
    assert time.monotonic() - started < 2  # the deadline, not the slow host's 3 s
    assert sorted(asked) == ["a.example", "b.example", "slow.example"]  # each host once
    assert resolve("http://a.example/3", False) == ["93.184.215.14"]
    with pytest.raises(PrivateAddress):
        resolve("http://b.example/", False)  # private addresses judged per URL, as asked
    assert resolve("http://b.example/", True) == ["10.0.0.1"]
    with pytest.raises(UnresolvableHost, match="did not resolve within 0.5 s"):
        resolve("http://slow.example/", True)
    with pytest.raises(UnresolvableHost, match="cannot be resolved"):
        resolve("http://nowhere.example/", True)  # not in the batch: looked up when asked
