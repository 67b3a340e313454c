"""app.worker.collector: a pool process's garbage collector, set once its imports are done."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _in_a_fresh_interpreter(code: str) -> str:
    """Run `code` in a new interpreter (the collector's state is the process's)."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_tune_freezes_what_was_made_and_raises_the_young_threshold():
    out = _in_a_fresh_interpreter(
        """
        import gc
        from app.worker import collector
        before = gc.get_freeze_count()
        collector.tune()
        print(before, gc.get_freeze_count() > 1000, gc.get_threshold())
        """
    )
    assert out == "0 True (50000, 10, 10)"


def test_a_pool_process_sets_its_collector_once_the_dispatch_path_is_imported():
    """The prefork child's start (worker_process_init) imports the dispatch path on a
    thread, then sets the collector: the engine's modules are among what is frozen."""
    out = _in_a_fresh_interpreter(
        """
        import gc, sys, threading
        sys.argv = ["celery", "-A", "app", "worker"]
        import app.celery as punctual_celery
        punctual_celery._child_started()
        [warm_up] = [t for t in threading.enumerate() if t.name == "warm-up"]
        warm_up.join(60)
        print("app.worker.engine" in sys.modules, gc.get_threshold()[0], gc.get_freeze_count() > 1000)
        """
    )
    assert out == "True 50000 True"
