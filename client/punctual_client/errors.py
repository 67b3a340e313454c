"""The SDK's exceptions: one tree, mapped from the API's problem+json answers.

PunctualError
+-- ArgumentError             the client was called wrongly (an empty API key, a URL without scheme);
|                             also a ValueError
+-- TransportError            the request never got an HTTP answer (connection, timeout)
+-- WaitTimeoutError          Client.wait_for_run saw no run end in time; also a TimeoutError
+-- APIError                  the API answered an error; .status, .title, .detail, .errors, .type
    +-- BadRequestError       400 malformed JSON
    +-- AuthenticationError   401 no or bad API key
    +-- NotFoundError         404 no such job or run (another owner's counts as none)
    +-- ConflictError         409 the job's state forbids it, or an Idempotency-Key conflict
    +-- PayloadTooLargeError  413 body over 64 KiB
    +-- UnsupportedMediaTypeError  415 body not JSON
    +-- ValidationError       422 invalid fields; .errors lists every one
    +-- ServerError           5xx
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
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
    "error_for",
]


@dataclass(frozen=True)
class FieldProblem:
    """One invalid field: a dotted JSON path (`schedule.cron`) and what is wrong with it."""

    field: str
    message: str


class PunctualError(Exception):
    """Every error the SDK raises."""


class ArgumentError(PunctualError, ValueError):
    """The client was called with a value it cannot use; nothing was sent."""


class TransportError(PunctualError):
    """No HTTP answer: the connection failed or timed out (the request may have been applied).

    `reason` says why in plain words ("connection refused", "no answer within 30 s");
    the client never retries, so one failed attempt is the whole story.
    """

    def __init__(self, message: str, reason: str = ""):
        super().__init__(message)
        self.reason = reason or message


class WaitTimeoutError(PunctualError, TimeoutError):
    """Client.wait_for_run gave up: no run of the job ended within the time given."""


class APIError(PunctualError):
    """The API answered with an error status and a problem+json body."""

    def __init__(
        self,
        status: int,
        title: str,
        detail: str,
        errors: list[FieldProblem] | None = None,
        type: str = "about:blank",
    ):
        self.status = status
        self.title = title
        self.detail = detail
        self.errors = list(errors or ())
        self.type = type
        lines = [f"{status} {title}: {detail}"] + [f"  {e.field}: {e.message}" for e in self.errors]
        super().__init__("\n".join(lines))


class BadRequestError(APIError):
    """400: the body was not valid JSON."""


class AuthenticationError(APIError):
    """401: no API key, or one the server does not know."""


class NotFoundError(APIError):
    """404: no such job or run for this API key's owner."""


class ConflictError(APIError):
    """409: the job or run is in a state that forbids this, or an Idempotency-Key was
    reused with another body."""


class PayloadTooLargeError(APIError):
    """413: the body is over 64 KiB."""


class UnsupportedMediaTypeError(APIError):
    """415: the body was not sent as application/json."""


class ValidationError(APIError):
    """422: one or more fields are invalid; `errors` lists every one."""


class ServerError(APIError):
    """5xx: the server failed; retrying later may help."""


_BY_STATUS = {
    400: BadRequestError,
    401: AuthenticationError,
    404: NotFoundError,
    409: ConflictError,
    413: PayloadTooLargeError,
    415: UnsupportedMediaTypeError,
    422: ValidationError,
}


def error_for(status: int, body: object) -> APIError:
    """The exception for an error answer; tolerates a body that is not problem+json."""
    problem = body if isinstance(body, dict) else {}
    errors = [
        FieldProblem(str(e.get("field", "")), str(e.get("message", "")))
        for e in problem.get("errors") or ()
        if isinstance(e, dict)
    ]
    cls = _BY_STATUS.get(status, ServerError if status >= 500 else APIError)
    return cls(
        status,
        str(problem.get("title") or f"HTTP {status}"),
        str(problem.get("detail") or (body if isinstance(body, str) else "")),
        errors,
        str(problem.get("type") or "about:blank"),
    )
