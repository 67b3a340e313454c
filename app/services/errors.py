"""What a service call can answer besides its result: no such resource, a conflict, or
a registry database that did not answer.

The API maps them to problems (app.api.problems): NotFound is 404, Conflict 409,
RateLimited 429, Unavailable 503.
"""

from __future__ import annotations


class NotFound(LookupError):
    """No such job or run for this owner (another owner's counts as none)."""


class Conflict(Exception):
    """The request cannot apply to the resource's current state (409)."""

    def __init__(self, detail: str, kind: str = "state-conflict"):
        super().__init__(detail)
        self.detail = detail
        self.kind = kind


class Unavailable(Exception):
    """A registry database failed while serving this; nothing was written (retry it)."""


class RateLimited(Exception):
    """Done as often as its limit allows for now (429); `retry_after_s` says when it may
    be done again."""

    def __init__(self, detail: str, retry_after_s: int):
        super().__init__(detail)
        self.detail = detail
        self.retry_after_s = retry_after_s
