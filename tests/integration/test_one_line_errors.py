"""Every command stops on a bad setting or an unreachable service with one line, not a traceback.

Real commands in subprocesses, as an operator runs them: `celery -A app beat`,
`celery -A app worker`, `punctual migrate`, `punctual api`, and a client command
with no API to talk to. Each must exit non-zero with exactly one line on stderr,
and a bad setting must read the same from every one of them.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.processes import CELERY, REPO

pytestmark = pytest.mark.integration

PUNCTUAL = str(Path(sys.executable).parent / "punctual")


def _env(**punctual: str) -> dict[str, str]:
    clean = {
        k: v for k, v in os.environ.items() if not k.startswith("PUNCTUAL_") or k.startswith("PUNCTUAL_TEST_")
    }
    return {**clean, **punctual}


def _run(argv: list[str], env: dict[str, str], timeout_s: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)


def _one_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode != 0, (result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


COMMANDS = {
    "beat": [CELERY, "-A", "app", "beat"],
    "worker": [CELERY, "-A", "app", "worker", "-c", "1"],
    "migrate": [PUNCTUAL, "migrate"],
    "api": [PUNCTUAL, "api", "--port", "0"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize(
    "variable, value, message",
    [
        ("PUNCTUAL_LEASE_S", "abc", "punctual: PUNCTUAL_LEASE_S='abc': not a number"),
        ("PUNCTUAL_LOG_FORMAT", "yaml", "punctual: PUNCTUAL_LOG_FORMAT='yaml': must be text or json"),
        ("PUNCTUAL_SHARDS", "3", "punctual: PUNCTUAL_SHARDS=3: must be a power of two (1, 2, 4, 8, 16, ...)"),
    ],
)
def test_a_bad_setting_stops_every_process_with_the_same_line(command, variable, value, message):
    result = _run(COMMANDS[command], _env(**{variable: value}))
    assert _one_line(result) == message
    assert result.returncode == 2


def test_migrate_against_a_missing_database_says_so_in_one_line(pg_admin):
    from tests.conftest import _pg_url

    dsn = _pg_url("pt_no_such_database")
    result = _run([PUNCTUAL, "migrate"], _env(PUNCTUAL_DATABASE_URLS=dsn))
    line = _one_line(result)
    assert line.startswith("punctual: cannot migrate postgresql://"), line
    assert 'database "pt_no_such_database" does not exist' in line


def test_migrate_against_no_server_says_so_in_one_line():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = _run([PUNCTUAL, "migrate"], _env(PUNCTUAL_DATABASE_URLS=f"postgresql://root@127.0.0.1:{port}/x"))
    line = _one_line(result)
    assert line.startswith(f"punctual: cannot migrate postgresql://root@127.0.0.1:{port}/x: "), line
    assert "refused" in line.lower()


def test_a_client_command_with_no_api_running_says_so_in_one_line():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    result = _run([PUNCTUAL, "jobs", "list"], _env(PUNCTUAL_URL=url, PUNCTUAL_API_KEY="pk_anything"))
    assert _one_line(result) == (
        f"punctual: no Punctual API answers at {url}: connection refused (is `punctual api` running?)"
    )


def test_a_url_without_its_scheme_is_named_as_the_cause():
    result = _run([PUNCTUAL, "jobs", "list"], _env(PUNCTUAL_URL="localhost:8000", PUNCTUAL_API_KEY="pk_x"))
    assert _one_line(result) == (
        "punctual: PUNCTUAL_URL='localhost:8000' has no scheme: say http://localhost:8000 or https://localhost:8000"
    )
    assert result.returncode == 2
    typed = _run([PUNCTUAL, "dead-letters", "--url", "localhost:8000"], _env(PUNCTUAL_API_KEY="pk_x"))
    assert _one_line(typed).startswith("punctual: --url='localhost:8000' has no scheme")


def test_an_operator_command_away_from_a_clone_names_the_unset_variable(tmp_path):
    result = subprocess.run(
        [PUNCTUAL, "keys", "list"], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=60
    )
    line = _one_line(result)
    assert line.startswith("punctual: PUNCTUAL_DATABASE_URLS is not set, so the embedded registry"), line
    assert f"{tmp_path}/.punctual/registry.sqlite3 does not exist" in line
    assert not (tmp_path / ".punctual").exists()  # looking created nothing
