"""The private-address policy: which target addresses Punctual may call.

docs/api.md "Private addresses": an address is callable only when it is globally
routable, or allowed by the operator (PUNCTUAL_ALLOW_PRIVATE_TARGETS, all of them;
PUNCTUAL_PRIVATE_TARGETS, the networks and host names listed:
app.core.private_targets). Loopback, RFC 1918, link-local, CGNAT, 0.0.0.0/8,
multicast, reserved, IPv6 unique-local and link-local addresses are private; an
IPv4-mapped IPv6 address (::ffff:a.b.c.d) is judged by its IPv4 address. The API
resolves a target host at create time with `resolve_target`; workers check the
address a socket actually connected to (app.worker.webhook), so a DNS answer that
changes between the two checks (DNS rebinding) gains nothing.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from app.core.private_targets import TargetPolicy, policy_of

__all__ = [
    "TargetAddressError",
    "UnresolvableHost",
    "PrivateAddress",
    "is_public_address",
    "resolve_target",
]


class TargetAddressError(ValueError):
    """A target's host cannot be called; the message says why (fit for a 422)."""


class UnresolvableHost(TargetAddressError):
    """The host has no address (raised with or without allow_private)."""


class PrivateAddress(TargetAddressError):
    """The host resolves to an address that is not public."""


# Spelled out besides `is_global` on purpose: Python's own tables changed across
# 3.11 patch releases (CVE-2024-4032), and the policy must not move with them.
_NOT_PUBLIC = tuple(
    ipaddress.ip_network(net)
    for net in (
        "0.0.0.0/8",  # "this network"
        "10.0.0.0/8",
        "100.64.0.0/10",  # CGNAT
        "127.0.0.0/8",
        "169.254.0.0/16",
        "172.16.0.0/12",
        "192.0.0.0/24",  # IETF protocol assignments
        "192.0.2.0/24",  # TEST-NET-1
        "192.168.0.0/16",
        "198.18.0.0/15",  # benchmarking
        "198.51.100.0/24",  # TEST-NET-2
        "203.0.113.0/24",  # TEST-NET-3
        "224.0.0.0/4",  # multicast
        "240.0.0.0/4",  # reserved, and the broadcast address
        "::/128",
        "::1/128",
        "64:ff9b:1::/48",  # local-use NAT64
        "100::/64",  # discard-only
        "2001:db8::/32",  # documentation
        "fc00::/7",  # unique-local
        "fe80::/10",  # link-local
        "fec0::/10",  # deprecated site-local
        "ff00::/8",  # multicast
    )
)

_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def is_public_address(ip: str) -> bool:
    """True when `ip` (an IPv4 or IPv6 literal, optionally with a %scope) is global.

    Anything that does not parse as an address is not public.
    """
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address):
        # ::ffff:127.0.0.1 reaches 127.0.0.1; 6to4 (2002::/16) and NAT64
        # (64:ff9b::/96) addresses lead to the IPv4 address they embed.
        embedded = address.ipv4_mapped or address.sixtofour
        if embedded is None and address in _NAT64:
            embedded = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if embedded is not None:
            return is_public_address(str(embedded))
    if not address.is_global:
        return False
    if address.is_multicast or address.is_reserved or address.is_unspecified:
        return False
    return not any(address in net for net in _NOT_PUBLIC if net.version == address.version)


def _host_and_port(url: str) -> tuple[str, int]:
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError as exc:  # a port that is not a number, a bad IPv6 literal
        raise UnresolvableHost(f"cannot read the host of {url!r}: {exc}") from None
    if not host:
        raise UnresolvableHost(f"{url!r} has no host")
    return host, port or (443 if parts.scheme == "https" else 80)


def resolve_target(url: str, allow_private: TargetPolicy) -> list[str]:
    """Resolve the host of a target URL to its addresses (deduplicated, in order).

    Raises UnresolvableHost when the host has no address, whatever `allow_private`
    says; raises PrivateAddress when any address is neither public nor allowed by
    `allow_private` (True: every one; a PrivateTargets: its networks and host
    names) -- a client may connect to any of them, so one is enough to refuse.
    """
    host, port = _host_and_port(url)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise UnresolvableHost(f"host {host!r} cannot be resolved ({exc})") from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not addresses:
        raise UnresolvableHost(f"host {host!r} has no address")
    policy = policy_of(allow_private)
    refused = [a for a in addresses if not is_public_address(a) and not policy.allows(host, a)]
    if refused:
        raise PrivateAddress(
            f"host {host!r} resolves to {refused[0]}, which is not a public address (loopback, private"
            " and link-local targets need their network or host in PUNCTUAL_PRIVATE_TARGETS,"
            " or PUNCTUAL_ALLOW_PRIVATE_TARGETS=1)"
        )
    return addresses
