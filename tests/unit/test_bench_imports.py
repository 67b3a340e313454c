"""Every bench module imports, so a bench left behind by a refactor fails here and
not the next time someone runs it."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import bench

REPO = Path(__file__).resolve().parents[2]
MODULES = sorted(f"bench.{info.name}" for info in pkgutil.iter_modules(bench.__path__))


def test_every_bench_module_imports():
    # In a child interpreter: bench.celery_peer makes itself Celery's current app on
    # import, which must not leak into the other unit tests.
    code = (
        "import importlib\n"
        f"for name in {MODULES!r}:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as exc:\n"
        "        print(f'{name}: {exc!r}')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "", result.stdout


def test_no_bench_module_runs_anything_on_import():
    """A module-level call statement (`main()`) would start a bench when imported;
    it belongs under `if __name__ == "__main__":`."""
    for name in MODULES:
        path = REPO / (name.replace(".", "/") + ".py")
        calls = [
            node.lineno
            for node in ast.parse(path.read_text()).body
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call | ast.Await)
        ]
        assert not calls, f"{path.relative_to(REPO)}: a call at module level, line {calls}"


def test_the_bench_package_is_found_whole():
    assert {"bench.limits", "bench.burst", "bench.common", "bench.cpu"} <= set(MODULES)
