"""The SDK imports requests and the standard library only, never the server."""
from __future__ import annotations

import subprocess
import sys

import punctual_client


def test_importing_the_sdk_pulls_in_no_server_module():
    code = (
        "import sys, punctual_client\n"
        "heavy = [m for m in ('flask', 'sqlalchemy', 'celery', 'werkzeug', 'psycopg', 'kombu', 'redis')"
        " if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == ""


def test_the_public_surface_is_curated():
    assert set(punctual_client.__all__) >= {"Client", "Job", "Run", "Page", "PunctualError", "APIError", "ValidationError",
                                    "NotFoundError", "ConflictError", "AuthenticationError", "verify_signature"}
    for name in punctual_client.__all__:
        assert hasattr(punctual_client, name), name


def test_errors_map_from_problem_json():
    from punctual_client.errors import ConflictError, ServerError, ValidationError, error_for

    err = error_for(422, {"type": "urn:x", "title": "Invalid fields", "status": 422, "detail": "invalid: name",
                          "errors": [{"field": "name", "message": "is required"}]})
    assert isinstance(err, ValidationError)
    assert [(e.field, e.message) for e in err.errors] == [("name", "is required")]
    assert isinstance(error_for(409, {}), ConflictError)
    assert isinstance(error_for(502, "<html>bad gateway</html>"), ServerError)
