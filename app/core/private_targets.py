"""Which private targets the operator allows: PUNCTUAL_PRIVATE_TARGETS (pure).

Targets must be public (app.services.addresses) unless PUNCTUAL_ALLOW_PRIVATE_TARGETS
allows every private address, or this allow-list allows some of them, by:

- network: `10.0.0.0/8`, `fd00::/8`, or one address (`10.1.2.3`); an address that
  lies in it may be called. An IPv4-mapped IPv6 address is judged by its IPv4 one.
- host name: `db.internal` (that name only) or `*.svc.internal` (any name below it);
  such a name may resolve to any private address: the operator vouches for its DNS.

The list is checked where the public-only rule is: at create and PATCH (what the
host resolves to), and on the worker's socket (the address it connects to).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import TypeAlias

from app.core.errors import SettingsError

__all__ = ["PrivateTargets", "TargetPolicy", "policy_of", "VARIABLE"]

VARIABLE = "PUNCTUAL_PRIVATE_TARGETS"
Network: TypeAlias = ipaddress.IPv4Network | ipaddress.IPv6Network
_LABEL = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)")


@dataclass(frozen=True)
class PrivateTargets:
    """Private targets allowed: every one (`allow_all`), or those of the allow-list."""

    allow_all: bool = False
    networks: tuple[Network, ...] = ()
    hosts: tuple[str, ...] = ()  # lower case, no trailing dot; "*.example" for the names below it

    @classmethod
    def parse(cls, text: str, allow_all: bool = False) -> PrivateTargets:
        """The allow-list of PUNCTUAL_PRIVATE_TARGETS (comma-separated); SettingsError with
        one line per bad entry."""
        networks: list[Network] = []
        hosts: list[str] = []
        errors: list[str] = []
        for entry in (part.strip() for part in text.split(",")):
            if not entry:
                continue
            try:
                allowed = _entry(entry)
            except ValueError as exc:
                errors.append(f"{VARIABLE}: {entry!r} {exc}")
                continue
            if isinstance(allowed, str):
                hosts.append(allowed)
            else:
                networks.append(allowed)
        if errors:
            raise SettingsError("\n".join(errors))
        return cls(allow_all, tuple(dict.fromkeys(networks)), tuple(dict.fromkeys(hosts)))

    def allows_host(self, host: str | None) -> bool:
        """True when `host` (a URL's host name) is on the list, by name."""
        if self.allow_all:
            return True
        if not host or not self.hosts:
            return False
        name = host.lower().rstrip(".")
        return any(name == h or (h.startswith("*.") and name.endswith(h[1:])) for h in self.hosts)

    def allows(self, host: str | None, address: str) -> bool:
        """True when a private `address` (the host's, or a literal) may be called."""
        if self.allows_host(host):
            return True
        if not self.networks:
            return False
        try:
            ip = ipaddress.ip_address(address.split("%", 1)[0])
        except ValueError:
            return False
        candidates: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = [ip]
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            candidates.append(ip.ipv4_mapped)
        return any(c in net for c in candidates for net in self.networks if net.version == c.version)

    def __bool__(self) -> bool:
        """True when some private target is allowed."""
        return self.allow_all or bool(self.networks or self.hosts)


# What the API's validation and the worker's caller take: a bool means all or nothing
# (PUNCTUAL_ALLOW_PRIVATE_TARGETS alone), a PrivateTargets the allow-list as well.
TargetPolicy: TypeAlias = bool | PrivateTargets


def policy_of(value: TargetPolicy) -> PrivateTargets:
    """`value` as a PrivateTargets (True: every private target; False: none)."""
    if isinstance(value, PrivateTargets):
        return value
    return PrivateTargets(allow_all=bool(value))


def _entry(entry: str) -> Network | str:
    """A network (an address is a network of one) or a host name; ValueError saying why not."""
    if "/" in entry:
        try:
            return ipaddress.ip_network(entry)
        except ValueError:
            try:
                loose = ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError(
                    "is not a network (an address and a prefix length, say 10.0.0.0/8)"
                ) from None
            raise ValueError(f"has bits set after its prefix: the network is {loose}") from None
    try:
        return ipaddress.ip_network(ipaddress.ip_address(entry))
    except ValueError:
        pass
    name = entry.lower().rstrip(".")
    labels = name[2:].split(".") if name.startswith("*.") else name.split(".")
    if len(name) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise ValueError(
            "is not a network, an address or a host name"
            " (say 10.0.0.0/8, 10.1.2.3, db.internal or *.internal)"
        )
    return name
