"""The names a worker gives the concurrency slots of each admission (no I/O)."""

from __future__ import annotations

import os
import uuid
from types import SimpleNamespace

from app.worker import engine
from app.worker.engine import HolderNames


def test_each_admission_of_a_run_gets_a_name_of_its_own_that_starts_with_the_run():
    names = HolderNames()
    run = SimpleNamespace(run_id=uuid.uuid4())
    first, second = names(run), names(run)  # a retry, or a duplicated message's run
    assert first != second
    assert first.startswith(f"{run.run_id}.") and second.startswith(f"{run.run_id}.")
    assert " " not in first and "\n" not in first  # the admission script's separators


def test_a_forked_process_draws_a_word_of_its_own(monkeypatch):
    names = HolderNames()
    run = SimpleNamespace(run_id=uuid.uuid4())
    parent = names(run)
    child_pid = os.getpid() + 1
    monkeypatch.setattr(engine.os, "getpid", lambda: child_pid)  # as in a child after fork
    child = names(run)
    # Its count starts again from 0, as the parent's did: only the word tells them apart.
    assert child.rsplit("-", 1)[1] == parent.rsplit("-", 1)[1] == "0"
    assert child != parent
