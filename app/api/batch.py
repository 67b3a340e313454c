"""POST /jobs/batch: up to 1,000 jobs in one request, each answered on its own.

Request: `{"jobs": [<job>, ...]}`, each job a `POST /jobs` body plus an optional
`idempotency_key` field (the header's role, per job). Answer: 200 with
`{"items": [{"status": 201, "job": {...}} | {"status": 200, "job": {...}} |
{"status": 4xx/503, "problem": {...}}, ...]}` in request order. 200, not 207: 207
Multi-Status is WebDAV's XML answer, and a client reads each item's status anyway.

Only the envelope can fail the whole request: a body that is not JSON (400), not
application/json (415), over MAX_BATCH_BODY_BYTES (413), or without a `jobs` list of
at most 1,000 (422). A job over the 64 KiB a single create allows is answered 413
on its own, like any other bad job.
"""

from __future__ import annotations

import json

from flask import Blueprint, current_app, g, request

from app.api import problems
from app.api.auth import protect
from app.api.serialize import job_json
from app.api.wire import MAX_BODY_BYTES, json_body, json_response
from app.core.errors import FieldError, ValidationError
from app.core.timefmt import utcnow
from app.services import batches

MAX_BATCH_BODY_BYTES = 8 * 1024 * 1024  # 1,000 jobs of 8 KiB on average

bp = protect(Blueprint("batch", __name__))


@bp.post("/jobs/batch")
def create_jobs():
    request.max_content_length = MAX_BATCH_BODY_BYTES
    items = _items(json_body())
    too_large = {i for i, item in enumerate(items) if _encoded_size(item) > MAX_BODY_BYTES}
    outcomes = batches.create_jobs(
        current_app.extensions["punctual"].registry,
        g.owner,
        [item for i, item in enumerate(items) if i not in too_large],
        utcnow(),
    )
    answers, done = [], iter(outcomes)
    for i in range(len(items)):
        if i in too_large:
            detail = f"a job may be at most {MAX_BODY_BYTES // 1024} KiB of JSON, as for POST /jobs"
            too_large_problem = problems.problem_json(413, "Payload Too Large", detail)
            answers.append({"status": 413, "problem": too_large_problem})
        else:
            answers.append(_answer(next(done)))
    return json_response({"items": answers})


def _items(body: object) -> list:
    if not isinstance(body, dict):
        raise ValidationError.single("body", 'must be a JSON object: {"jobs": [...]}')
    errors = [FieldError(str(key), "unknown field") for key in body if key != "jobs"]
    jobs = body.get("jobs")
    if not isinstance(jobs, list) or len(jobs) > batches.MAX_JOBS:
        errors.append(FieldError("jobs", f"must be a list of at most {batches.MAX_JOBS} jobs"))
        raise ValidationError(errors)
    if errors:
        raise ValidationError(errors)
    return jobs


def _encoded_size(item: object) -> int:
    try:
        text = json.dumps(item, ensure_ascii=False, separators=(",", ":"))
    except RecursionError:  # nested far past the 64 levels a job may have: answered 422 for that
        return 0
    return len(text.encode("utf-8", "surrogatepass"))


def _answer(outcome: batches.Outcome) -> dict:
    if outcome.job is not None:
        return {"status": 201 if outcome.created else 200, "job": job_json(outcome.job)}
    assert outcome.error is not None  # an Outcome holds a job or an error
    body = problems.problem_for(outcome.error)
    return {"status": body["status"], "problem": body}
