"""The processes tests and benches start see only the settings they are given."""

from __future__ import annotations

import sys

from bench.stack import base_env
from tests.e2e.processes import Proc, child_env


def test_a_setting_exported_in_the_shell_does_not_reach_a_child(monkeypatch, tmp_path):
    monkeypatch.setenv("PUNCTUAL_DISPATCH_THREADS", "1000")
    monkeypatch.setenv("PATH_MARKER_FOR_TEST", "kept")
    printer = (
        "import os; e = os.environ; "
        "print(e.get('PUNCTUAL_DISPATCH_THREADS'), e['PUNCTUAL_SHARDS'], e['PATH_MARKER_FOR_TEST'])"
    )
    proc = Proc("env", [sys.executable, "-c", printer], {"PUNCTUAL_SHARDS": "16"}, tmp_path)
    assert proc.popen.wait(timeout=30) == 0, proc.tail()
    assert proc.log_path.read_text().split() == ["None", "16", "kept"]


def test_child_env_and_the_bench_base_env_drop_every_punctual_variable(monkeypatch):
    monkeypatch.setenv("PUNCTUAL_TARGET_MAX_CONCURRENCY", "0")
    monkeypatch.setenv("PUNCTUAL_TEST_VENV", ".venv")
    env = child_env({"PUNCTUAL_SHARDS": "4"})
    assert not [k for k in env if k.startswith("PUNCTUAL_") and k != "PUNCTUAL_SHARDS"]
    assert env["PUNCTUAL_SHARDS"] == "4" and env["PYTHONUNBUFFERED"] == "1"
    assert not [k for k in base_env() if k.startswith("PUNCTUAL_")]
