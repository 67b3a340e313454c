"""The OpenAPI 3.1 document of every route, built from the validation constants.

Field names and bounds come from app.services.validation (and the pure core's own limits),
so the document says what the code checks; tests/integration/test_api_ops.py fails
when a route of the Flask app or a field of a body or a response is missing here.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from app import __version__
from app.api.batch import MAX_BATCH_BODY_BYTES
from app.core import labels as lb
from app.core import overlap as ov
from app.core.cron import MAX_CHARS as CRON_MAX_CHARS
from app.core.cron import MAX_ITEMS as CRON_MAX_ITEMS
from app.core.jitter import MAX_JITTER_S
from app.core.misfire import MISFIRE_POLICIES
from app.core.retries import MAX_ATTEMPTS, MAX_BACKOFF_S, MAX_MAX_BACKOFF_S
from app.core.schedules import GAP_POLICIES, MAX_INTERVAL_S, OVERLAP_POLICIES
from app.registry.schema import JOB_STATES, RUN_ORIGINS, RUN_STATES
from app.services import job_keys
from app.services import validation as v
from app.services.backfills import MAX_OCCURRENCES
from app.services.batches import MAX_JOBS as MAX_BATCH_JOBS
from app.services.idempotency import KEY_MAX
from app.services.jobs import CHANGES, TRIGGER_WINDOW_S, TRIGGERS_PER_WINDOW
from app.services.pagination import DEFAULT_LIMIT, MAX_LIMIT

INSTANT = {"type": "string", "format": "date-time"}


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def _nullable(schema: dict) -> dict:
    return {"anyOf": [schema, {"type": "null"}]}


def _object(properties: dict, required: tuple[str, ...] = (), closed: bool = True) -> dict:
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    if closed:
        schema["additionalProperties"] = False
    return schema


def _schemas() -> dict:
    limits = _object(
        {
            "key": {"type": "string", "minLength": 1, "maxLength": v.LIMITS_KEY_MAX},
            "rate_per_s": {"type": "number", "minimum": v.RATE_PER_S[0], "maximum": v.RATE_PER_S[1]},
            "max_concurrency": {
                "type": "integer",
                "minimum": v.MAX_CONCURRENCY[0],
                "maximum": v.MAX_CONCURRENCY[1],
            },
        }
    )
    webhook = _object(
        {
            "type": {"const": "webhook"},
            "url": {
                "type": "string",
                "format": "uri",
                "maxLength": v.URL_MAX,
                "description": "http(s); private addresses refused unless allowed",
            },
            "method": {"enum": list(v.METHODS), "default": v.DEFAULT_METHOD},
            "headers": {
                "type": "object",
                "maxProperties": v.HEADERS_MAX,
                "propertyNames": {"minLength": 1, "maxLength": v.HEADER_NAME_MAX},
                "additionalProperties": {"type": "string", "maxLength": v.HEADER_VALUE_MAX},
            },
            "timeout_s": {
                "type": "number",
                "minimum": v.TIMEOUT_S[0],
                "maximum": v.TIMEOUT_S[1],
                "default": v.DEFAULT_TIMEOUT_S,
            },
            "limits": _ref("Limits"),
        },
        required=("type", "url"),
    )
    queue = _object(
        {
            "type": {"const": "queue"},
            "topic": {
                "type": "string",
                "minLength": 1,
                "maxLength": v.TOPIC_MAX,
                "pattern": r"^[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-]+)*$",
            },
            "limits": _ref("Limits"),
        },
        required=("type", "topic"),
    )
    postgres = _object(
        {
            "type": {"const": "postgres"},
            "database": {
                "type": "string",
                "pattern": r"^[a-z][a-z0-9_]{0,62}$",
                "description": "an alias of PUNCTUAL_TARGET_DATABASES granted to the owner",
            },
            "limits": _ref("Limits"),
        },
        required=("type", "database"),
    )
    bounds = {"start_at": INSTANT, "end_at": INSTANT}
    schedule = {
        "oneOf": [
            _object({"run_at": INSTANT}, required=("run_at",)),
            _object(
                {
                    "cron": {
                        "type": "string",
                        "maxLength": CRON_MAX_CHARS,
                        "description": (
                            f"5 fields, or 6 with seconds first; at most {CRON_MAX_ITEMS} items a field"
                        ),
                    },
                    "timezone": {"type": "string", "default": "UTC"},
                    **bounds,
                },
                required=("cron",),
            ),
            _object(
                {"interval_s": {"type": "integer", "minimum": 1, "maximum": MAX_INTERVAL_S}, **bounds},
                required=("interval_s",),
            ),
        ]
    }
    retry = _object(
        {
            "max_attempts": {"type": "integer", "minimum": 1, "maximum": MAX_ATTEMPTS, "default": 5},
            "backoff_s": {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_BACKOFF_S, "default": 10},
            "max_backoff_s": {
                "type": "number",
                "exclusiveMinimum": 0,
                "maximum": MAX_MAX_BACKOFF_S,
                "default": 3600,
            },
        }
    )
    dst = _object(
        {
            "gap": {"enum": list(GAP_POLICIES), "default": "shift"},
            "overlap": {"enum": list(OVERLAP_POLICIES), "default": "once"},
        }
    )
    fields = {
        "name": {"type": "string", "minLength": 1, "maxLength": v.NAME_MAX},
        "target": _ref("Target"),
        "payload": {
            "description": f"any JSON, nested at most {v.PAYLOAD_DEPTH_MAX} levels; what the target is sent"
        },
        "schedule": _ref("Schedule"),
        "retry": _ref("Retry"),
        "misfire": {"enum": list(MISFIRE_POLICIES), "default": MISFIRE_POLICIES[0]},
        "dst": _ref("Dst"),
        "jitter_s": {"type": "integer", "minimum": 0, "maximum": MAX_JITTER_S, "default": 0},
        "labels": _ref("Labels"),
        "overlap": {"enum": list(ov.OVERLAP_POLICIES), "default": ov.DEFAULT_OVERLAP},
    }
    key = _JOB_KEY
    job = _object(
        {
            "id": {"type": "string", "format": "uuid"},
            "key": {**_nullable(key), "description": "set by PUT /jobs/by-key/{key}"},
            "name": {"type": "string"},
            "state": {"enum": list(JOB_STATES)},
            "next_run_at": _nullable(INSTANT),
            "target": _ref("Target"),
            "payload": {},
            "schedule": _ref("Schedule"),
            "retry": _ref("Retry"),
            "misfire": {"enum": list(MISFIRE_POLICIES)},
            "dst": _ref("Dst"),
            "jitter_s": {"type": "integer"},
            "overlap": {"enum": list(ov.OVERLAP_POLICIES)},
            "attempt": {"type": "integer", "minimum": 0},
            "labels": _ref("Labels"),
            "created_at": INSTANT,
            "updated_at": INSTANT,
        },
        required=(
            "id",
            "key",
            "name",
            "state",
            "next_run_at",
            "target",
            "payload",
            "schedule",
            "retry",
            "misfire",
            "dst",
            "jitter_s",
            "overlap",
            "attempt",
            "labels",
            "created_at",
            "updated_at",
        ),
    )
    run = _object(
        {
            "id": {"type": "string", "format": "uuid"},
            "job_id": {"type": "string", "format": "uuid"},
            "origin": {"enum": list(RUN_ORIGINS)},
            "scheduled_for": INSTANT,
            "attempt": {"type": "integer", "minimum": 1},
            "state": {"enum": list(RUN_STATES)},
            "started_at": _nullable(INSTANT),
            "finished_at": _nullable(INSTANT),
            "lateness_ms": {"type": ["integer", "null"]},
            "status_code": {"type": ["integer", "null"]},
            "error": {"type": ["string", "null"]},
        },
        required=(
            "id",
            "job_id",
            "origin",
            "scheduled_for",
            "attempt",
            "state",
            "started_at",
            "finished_at",
            "lateness_ms",
            "status_code",
            "error",
        ),
    )
    # A run as everywhere, plus its job's name (the listing a person reads to decide what to replay).
    dead_letter = _object(
        {**run["properties"], "job_name": {"type": "string", "description": "the name of the run's job"}},
        required=(*run["required"], "job_name"),
    )
    labels = {
        "type": "object",
        "maxProperties": lb.LABELS_MAX,
        "propertyNames": {"maxLength": lb.LABEL_KEY_MAX, "pattern": lb.LABEL_KEY_PATTERN},
        "additionalProperties": {
            "type": "string",
            "minLength": 1,
            "maxLength": lb.LABEL_VALUE_MAX,
            "pattern": lb.LABEL_VALUE_PATTERN,
        },
        "default": {},
    }
    return {
        "Labels": labels,
        "Selector": _object(
            {"labels": {**_ref("Labels"), "description": "the pairs a job must all carry (at least one)"}},
            required=("labels",),
        ),
        "Selected": _object(
            {
                "matched": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "the owner's jobs the selector matched",
                },
                "changed": {"type": "integer", "minimum": 0, "description": "those this request changed"},
            },
            required=("matched", "changed"),
        ),
        "BackfillRange": _object(
            {
                "start": {**INSTANT, "description": "the first instant of the range (inclusive)"},
                "end": {**INSTANT, "description": "the last instant of the range (inclusive), not after now"},
            },
            required=("start", "end"),
        ),
        "Backfilled": _object(
            {
                "job_id": {"type": "string", "format": "uuid"},
                "count": {"type": "integer", "minimum": 0, "maximum": MAX_OCCURRENCES},
                "first": _nullable(INSTANT),
                "last": _nullable(INSTANT),
            },
            required=("job_id", "count", "first", "last"),
        ),
        "Limits": limits,
        "WebhookTarget": webhook,
        "QueueTarget": queue,
        "PostgresTarget": postgres,
        "Target": {
            "oneOf": [_ref("WebhookTarget"), _ref("QueueTarget"), _ref("PostgresTarget")],
            "discriminator": {
                "propertyName": "type",
                "mapping": {
                    "webhook": "#/components/schemas/WebhookTarget",
                    "queue": "#/components/schemas/QueueTarget",
                    "postgres": "#/components/schemas/PostgresTarget",
                },
            },
        },
        "Schedule": schedule,
        "Retry": retry,
        "Dst": dst,
        "JobCreate": _object(fields, required=v.REQUIRED_FIELDS),
        "JobBatch": _object(
            {
                "jobs": {
                    "type": "array",
                    "maxItems": MAX_BATCH_JOBS,
                    "items": _object(
                        {
                            **fields,
                            "idempotency_key": {
                                "type": "string",
                                "minLength": 1,
                                "maxLength": KEY_MAX,
                                "description": "what the Idempotency-Key header is for POST /jobs, per job",
                            },
                        },
                        required=v.REQUIRED_FIELDS,
                    ),
                }
            },
            required=("jobs",),
        ),
        "JobBatchResult": _object(
            {
                "items": {
                    "type": "array",
                    "description": "one per job, in request order",
                    "items": {
                        "oneOf": [
                            _object(
                                {
                                    "status": {
                                        "enum": [200, 201],
                                        "description": "201 created, 200 the job the key stands for",
                                    },
                                    "job": _ref("Job"),
                                },
                                required=("status", "job"),
                            ),
                            _object(
                                {"status": {"enum": [409, 413, 422, 503]}, "problem": _ref("Problem")},
                                required=("status", "problem"),
                            ),
                        ]
                    },
                }
            },
            required=("items",),
        ),
        "JobPatch": _object(fields),
        "JobPut": _object(
            {**fields, "key": {**key, "description": "optional; must equal the key in the path"}},
            required=v.REQUIRED_FIELDS,
        ),
        "Job": job,
        "Run": run,
        "JobPage": _object(
            {"items": {"type": "array", "items": _ref("Job")}, "next_cursor": {"type": ["string", "null"]}},
            required=("items", "next_cursor"),
        ),
        "RunPage": _object(
            {"items": {"type": "array", "items": _ref("Run")}, "next_cursor": {"type": ["string", "null"]}},
            required=("items", "next_cursor"),
        ),
        "DeadLetter": dead_letter,
        "DeadLetterPage": _object(
            {
                "items": {"type": "array", "items": _ref("DeadLetter")},
                "next_cursor": {"type": ["string", "null"]},
            },
            required=("items", "next_cursor"),
        ),
        "Preview": _object(
            {
                "items": {
                    "type": "array",
                    "items": _object(
                        {
                            "at": INSTANT,
                            "local": {"type": "string", "description": "RFC 3339 with the zone's offset"},
                            "dst": {"enum": [None, "gap_shifted", "overlap_first", "overlap_second"]},
                        },
                        required=("at", "local", "dst"),
                    ),
                }
            },
            required=("items",),
        ),
        "Health": _object(
            {
                "shards": {
                    "type": "array",
                    "items": _object(
                        {
                            "shard": {"type": "integer", "minimum": 0},
                            "ok": {"type": "boolean"},
                            "error": {"type": "string"},
                        },
                        required=("shard", "ok"),
                    ),
                },
                "broker": _object({"ok": {"type": "boolean"}, "error": {"type": "string"}}, required=("ok",)),
            },
            required=("shards", "broker"),
        ),
        "Problem": _object(
            {
                "type": {"type": "string"},
                "title": {"type": "string"},
                "status": {"type": "integer"},
                "detail": {"type": "string"},
                "errors": {
                    "type": "array",
                    "items": _object(
                        {"field": {"type": "string"}, "message": {"type": "string"}},
                        required=("field", "message"),
                    ),
                },
            },
            required=("type", "title", "status", "detail", "errors"),
        ),
    }


def _problem(description: str) -> dict:
    return {"description": description, "content": {"application/problem+json": {"schema": _ref("Problem")}}}


def _ok(description: str, schema: str, headers: dict | None = None) -> dict:
    answer = {"description": description, "content": {"application/json": {"schema": _ref(schema)}}}
    if headers:
        answer["headers"] = headers
    return answer


_ERRORS = {
    "400": "malformed JSON",
    "401": "no API key, or an unknown one",
    "404": "no such job or run (another owner's counts as none)",
    "409": "the state of the job or run forbids it, or an Idempotency-Key conflict",
    "413": "body over 64 KiB",
    "415": "body not application/json",
    "422": "invalid fields, every one listed",
}


def _op(
    summary: str,
    answers: dict,
    errors: str,
    *,
    body: str | None = None,
    params: list | None = None,
    public: bool = False,
    extra: dict | None = None,
) -> dict:
    operation: dict[str, Any] = {
        "summary": summary,
        "operationId": summary.lower().replace(" ", "_").replace("'", ""),
        "responses": dict(answers),
    }
    for code in errors.split():
        operation["responses"][code] = _problem(_ERRORS[code])
    if not public:  # every route that reads the registry (its API key, at least)
        operation["responses"]["503"] = _problem(
            "a database it needs cannot be reached; retry after Retry-After"
        )
    operation["responses"].update(extra or {})
    if body:
        operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": _ref(body)}}}
    if params:
        operation["parameters"] = params
    if public:
        operation["security"] = []
    return operation


def _query(name: str, schema: dict, description: str = "") -> dict:
    return {"name": name, "in": "query", "required": False, "schema": schema, "description": description}


def _path(name: str) -> dict:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


_PAGE = [
    _query("limit", {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": DEFAULT_LIMIT}),
    _query("cursor", {"type": "string"}, "next_cursor of the previous page"),
]
_JOB_KEY = {
    "type": "string",
    "minLength": 1,
    "maxLength": job_keys.JOB_KEY_MAX,
    "pattern": job_keys.JOB_KEY_PATTERN,
}
_LOCATION = {"Location": {"schema": {"type": "string"}, "description": "/jobs/{id}"}}
_CHANGE = {
    "Punctual-Change": {
        "schema": {"enum": list(CHANGES)},
        "description": "what the PUT did (or, with dry_run, would do) to the job",
    }
}


def _paths() -> dict:
    job_answer = {"200": _ok("the job", "Job")}
    on_job = "401 404 409"
    return {
        "/jobs": {
            "post": _op(
                "Create job",
                {
                    "201": _ok("created", "Job", _LOCATION),
                    "200": _ok(
                        "the job an earlier request with this Idempotency-Key created",
                        "Job",
                        {
                            **_LOCATION,
                            "Idempotent-Replayed": {
                                "schema": {"const": "true"},
                                "description": "a replayed answer",
                            },
                        },
                    ),
                },
                "400 401 409 413 415 422",
                body="JobCreate",
                params=[
                    {
                        "name": "Idempotency-Key",
                        "in": "header",
                        "required": False,
                        "schema": {"type": "string", "minLength": 1, "maxLength": 255},
                    }
                ],
            ),
            "get": _op(
                "List jobs",
                {"200": _ok("newest first", "JobPage")},
                "401 422",
                params=[
                    _query("state", {"enum": list(JOB_STATES)}),
                    _query("name", {"type": "string"}, "exact match"),
                    {
                        **_query(
                            "label",
                            {"type": "array", "items": {"type": "string"}, "maxItems": lb.LABELS_MAX},
                            "key:value; repeatable, every one must match",
                        ),
                        "style": "form",
                        "explode": True,
                    },
                    _query(
                        "keyed", {"type": "boolean"}, "true: only jobs with a key; false: only jobs without"
                    ),
                    *_PAGE,
                ],
            ),
        },
        "/jobs/by-key/{key}": {
            "parameters": [{**_path("key"), "schema": _JOB_KEY}],
            "put": _op(
                "Put job by key",
                {
                    "201": _ok("created", "Job", {**_LOCATION, **_CHANGE}),
                    "200": _ok(
                        "replaced, or unchanged (the body equals the job); with dry_run, what would be",
                        "Job",
                        _CHANGE,
                    ),
                },
                "400 401 409 413 415 422",
                body="JobPut",
                params=[
                    _query(
                        "dry_run", {"type": "boolean", "default": False}, "decide and answer, write nothing"
                    )
                ],
            ),
            "get": _op("Get job by key", {"200": _ok("the job", "Job")}, "401 404"),
        },
        "/jobs/batch": {
            "post": _op(
                "Create jobs",
                {
                    "200": _ok(
                        "one answer per job, in request order; all or nothing per job, not per batch",
                        "JobBatchResult",
                    )
                },
                "400 401 415 422",
                body="JobBatch",
                extra={
                    "413": _problem(
                        f"body over {MAX_BATCH_BODY_BYTES // (1024 * 1024)} MiB (a job over 64 KiB "
                        "is answered 413 in its own item)"
                    )
                },
            ),
        },
        **{
            f"/jobs/{verb}": {
                "post": _op(
                    f"{verb.capitalize()} jobs by label",
                    {"200": _ok(f"how many jobs matched and how many this {verb} changed", "Selected")},
                    "400 401 413 415 422",
                    body="Selector",
                )
            }
            for verb in ("pause", "resume", "cancel")
        },
        "/jobs/{job_id}": {
            "parameters": [_path("job_id")],
            "get": _op("Get job", job_answer, "401 404"),
            "patch": _op("Update job", job_answer, "400 401 404 409 413 415 422", body="JobPatch"),
            "delete": _op("Cancel job", {"200": _ok("the job, cancelled", "Job")}, on_job),
        },
        "/jobs/{job_id}/pause": {
            "parameters": [_path("job_id")],
            "post": _op("Pause job", job_answer, on_job),
        },
        "/jobs/{job_id}/resume": {
            "parameters": [_path("job_id")],
            "post": _op("Resume job", job_answer, on_job),
        },
        "/jobs/{job_id}/trigger": {
            "parameters": [_path("job_id")],
            "post": _op(
                "Trigger job",
                {"202": _ok("the extra run, claimed", "Run")},
                on_job,
                extra={
                    "429": _problem(
                        f"the job was triggered {TRIGGERS_PER_WINDOW} times in the last"
                        f" {TRIGGER_WINDOW_S} s; retry after Retry-After"
                    )
                },
            ),
        },
        "/jobs/{job_id}/backfill": {
            "parameters": [_path("job_id")],
            "post": _op(
                "Backfill job",
                {
                    "202": _ok(
                        f"a backfill run for each occurrence in the range (at most {MAX_OCCURRENCES:,})",
                        "Backfilled",
                    )
                },
                "400 401 404 409 413 415 422",
                body="BackfillRange",
            ),
        },
        "/jobs/{job_id}/runs": {
            "parameters": [_path("job_id")],
            "get": _op(
                "List runs",
                {"200": _ok("newest first", "RunPage")},
                "401 404 422",
                params=[
                    _query("origin", {"enum": list(RUN_ORIGINS)}, "only the runs of this origin"),
                    *_PAGE,
                ],
            ),
        },
        "/dead-letters": {
            "get": _op(
                "List dead letters",
                {"200": _ok("dead runs with their job's name, newest first", "DeadLetterPage")},
                "401 422",
                params=_PAGE,
            )
        },
        "/runs/{run_id}/replay": {
            "parameters": [_path("run_id")],
            "post": _op("Replay run", {"202": _ok("the run, now replayed", "Run")}, "401 404 409"),
        },
        "/schedules/preview": {
            "get": _op(
                "Preview schedule",
                {"200": _ok("the next fire instants", "Preview")},
                "401 422",
                params=[
                    _query("cron", {"type": "string", "maxLength": CRON_MAX_CHARS}),
                    _query("interval_s", {"type": "integer", "minimum": 1, "maximum": MAX_INTERVAL_S}),
                    _query("timezone", {"type": "string", "default": "UTC"}),
                    _query("count", {"type": "integer", "minimum": 1, "maximum": 100, "default": 10}),
                    _query("after", INSTANT, "default now, exclusive"),
                    _query("start_at", INSTANT),
                    _query("end_at", INSTANT),
                    _query("gap", {"enum": list(GAP_POLICIES)}),
                    _query("overlap", {"enum": list(OVERLAP_POLICIES)}),
                ],
            )
        },
        "/healthz": {
            "get": _op(
                "Health",
                {
                    "200": _ok("every shard and the broker answer", "Health"),
                    "503": _ok("some shard or the broker does not answer", "Health"),
                },
                "",
                public=True,
            )
        },
        "/metrics": {
            "get": _op(
                "Metrics",
                {
                    "200": {
                        "description": "Prometheus text",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                },
                "",
                public=True,
            )
        },
        "/openapi.json": {
            "get": _op(
                "OpenAPI document",
                {
                    "200": {
                        "description": "this document",
                        "content": {"application/json": {"schema": {"type": "object"}}},
                    }
                },
                "",
                public=True,
            )
        },
    }


@lru_cache(maxsize=1)
def document() -> dict:
    """The OpenAPI 3.1 document (built once per process)."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Punctual",
            "version": __version__,
            "description": "A distributed job scheduler: webhooks and queue messages fired on time,"
            " at least once.",
        },
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "paths": _paths(),
        "components": {
            "schemas": _schemas(),
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "an API key from `punctual keys create`",
                }
            },
        },
    }
