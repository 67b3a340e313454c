"""`punctual api` as operators run it: gunicorn, its control socket, its logs.

Real `punctual api` processes on free ports, on the module's Postgres shards, with
HOME pointed at a temporary directory so their control sockets land there. Two
instances on one host each keep a control socket of their own (gunicorn's default
is one shared path, which the second instance takes from the first), and each
socket answers for its own instance. With PUNCTUAL_LOG_FORMAT=json every line the
API writes is one JSON object, requests included (the access log).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests.e2e.processes import Proc

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def env(pg_dsns, tmp_path_factory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("home")
    clean = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR" and not k.startswith("PUNCTUAL_")}
    return {
        **clean,
        "HOME": str(home),
        "PUNCTUAL_DATABASE_URLS": ",".join(pg_dsns),
        "PUNCTUAL_DB_POOL_SIZE": "2",
    }


def _start_api(env: dict, log_dir: Path, name: str, port: int, **extra: str) -> Proc:
    proc = Proc(
        name,
        [str(BIN / "punctual"), "api", "--port", str(port), "--workers", "1", "--threads", "2"],
        {**env, **extra},
        log_dir,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if not proc.alive():
            raise AssertionError(f"{name} exited:\n{proc.tail()}")
        try:
            if requests.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                return proc
        except requests.RequestException:
            pass
        time.sleep(0.3)
    raise AssertionError(f"{name} does not answer:\n{proc.tail()}")


def _listeners(socket_path: Path) -> str:
    result = subprocess.run(
        [str(BIN / "gunicornc"), "-s", str(socket_path), "-c", "show listeners", "-j"],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_two_instances_on_one_host_keep_a_control_socket_each(env, tmp_path):
    port_a, port_b = _free_port(), _free_port()
    api_a = _start_api(env, tmp_path, "api-a", port_a)
    api_b = _start_api(env, tmp_path, "api-b", port_b)
    sockets = Path(env["HOME"]) / ".gunicorn"
    try:
        socket_a = sockets / f"punctual-api-127.0.0.1-{port_a}.ctl"
        socket_b = sockets / f"punctual-api-127.0.0.1-{port_b}.ctl"
        assert socket_a.is_socket() and socket_b.is_socket(), sorted(p.name for p in sockets.iterdir())
        assert not (sockets / "gunicorn.ctl").exists()
        # Each socket is its own instance's: it lists that instance's port only.
        assert f":{port_a}" in _listeners(socket_a) and f":{port_b}" not in _listeners(socket_a)
        assert f":{port_b}" in _listeners(socket_b) and f":{port_a}" not in _listeners(socket_b)
        api_b.stop()
        assert socket_a.is_socket() and f":{port_a}" in _listeners(socket_a)  # b's exit leaves a's alone
    finally:
        api_a.stop()
        api_b.stop()


def test_json_logs_are_one_object_per_line_with_an_access_log(env, tmp_path):
    from app.registry.engines import registry_for
    from app.services.owners import create_key
    from app.settings import Settings

    key = create_key(registry_for(Settings.from_env(env)), "log-reader")
    port = _free_port()
    api = _start_api(env, tmp_path, "api-json", port, PUNCTUAL_LOG_FORMAT="json")
    try:
        assert requests.get(f"http://127.0.0.1:{port}/jobs", timeout=5).status_code == 401
        authorized = {"Authorization": f"Bearer {key.api_key}"}
        assert requests.get(f"http://127.0.0.1:{port}/jobs", headers=authorized, timeout=5).status_code == 200
    finally:
        api.stop()
    lines = [line for line in api.log_path.read_text().splitlines() if line.strip()]
    entries = [json.loads(line) for line in lines]  # every line, gunicorn's included
    assert all(entry["process"] == "api" and "ts" in entry and "level" in entry for entry in entries)
    assert any(entry["logger"] == "gunicorn.error" for entry in entries)  # start and stop lines
    access = [entry for entry in entries if entry["logger"] == "punctual.access"]
    healthz = [entry for entry in access if entry["path"] == "/healthz"]
    jobs = [entry for entry in access if entry["path"] == "/jobs"]
    assert healthz and healthz[-1]["status"] == 200 and healthz[-1]["method"] == "GET"
    assert [(entry["status"], entry.get("owner")) for entry in jobs] == [(401, None), (200, "log-reader")]
    assert all(entry["method"] == "GET" and entry["duration_ms"] >= 0 for entry in jobs)
    assert jobs[0]["message"].startswith("GET /jobs 401 ")


def _raw(port: int, request: bytes) -> tuple[str, dict, bytes]:
    """Send `request` as it is; the status line, headers and body of the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(request)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    return status, {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}, body


def test_the_requests_gunicorn_refuses_itself_are_answered_as_problems_naming_the_limit(env, tmp_path):
    port = _free_port()
    api = _start_api(env, tmp_path, "api-limits", port)
    try:
        cases = {
            b"GET /jobs?name=" + b"x" * 5000 + b" HTTP/1.1\r\nHost: a\r\n\r\n": ("414", "4,094 bytes"),
            b"GET /jobs HTTP/1.1\r\nHost: a\r\nX-Big: " + b"x" * 9000 + b"\r\n\r\n": ("431", "8,190 bytes"),
            b"GET /jobs HTTP/1.1\r\nHost: a\r\n"
            + b"".join(b"X-%d: 1\r\n" % i for i in range(150))
            + b"\r\n": ("431", "more than 100 headers"),
            b"GET /jobs HTTP/9.9\r\nHost: a\r\n\r\n": ("400", "HTTP Version"),
        }
        for request, (status, figure) in cases.items():
            line, headers, body = _raw(port, request)
            assert line.split()[1] == status, (line, body[:200])
            assert headers["content-type"] == "application/problem+json"
            problem = json.loads(body)
            assert problem["status"] == int(status) and problem["errors"] == []
            assert figure in problem["detail"]
        # The API is still up and answers as before.
        assert requests.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
    finally:
        api.stop()
