"""`punctual keys list|revoke|rotate` on the real registry; revocation reaches every API process,
and a rotated owner's calls carry both signatures during the window."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from app.api import create_app
from app.cli import main
from app.core.delivery import delivery_headers
from app.core.timefmt import utcnow
from app.registry.engines import registry_for
from app.registry.schema import owners
from app.services.owners import KEY_CACHE_TTL_S, OwnerDirectory, create_key
from punctual_client import SignatureError, verify_signature

pytestmark = pytest.mark.integration


@pytest.fixture
def punctual(api_settings):
    runner = CliRunner()
    env = {"PUNCTUAL_DATABASE_URLS": ",".join(api_settings.database_urls)}

    def run(*args, ok=True):
        result = runner.invoke(main, list(args), env=env, catch_exceptions=False)
        if ok:
            assert result.exit_code == 0, result.output
        return result

    return run


def test_create_list_and_revoke(punctual, alice):
    made = json.loads(punctual("keys", "create", "--owner", alice.owner, "--json").stdout)
    assert made["owner"] == alice.owner and made["api_key"].startswith("pk_") and len(made["key_id"]) == 12
    listed = json.loads(punctual("keys", "list", "--owner", alice.owner, "--json").stdout)["items"]
    assert [k["key_id"] for k in listed][-1] == made["key_id"] and len(listed) == 2  # alice's own key too
    assert all(k["revoked_at"] is None and "api_key" not in k for k in listed)
    table = punctual("keys", "list", "--owner", alice.owner).stdout
    assert table.splitlines()[0].split() == ["ID", "OWNER", "CREATED", "REVOKED"] and made["key_id"] in table

    revoked = json.loads(punctual("keys", "revoke", made["key_id"], "--json").stdout)
    assert revoked["key_id"] == made["key_id"] and revoked["revoked_at"]
    listed = {k["key_id"]: k for k in json.loads(punctual("keys", "list", "--json").stdout)["items"]}
    assert listed[made["key_id"]]["revoked_at"] == revoked["revoked_at"]
    again = punctual("keys", "revoke", made["key_id"], "--json")  # repeating it changes nothing
    assert json.loads(again.stdout)["revoked_at"] == revoked["revoked_at"]


def test_revoke_refuses_unknown_and_ambiguous_ids(punctual):
    missing = punctual("keys", "revoke", "0123456789ab", ok=False)
    assert missing.exit_code == 2 and "no key" in missing.output
    short = punctual("keys", "revoke", "abc", ok=False)
    assert short.exit_code == 2 and "12" in short.output


def test_a_revoked_key_is_refused_by_every_api_process_within_seconds(punctual, api_settings, alice):
    made = json.loads(punctual("keys", "create", "--owner", alice.owner, "--json").stdout)
    processes = [create_app(api_settings).test_client() for _ in range(2)]  # two caches, as two processes
    headers = {"Authorization": f"Bearer {made['api_key']}"}
    for client in processes:
        assert client.get("/jobs", headers=headers).status_code == 200  # the key is now cached in each
    punctual("keys", "revoke", made["key_id"])
    deadline = time.monotonic() + KEY_CACHE_TTL_S + 5
    pending = list(processes)
    while pending and time.monotonic() < deadline:
        pending = [c for c in pending if c.get("/jobs", headers=headers).status_code != 401]
        time.sleep(0.2)
    assert pending == []
    assert KEY_CACHE_TTL_S <= 5  # "within seconds" is the cache's bound
    assert processes[0].get("/jobs", headers={"Authorization": f"Bearer {alice.api_key}"}).status_code == 200


def test_rotate_signs_with_both_secrets_during_the_window(punctual, api_settings):
    owner = f"rotating-{time.monotonic_ns()}"
    old = create_key(registry_for(api_settings), owner).signing_secret
    rotated = json.loads(punctual("keys", "rotate", "--owner", owner, "--window-s", "3600", "--json").stdout)
    new = rotated["signing_secret"]
    assert new != old and rotated["owner"] == owner and rotated["previous_secret_until"]

    secrets = OwnerDirectory(registry_for(api_settings)).signing_secrets(owner)
    assert secrets == (new, old)
    body = b'{"a":1}'
    header = delivery_headers(
        job_id="j", scheduled_for=utcnow(), attempt=1, body=body, signing_secrets=secrets
    )["Punctual-Signature"]
    assert header.startswith("t=") and header.count("v1=") == 2
    verify_signature(old, header, body)
    verify_signature(new, header, body)
    verify_signature([new, old], header, body)
    with pytest.raises(SignatureError):
        verify_signature("whsec_other", header, body)

    # Once the window is over only the new secret signs.
    with registry_for(api_settings).home.begin() as conn:
        conn.execute(
            sa.update(owners)
            .where(owners.c.owner == owner)
            .values(previous_secret_until=utcnow() - timedelta(seconds=1))
        )
    assert OwnerDirectory(registry_for(api_settings)).signing_secrets(owner) == (new,)


def test_rotate_with_no_window_drops_the_old_secret_at_once(punctual, api_settings):
    owner = f"rotating-{time.monotonic_ns()}"
    create_key(registry_for(api_settings), owner)
    rotated = json.loads(punctual("keys", "rotate", "--owner", owner, "--window-s", "0", "--json").stdout)
    assert OwnerDirectory(registry_for(api_settings)).signing_secrets(owner) == (rotated["signing_secret"],)
    unknown = punctual("keys", "rotate", "--owner", "nobody-at-all", ok=False)
    assert unknown.exit_code == 2 and "no owner" in unknown.output
