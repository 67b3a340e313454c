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
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, wait

from yarl import URL

from app.core.private_targets import TargetPolicy, policy_of

__all__ = [
    "TargetAddressError",
    "UnresolvableHost",
    "PrivateAddress",
    "is_public_address",
    "resolve_target",
    "resolve_targets",
    "target_host",
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

# Lookups of one batch's hosts at once (resolve_targets): each is a round trip to a name
# server, so a few threads clear a batch's distinct hosts well within its deadline.
RESOLVER_THREADS = 16


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


def target_host(url: str) -> tuple[str, int]:
    """The host and port a webhook call of `url` connects to, read as the webhook
    caller reads them (yarl, aiohttp's URL: the host in its IDNA form).

    UnresolvableHost for a URL the caller would refuse before connecting: one yarl
    cannot read, one without a host or with port 0, and a numeric host that is not a
    dotted quad (aiohttp refuses `134744072`, `127.1` and `0177.0.0.1`, which the
    resolver would still map onto an address), so such a target is refused at create
    rather than failing each call.
    """
    try:
        parsed = URL(url)
        host, port = parsed.raw_host, parsed.port
    except ValueError as exc:  # a port out of range, a bad IPv6 literal, a host IDNA refuses
        raise UnresolvableHost(f"cannot read the URL's host ({str(exc)[:200]})") from None
    if not host:
        raise UnresolvableHost("the URL has no host")
    if not port:
        raise UnresolvableHost("port 0 cannot be called")
    if ":" not in host and host.replace(".", "").isdigit() and not _dotted_quad(host):
        raise UnresolvableHost(
            f"host {host!r} is a number but not a dotted-quad IPv4 address (such as 8.8.8.8)"
        )
    return host, port


def _dotted_quad(host: str) -> bool:
    """Four decimal octets 0-255 without leading zeros: the one numeric IPv4 form the
    webhook caller calls (aiohttp's is_canonical_ipv4_address)."""
    parts = host.split(".")
    return len(parts) == 4 and all(
        part.isascii()
        and part.isdigit()
        and len(part) <= 3
        and (part == "0" or part[0] != "0")
        and int(part) <= 255
        for part in parts
    )


def resolve_target(url: str, allow_private: TargetPolicy) -> list[str]:
    """Resolve the host of a target URL to its addresses (deduplicated, in order).

    Raises UnresolvableHost when the host has no address, whatever `allow_private`
    says; raises PrivateAddress when any address is neither public nor allowed by
    `allow_private` (True: every one; a PrivateTargets: its networks and host
    names) -- a client may connect to any of them, so one is enough to refuse.
    """
    host, port = target_host(url)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, ValueError) as exc:  # gaierror; a label IDNA refuses; a NUL
        raise UnresolvableHost(f"host {host!r} cannot be resolved ({exc})") from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not addresses:
        raise UnresolvableHost(f"host {host!r} has no address")
    return _judged(host, addresses, allow_private)


def _judged(host: str, addresses: list[str], allow_private: TargetPolicy) -> list[str]:
    policy = policy_of(allow_private)
    refused = [a for a in addresses if not is_public_address(a) and not policy.allows(host, a)]
    if refused:
        raise PrivateAddress(
            f"host {host!r} resolves to {refused[0]}, which is not a public address (loopback, private"
            " and link-local targets need their network or host in PUNCTUAL_PRIVATE_TARGETS,"
            " or PUNCTUAL_ALLOW_PRIVATE_TARGETS=1)"
        )
    return addresses


Resolve = Callable[[str, TargetPolicy], list[str]]


def resolve_targets(urls: Iterable[str], deadline_s: float, threads: int = RESOLVER_THREADS) -> Resolve:
    """Resolve the hosts of many target URLs at once (a batch's): each distinct host
    and port once, up to `threads` at a time, all within `deadline_s`. Returns a
    `resolve_target` that answers from those results: a host still unresolved at the
    deadline is UnresolvableHost ("did not resolve within"), and a URL not among
    `urls` is resolved when asked.

    One slow name server costs the whole batch at most `deadline_s`, not its timeout
    once per job. The lookups left running at the deadline end in the background.
    """
    by_key: dict[tuple[str, int], str] = {}
    for url in urls:
        try:
            by_key.setdefault(target_host(url), url)
        except TargetAddressError:
            pass  # refused again, with its reason, when the URL is validated
    found: dict[tuple[str, int], list[str] | str] = {}
    if by_key:
        pool = ThreadPoolExecutor(max_workers=min(threads, len(by_key)), thread_name_prefix="resolve")
        # Private addresses are judged per URL below, with the caller's allow_private.
        futures = {key: pool.submit(resolve_target, url, True) for key, url in by_key.items()}
        wait(futures.values(), timeout=deadline_s)
        pool.shutdown(wait=False, cancel_futures=True)
        for key, future in futures.items():
            if not future.done() or future.cancelled():
                found[key] = f"host {key[0]!r} did not resolve within {deadline_s:g} s"
            elif isinstance(failure := future.exception(), TargetAddressError):
                found[key] = str(failure)
            elif failure is not None:
                found[key] = f"host {key[0]!r} cannot be resolved ({type(failure).__name__})"
            else:
                found[key] = future.result()

    def resolve(url: str, allow_private: TargetPolicy) -> list[str]:
        host, port = target_host(url)
        result = found.get((host, port))
        if result is None:
            return resolve_target(url, allow_private)
        if isinstance(result, str):  # raised anew for each URL: one exception is never raised twice
            raise UnresolvableHost(result)
        return _judged(host, result, allow_private)

    return resolve
