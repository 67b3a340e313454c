"""Settings: read once, validated, one-line errors naming the variable."""

from __future__ import annotations

import subprocess
import sys

import pytest

from app.core.errors import SettingsError
from app.settings import VARIABLES, Settings


def test_defaults_match_the_contract_table():
    settings = Settings.from_env({})
    assert settings.shards == 16
    assert settings.poll_interval_s == 1
    assert settings.lease_s == 20
    assert settings.heartbeat_s == 5
    assert settings.misfire_grace_s == 60
    assert settings.allow_private_targets is False
    assert settings.target_rate_per_s == 0
    assert settings.target_max_concurrency == 200
    assert settings.embedded and settings.database_urls[0].startswith("sqlite:///")
    assert settings.broker_url == "" and settings.redis_url == ""


def test_values_are_read_and_frozen():
    settings = Settings.from_env(
        {
            "PUNCTUAL_DATABASE_URLS": "postgresql://a@h1/db1, postgresql://a@h2:5433/db2",
            "PUNCTUAL_SHARDS": "8",
            "PUNCTUAL_ALLOW_PRIVATE_TARGETS": "1",
            "PUNCTUAL_LEASE_S": "30",
            "PUNCTUAL_HEARTBEAT_S": "10",
        }
    )
    assert settings.database_urls == ("postgresql://a@h1/db1", "postgresql://a@h2:5433/db2")
    assert settings.shards == 8 and settings.allow_private_targets and not settings.embedded
    with pytest.raises(AttributeError):
        settings.shards = 4  # type: ignore[misc]


@pytest.mark.parametrize(
    "env, variable",
    [
        ({"PUNCTUAL_SHARDS": "12"}, "PUNCTUAL_SHARDS"),
        ({"PUNCTUAL_SHARDS": "0"}, "PUNCTUAL_SHARDS"),
        ({"PUNCTUAL_SHARDS": "sixteen"}, "PUNCTUAL_SHARDS"),
        ({"PUNCTUAL_DATABASE_URLS": "mysql://x/y"}, "PUNCTUAL_DATABASE_URLS"),
        ({"PUNCTUAL_DATABASE_URLS": "postgresql://host-without-db"}, "PUNCTUAL_DATABASE_URLS"),
        (
            {
                "PUNCTUAL_DATABASE_URLS": ",".join(f"postgresql://h/d{i}" for i in range(3)),
                "PUNCTUAL_SHARDS": "2",
            },
            "PUNCTUAL_DATABASE_URLS",
        ),
        ({"PUNCTUAL_LEASE_S": "-1"}, "PUNCTUAL_LEASE_S"),
        ({"PUNCTUAL_HEARTBEAT_S": "90"}, "PUNCTUAL_HEARTBEAT_S"),
        ({"PUNCTUAL_ALLOW_PRIVATE_TARGETS": "maybe"}, "PUNCTUAL_ALLOW_PRIVATE_TARGETS"),
        ({"PUNCTUAL_REDIS_URL": "localhost:6379"}, "PUNCTUAL_REDIS_URL"),
        ({"PUNCTUAL_BROKER_URL": "rabbit"}, "PUNCTUAL_BROKER_URL"),
        ({"PUNCTUAL_SHARDSS": "16"}, "PUNCTUAL_SHARDSS"),
        ({"PUNCTUAL_CLAIM_AHEAD_S": "-1"}, "PUNCTUAL_CLAIM_AHEAD_S"),
        ({"PUNCTUAL_CLAIM_AHEAD_S": "301"}, "PUNCTUAL_CLAIM_AHEAD_S"),
        (
            {"PUNCTUAL_DATABASE_URLS": "postgresql://h/a", "PUNCTUAL_REPLICA_URLS": "mysql://r/a"},
            "PUNCTUAL_REPLICA_URLS",
        ),
        (
            {"PUNCTUAL_DATABASE_URLS": "postgresql://h/a", "PUNCTUAL_REPLICA_URLS": "postgresql://r"},
            "PUNCTUAL_REPLICA_URLS",
        ),
        (
            {"PUNCTUAL_DATABASE_URLS": "postgresql://h/a", "PUNCTUAL_REPLICA_URLS": "postgresql://h/a"},
            "PUNCTUAL_REPLICA_URLS",
        ),
        (
            {
                "PUNCTUAL_DATABASE_URLS": "postgresql://h/a",
                "PUNCTUAL_REPLICA_URLS": "postgresql://r/a,postgresql://r/a",
            },
            "PUNCTUAL_REPLICA_URLS",
        ),
        ({"PUNCTUAL_REPLICA_URLS": "postgresql://r/a"}, "PUNCTUAL_REPLICA_URLS"),  # embedded primary
        ({"PUNCTUAL_REPLICA_URLS": " , "}, "PUNCTUAL_REPLICA_URLS"),
        ({"PUNCTUAL_REPLICA_MAX_LAG_S": "0"}, "PUNCTUAL_REPLICA_MAX_LAG_S"),
        ({"PUNCTUAL_REPLICA_MAX_LAG_S": "inf"}, "PUNCTUAL_REPLICA_MAX_LAG_S"),
        ({"PUNCTUAL_REPLICA_MAX_LAG_S": "soon"}, "PUNCTUAL_REPLICA_MAX_LAG_S"),
    ],
)
def test_a_bad_value_names_its_variable(env, variable):
    with pytest.raises(SettingsError) as info:
        Settings.from_env(env)
    message = str(info.value)
    assert message.startswith(variable) and "\n" not in message


def test_help_lists_every_variable_of_the_contract_with_its_default():
    out = subprocess.run(
        [sys.executable, "-m", "app.cli", "--help"], capture_output=True, text=True, check=True
    ).stdout
    contract = {
        "PUNCTUAL_DATABASE_URLS": None,
        "PUNCTUAL_SHARDS": "16",
        "PUNCTUAL_BROKER_URL": None,
        "PUNCTUAL_REDIS_URL": None,
        "PUNCTUAL_POLL_INTERVAL_S": "1",
        "PUNCTUAL_LEASE_S": "20",
        "PUNCTUAL_HEARTBEAT_S": "5",
        "PUNCTUAL_MISFIRE_GRACE_S": "60",
        "PUNCTUAL_ALLOW_PRIVATE_TARGETS": "0",
        "PUNCTUAL_TARGET_RATE_PER_S": "0",
        "PUNCTUAL_TARGET_MAX_CONCURRENCY": "200",
    }
    lines = {line.split()[0]: line for line in out.splitlines() if line.strip().startswith("PUNCTUAL_")}
    for name, default in contract.items():
        assert name in lines, name
        if default is not None:
            assert f"[default: {default}]" in lines[name]
    assert {v.name for v in VARIABLES} <= set(lines)


def test_a_bad_variable_stops_a_command_with_one_line():
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "migrate"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PUNCTUAL_SHARDS": "12"},
    )
    assert result.returncode == 2
    assert (
        result.stderr.strip() == "punctual: PUNCTUAL_SHARDS=12: must be a power of two (1, 2, 4, 8, 16, ...)"
    )
