"""punctual_client is its own distribution: requests and the standard library, never the server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import punctual_client

REPO = Path(__file__).resolve().parents[2]
SERVER_MODULES = ("app", "flask", "sqlalchemy", "celery", "werkzeug", "psycopg", "kombu", "redis", "alembic")


def test_importing_the_client_pulls_in_no_server_module():
    code = (
        "import sys, punctual_client, punctual_client.signature, punctual_client.models\n"
        f"print(','.join(m for m in {SERVER_MODULES!r} if m in sys.modules))\n"
        "print(punctual_client.__file__)\n"
    )
    # Run outside the repository, so `app` cannot come from the working directory either.
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    loaded, location = result.stdout.splitlines()
    assert loaded == ""
    assert Path(location).resolve().is_relative_to(REPO / "client" / "punctual_client")


def test_the_client_distribution_depends_on_requests_only():
    import tomllib

    project = tomllib.loads((REPO / "client" / "pyproject.toml").read_text())["project"]
    assert project["name"] == "punctual-client"
    assert [dep.split(">")[0].split("=")[0] for dep in project["dependencies"]] == ["requests"]


def test_the_client_source_never_names_the_server():
    for path in (REPO / "client" / "punctual_client").glob("*.py"):
        text = path.read_text()
        assert "from app" not in text and "import app" not in text, path


def test_the_public_surface_is_curated():
    assert set(punctual_client.__all__) >= {
        "Client",
        "Job",
        "Run",
        "Page",
        "BatchResult",
        "PunctualError",
        "APIError",
        "ValidationError",
        "NotFoundError",
        "ConflictError",
        "AuthenticationError",
        "verify_signature",
        "SignatureError",
    }
    for name in punctual_client.__all__:
        assert hasattr(punctual_client, name), name


def test_errors_map_from_problem_json():
    from punctual_client.errors import ConflictError, ServerError, ValidationError, error_for

    err = error_for(
        422,
        {
            "type": "urn:x",
            "title": "Invalid fields",
            "status": 422,
            "detail": "invalid: name",
            "errors": [{"field": "name", "message": "is required"}],
        },
    )
    assert isinstance(err, ValidationError)
    assert [(e.field, e.message) for e in err.errors] == [("name", "is required")]
    assert isinstance(error_for(409, {}), ConflictError)
    assert isinstance(error_for(502, "<html>bad gateway</html>"), ServerError)


def test_a_batch_result_is_typed_from_its_item():
    from punctual_client import BatchResult, ConflictError, Job

    job = {
        "id": "0b7c",
        "name": "n",
        "state": "scheduled",
        "next_run_at": "2030-01-01T00:00:00Z",
        "target": {},
        "payload": None,
        "schedule": {},
        "retry": {},
        "misfire": "run_once",
        "dst": {},
        "jitter_s": 0,
        "attempt": 0,
        "created_at": "2029-01-01T00:00:00Z",
        "updated_at": "2029-01-01T00:00:00Z",
    }
    created = BatchResult.from_json({"status": 201, "job": job})
    assert isinstance(created.job, Job) and created.created and created.ok and created.error is None
    replayed = BatchResult.from_json({"status": 200, "job": job})
    assert replayed.ok and not replayed.created
    problem = {"title": "Conflict", "status": 409, "detail": "x", "errors": []}
    failed = BatchResult.from_json({"status": 409, "problem": problem})
    assert isinstance(failed.error, ConflictError) and failed.job is None and not failed.ok
