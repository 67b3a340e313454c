"""The fuzz tier: hypothesis drives the real API, worker and registry with hostile input.

The API fixtures are the integration tier's (tests/integration/api_fixtures.py); pytest
finds fixtures by name in conftest.py, so they are handed on here.
"""

from __future__ import annotations

import ipaddress

import pytest

from app.services import addresses
from tests.integration.api_fixtures import alice, api_app, api_settings, bob, live_server

__all__ = ["alice", "api_app", "api_settings", "bob", "live_server", "no_dns"]


def _resolve_literals_only(url: str, allow_private: bool) -> list[str]:
    host, _port = addresses.target_host(url)
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise addresses.UnresolvableHost(f"host {host!r} cannot be resolved (fuzz: no DNS)") from None
    return [host]


@pytest.fixture(scope="module")
def no_dns():
    """Host names are not looked up (IP literals resolve to themselves, names do not):
    a drawn host never waits on DNS."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(addresses, "resolve_target", _resolve_literals_only)
        yield
