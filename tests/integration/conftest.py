"""The API fixtures (app.api on two Postgres shards) for every module here.

They live in api_fixtures.py with the helpers the tests import from it; pytest finds
fixtures by name in conftest.py, so the modules need not import them (and a fixture
imported and then taken as an argument reads as a shadowed name).
"""

from tests.integration.api_fixtures import alice, api_app, api_settings, bob, live_server

__all__ = ["alice", "api_app", "api_settings", "bob", "live_server"]
