"""`punctual dev` with PUNCTUAL_LOG_FORMAT=json: every line it prints is one JSON object.

Run as a user would (tests/acceptance/dev_process.py's clean environment, a temp
dir, a free port), stopped with SIGINT once the stack is up. The supervisor's own
lines (the banner included) come as process `dev`; its children's as theirs, the
API's access log among them (the supervisor polls /healthz while it starts).
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time

import pytest

from tests.acceptance.dev_process import START_TIMEOUT_S, STOP_TIMEOUT_S, clean_env

pytestmark = pytest.mark.acceptance


def test_dev_prints_one_json_object_per_line(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**clean_env(), "PUNCTUAL_LOG_FORMAT": "json"}
    log_path = tmp_path / "dev.log"
    with open(log_path, "wb") as log:
        dev = subprocess.Popen(
            ["punctual", "dev", "--port", str(port), "--data-dir", str(tmp_path / "data")],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while "Punctual dev is up" not in log_path.read_text(errors="replace"):
            assert dev.poll() is None, log_path.read_text(errors="replace")
            assert time.monotonic() < deadline, log_path.read_text(errors="replace")
            time.sleep(0.3)
        dev.send_signal(signal.SIGINT)
        dev.wait(STOP_TIMEOUT_S)
    finally:
        if dev.poll() is None:
            dev.kill()
            dev.wait(10)
    entries = []
    for line in log_path.read_text(errors="replace").splitlines():
        if line.strip():
            try:
                entries.append(json.loads(line))
            except ValueError:
                pytest.fail(f"not a JSON line: {line!r}")
    processes = {entry["process"] for entry in entries}
    assert {"dev", "api"} <= processes, processes
    [banner] = [entry for entry in entries if "Punctual dev is up" in entry["message"]]
    assert banner["process"] == "dev" and f"http://127.0.0.1:{port}" in banner["message"]
    assert any(
        entry.get("logger") == "punctual.access" and entry.get("path") == "/healthz" for entry in entries
    )
