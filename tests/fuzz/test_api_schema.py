"""Property-based fuzzing of every operation from the OpenAPI document (schemathesis).

Bounded for CI: FUZZ_EXAMPLES per operation (about 15 operations), valid and invalid
inputs alike. The checks: no 5xx, every status is one the document lists, and every
body matches the document's schema and content type. Host resolution is stubbed
(IP literals pass, names do not: the `no_dns` fixture) so random hostnames never
wait on DNS.

PUNCTUAL_TEST_FUZZ_SCALE=25 PUNCTUAL_TEST_FUZZ_RANDOM=1 explores further than CI's fixed seed
(tests/fuzz/budget.py).
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from app.api.openapi import document
from tests.fuzz.budget import RANDOM, SCALE
from tests.integration.api_fixtures import new_caller

pytestmark = [pytest.mark.integration, pytest.mark.fuzz]
FUZZ_EXAMPLES = 12 * SCALE


@pytest.fixture(scope="module")
def fuzz_auth(api_app, api_settings):
    caller = new_caller(api_app, api_settings, "fuzz")
    caller.create()
    return {"Authorization": f"Bearer {caller.api_key}"}


# The document is built from code, not fetched: the test sees exactly what /openapi.json
# serves (test_api_ops checks that the two are the same document).
schema = schemathesis.openapi.from_dict(document())
schema.config.generation.update(
    modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
    max_examples=FUZZ_EXAMPLES,
    deterministic=not RANDOM,
)


@schema.parametrize()
@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_5xx_and_every_answer_is_documented(case, live_server, fuzz_auth, no_dns):
    headers = dict(case.headers or {})
    headers.update(fuzz_auth)
    case.call_and_validate(
        base_url=live_server,
        headers=headers,
        checks=[
            not_a_server_error,
            status_code_conformance,
            content_type_conformance,
            response_schema_conformance,
        ],
    )
