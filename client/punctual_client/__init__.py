"""The Punctual Python SDK: `Client`, typed models, one exception tree, webhook signatures.

It needs `requests` and the standard library only: importing it never pulls in
the server (Flask, SQLAlchemy, Celery). See punctual_client.client for the client.

What a job is made of is typed (TypedDicts, plain dicts at run time: WebhookTarget,
QueueTarget, PostgresTarget, CronSchedule, IntervalSchedule, OneOffSchedule, RetryPolicy, DstPolicy,
Limits), states are Literals (JobState, RunState), and the package ships `py.typed`.
`Client.wait_for_run(job_id)` waits for a run of the job to end and returns it.

Every error is a PunctualError, mapped from the API's problem+json (punctual_client.errors):

    PunctualError
    +-- ArgumentError       a value the client cannot use (empty API key, URL without scheme)
    +-- TransportError      no HTTP answer (connection refused, timeout); `.reason` in plain words
    +-- WaitTimeoutError    wait_for_run saw no run end in time
    +-- APIError            .status .title .detail .type .errors [FieldProblem(field, message)]
        +-- BadRequestError (400)  AuthenticationError (401)  NotFoundError (404)
        +-- ConflictError (409)  PayloadTooLargeError (413)  UnsupportedMediaTypeError (415)
        +-- ValidationError (422, every invalid field in .errors)  ServerError (5xx)

Many jobs at once: `Client.create_jobs(bodies)` sends POST /jobs/batch (1,000 jobs a
request) and answers one BatchResult per job: 201 created, 200 an earlier job its
`idempotency_key` stands for, or the job's own error (never raised).

A postgres target's inbox: `punctual_client.inbox.consume_inbox(connection, handle)`
takes pending rows FOR UPDATE SKIP LOCKED and marks them done in the application's
own transaction (any DB-API driver; the module imports none).

Labels pick jobs: `list_jobs(labels={"team": "billing"})` lists the jobs carrying
them all, and `pause_jobs`, `resume_jobs`, `cancel_jobs` act on every such job at
once, answering a `Selected` (how many matched, how many changed).

Declarative jobs: `put_job(key, body)` creates the job `key` or replaces it whole
(PUT /jobs/by-key/{key}), answering a `Put` (created, updated or unchanged, and the
job); `dry_run=True` only says what it would do (`punctual apply` is built on it).

Webhook receivers check `Punctual-Signature` with `verify_signature`, which returns
None or raises SignatureError saying why:

    from punctual_client import verify_signature, SignatureError
    verify_signature(signing_secret, request.headers["Punctual-Signature"], request.get_data())

During a signing-secret rotation (`punctual keys rotate`) calls carry a signature
under each secret, so either verifies; pass both, `verify_signature([new, old], ...)`,
while a receiver switches over.
"""

from punctual_client.client import DEFAULT_TIMEOUT_S, Client
from punctual_client.errors import (
    APIError,
    ArgumentError,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    FieldProblem,
    NotFoundError,
    PayloadTooLargeError,
    PunctualError,
    ServerError,
    TransportError,
    UnsupportedMediaTypeError,
    ValidationError,
    WaitTimeoutError,
)
from punctual_client.models import (
    Backfill,
    BatchResult,
    Change,
    CronSchedule,
    DstFlag,
    DstPolicy,
    IntervalSchedule,
    Job,
    JobState,
    Limits,
    Misfire,
    OneOffSchedule,
    Overlap,
    Page,
    PostgresTarget,
    PreviewItem,
    Put,
    QueueTarget,
    RetryPolicy,
    Run,
    RunOrigin,
    RunState,
    Schedule,
    Selected,
    Target,
    WebhookTarget,
)
from punctual_client.signature import SignatureError, verify_signature

__all__ = [
    "Client",
    "DEFAULT_TIMEOUT_S",
    "Job",
    "Run",
    "Page",
    "PreviewItem",
    "BatchResult",
    "JobState",
    "RunState",
    "Misfire",
    "Overlap",
    "RunOrigin",
    "Change",
    "DstFlag",
    "Target",
    "WebhookTarget",
    "QueueTarget",
    "PostgresTarget",
    "Limits",
    "Schedule",
    "OneOffSchedule",
    "CronSchedule",
    "IntervalSchedule",
    "RetryPolicy",
    "DstPolicy",
    "Selected",
    "Put",
    "Backfill",
    "PunctualError",
    "ArgumentError",
    "TransportError",
    "WaitTimeoutError",
    "APIError",
    "FieldProblem",
    "BadRequestError",
    "AuthenticationError",
    "NotFoundError",
    "ConflictError",
    "PayloadTooLargeError",
    "UnsupportedMediaTypeError",
    "ValidationError",
    "ServerError",
    "verify_signature",
    "SignatureError",
]
