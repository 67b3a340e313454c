"""The Punctual API client: one method per endpoint, typed results, one exception tree.

    from punctual_client import Client
    with Client("https://punctual.example", api_key="pk_...") as punctual:
        job = punctual.create_job("nightly", {"type": "webhook", "url": "https://x.example/run"},
                                  {"cron": "0 0 * * *", "timezone": "Europe/Berlin"},
                                  idempotency_key="nightly-v1")
        run = punctual.wait_for_run(job.id, timeout_s=120)

The transport is an injectable `requests.Session` (pass one with your own adapters,
retries or proxies). The client never retries: a session it makes itself mounts
adapters with urllib3's retries set to none, explicitly, since retries belong to
the caller (who knows whether a request is safe to send again). Errors raise
punctual_client.errors: APIError subclasses for answers, TransportError when no
answer came, ArgumentError for a value the client cannot use.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

import requests
from requests.adapters import HTTPAdapter, Retry

from punctual_client.errors import ArgumentError, PunctualError, TransportError, WaitTimeoutError, error_for
from punctual_client.models import (
    Backfill,
    BatchResult,
    Change,
    DstPolicy,
    Job,
    Misfire,
    Overlap,
    Page,
    PreviewItem,
    Put,
    RetryPolicy,
    Run,
    RunOrigin,
    RunState,
    Schedule,
    Selected,
    Target,
)

__all__ = ["Client", "DEFAULT_TIMEOUT_S", "MAX_BATCH", "ENDED"]

DEFAULT_TIMEOUT_S = 30.0
MAX_BATCH = 1000  # the most jobs POST /jobs/batch takes in one request
# The states in which a run's occurrence is over: nothing more happens to it unless replayed.
ENDED: tuple[RunState, ...] = ("succeeded", "dead")
CHANGES: tuple[Change, ...] = ("created", "updated", "unchanged")  # what put_job did
T = TypeVar("T")


def _encode(value: Any) -> Any:
    """JSON-ready values: datetimes become RFC 3339 (aware ones in UTC with `Z`)."""
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            value = value.astimezone(UTC)
            return value.isoformat().replace("+00:00", "Z")
        return value.isoformat()  # naive: the API refuses it, and says which field
    if isinstance(value, dict):
        return {key: _encode(child) for key, child in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encode(child) for child in value]
    return value


def _selector(labels: Mapping[str, str] | None) -> list[str] | None:
    """`labels` as the repeated `label=key:value` query parameter."""
    return None if not labels else [f"{key}:{value}" for key, value in labels.items()]


class Client:
    """A client for one API key. Thread-safe as far as the given session is."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        session: requests.Session | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ):
        """`base_url`: the API's http:// or https:// URL; `api_key`: from `punctual keys
        create`. ArgumentError (nothing sent) for a URL without scheme or host, or an
        empty key, which every request would only find out as a 401."""
        problem = _url_problem(base_url)
        if problem is not None:
            raise ArgumentError(f"base_url {base_url!r} {problem}")
        if not isinstance(api_key, str) or not api_key.strip():
            raise ArgumentError("api_key is empty: pass the key `punctual keys create` printed")
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._own_session = session is None
        if session is None:
            session = requests.Session()
            # requests' default adapters already make one attempt; said here, since the
            # client's contract is that it never retries (retries are the caller's call).
            never_retry = Retry(total=0, connect=0, read=0, redirect=0, status=0, other=0)
            for prefix in ("http://", "https://"):
                session.mount(prefix, HTTPAdapter(max_retries=never_retry))
        self.session = session
        self._auth = {"Authorization": f"Bearer {api_key}"}

    def close(self) -> None:
        if self._own_session:
            self.session.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # --- jobs ----------------------------------------------------------------------

    def create_job(
        self,
        name: str,
        target: Target,
        schedule: Schedule,
        payload: Any = None,
        *,
        retry: RetryPolicy | None = None,
        misfire: Misfire | None = None,
        dst: DstPolicy | None = None,
        jitter_s: int | None = None,
        labels: Mapping[str, str] | None = None,
        overlap: Overlap | None = None,
        idempotency_key: str | None = None,
    ) -> Job:
        """Create a job. With `idempotency_key`, a repeat with the same body returns the same job."""
        body = {
            "name": name,
            "target": target,
            "schedule": schedule,
            "payload": payload,
            "retry": retry,
            "misfire": misfire,
            "dst": dst,
            "jitter_s": jitter_s,
            "labels": None if labels is None else dict(labels),
            "overlap": overlap,
        }
        return self.create_job_from(
            {k: v for k, v in body.items() if v is not None}, idempotency_key=idempotency_key
        )

    def create_job_from(self, body: Mapping[str, Any], *, idempotency_key: str | None = None) -> Job:
        """Create a job from a whole API body (as in docs/api.md)."""
        headers = {} if idempotency_key is None else {"Idempotency-Key": idempotency_key}
        return Job.from_json(self._request("POST", "/jobs", json_body=body, headers=headers))

    def create_jobs(
        self, jobs: Iterable[Mapping[str, Any]], *, batch_size: int = MAX_BATCH
    ) -> list[BatchResult]:
        """Create many jobs through POST /jobs/batch, `batch_size` (at most 1,000) per request.

        Each job is a whole API body, plus an optional `idempotency_key` (as the
        Idempotency-Key header is for one create). Returns one BatchResult per job, in
        order: a job that fails is answered in its result (`error`), never raised.
        Only a failure of a whole request raises (say a TransportError); the requests
        before it were applied, so give jobs keys and send them again to resume.
        """
        if (
            isinstance(batch_size, bool)
            or not isinstance(batch_size, int)
            or not 1 <= batch_size <= MAX_BATCH
        ):
            raise ArgumentError(f"batch_size={batch_size!r}: must be an integer from 1 to {MAX_BATCH}")
        results: list[BatchResult] = []
        chunk: list[Mapping[str, Any]] = []
        for job in jobs:
            chunk.append(job)
            if len(chunk) == batch_size:
                results += self._create_batch(chunk)
                chunk = []
        if chunk:
            results += self._create_batch(chunk)
        return results

    def _create_batch(self, jobs: list[Mapping[str, Any]]) -> list[BatchResult]:
        data = self._request("POST", "/jobs/batch", json_body={"jobs": jobs})
        return [BatchResult.from_json(item) for item in data["items"]]

    def get_job(self, job_id: str) -> Job:
        return Job.from_json(self._request("GET", f"/jobs/{quote(job_id, safe='')}"))

    def put_job(self, key: str, body: Mapping[str, Any], *, dry_run: bool = False) -> Put:
        """Create the job `key`, or replace it whole with `body` (a create body); the
        same body again changes nothing. With `dry_run`, only say what it would do."""
        data, headers = self._request_with_headers(
            "PUT",
            f"/jobs/by-key/{quote(key, safe='')}",
            json_body=body,
            params={"dry_run": "true" if dry_run else None},
        )
        change = headers.get("Punctual-Change")
        if change not in CHANGES:
            raise PunctualError(f"PUT /jobs/by-key/{key}: no Punctual-Change in the answer ({change!r})")
        return Put(change=change, job=Job.from_json(data))

    def get_job_by_key(self, key: str) -> Job:
        return Job.from_json(self._request("GET", f"/jobs/by-key/{quote(key, safe='')}"))

    def list_jobs(
        self,
        *,
        state: str | None = None,
        name: str | None = None,
        labels: Mapping[str, str] | None = None,
        keyed: bool | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Page[Job]:
        """One page of jobs, newest first; with `labels`, only jobs carrying all those
        pairs; with `keyed`, only jobs with a key (True) or without one (False)."""
        params = {
            "state": state,
            "name": name,
            "label": _selector(labels),
            "keyed": None if keyed is None else str(keyed).lower(),
            "limit": limit,
            "cursor": cursor,
        }
        data = self._request("GET", "/jobs", params=params)
        return Page([Job.from_json(item) for item in data["items"]], data["next_cursor"])

    def iter_jobs(
        self,
        *,
        state: str | None = None,
        name: str | None = None,
        labels: Mapping[str, str] | None = None,
        keyed: bool | None = None,
        page_size: int = 100,
    ) -> Iterator[Job]:
        """Every job, newest first, following cursors page by page."""
        return self._follow(
            lambda cursor: self.list_jobs(
                state=state, name=name, labels=labels, keyed=keyed, limit=page_size, cursor=cursor
            )
        )

    def update_job(self, job_id: str, **fields: Any) -> Job:
        """PATCH: each named field is replaced whole.

        The fields: name, target, payload, schedule, retry, misfire, dst, jitter_s,
        labels, overlap.
        """
        return Job.from_json(self._request("PATCH", f"/jobs/{quote(job_id, safe='')}", json_body=fields))

    def cancel_job(self, job_id: str) -> Job:
        return Job.from_json(self._request("DELETE", f"/jobs/{quote(job_id, safe='')}"))

    def pause_job(self, job_id: str) -> Job:
        return Job.from_json(self._request("POST", f"/jobs/{quote(job_id, safe='')}/pause"))

    def resume_job(self, job_id: str) -> Job:
        return Job.from_json(self._request("POST", f"/jobs/{quote(job_id, safe='')}/resume"))

    def pause_jobs(self, labels: Mapping[str, str]) -> Selected:
        """Pause every job of the owner that carries all of `labels`."""
        return self._select("pause", labels)

    def resume_jobs(self, labels: Mapping[str, str]) -> Selected:
        """Resume every paused job of the owner that carries all of `labels`."""
        return self._select("resume", labels)

    def cancel_jobs(self, labels: Mapping[str, str]) -> Selected:
        """Cancel every live job of the owner that carries all of `labels`."""
        return self._select("cancel", labels)

    def _select(self, verb: str, labels: Mapping[str, str]) -> Selected:
        return Selected.from_json(self._request("POST", f"/jobs/{verb}", json_body={"labels": dict(labels)}))

    def trigger_job(self, job_id: str) -> Run:
        """One extra run now, off-schedule; returns that run (state `claimed`)."""
        return Run.from_json(self._request("POST", f"/jobs/{quote(job_id, safe='')}/trigger"))

    def backfill_job(self, job_id: str, start: datetime | str, end: datetime | str) -> Backfill:
        """Run every occurrence of the job's schedule in the past range [start, end] now
        (at most 10,000), each as a `backfill` run with its occurrence's Idempotency-Key."""
        body = {"start": start, "end": end}
        return Backfill.from_json(
            self._request("POST", f"/jobs/{quote(job_id, safe='')}/backfill", json_body=body)
        )

    # --- runs ----------------------------------------------------------------------

    def list_runs(
        self,
        job_id: str,
        *,
        origin: RunOrigin | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Page[Run]:
        """One page of a job's runs, newest first; with `origin` (schedule, trigger,
        replay, backfill), only the runs of that origin."""
        data = self._request(
            "GET",
            f"/jobs/{quote(job_id, safe='')}/runs",
            params={"origin": origin, "limit": limit, "cursor": cursor},
        )
        return Page([Run.from_json(item) for item in data["items"]], data["next_cursor"])

    def iter_runs(
        self, job_id: str, *, origin: RunOrigin | None = None, page_size: int = 100
    ) -> Iterator[Run]:
        return self._follow(
            lambda cursor: self.list_runs(job_id, origin=origin, limit=page_size, cursor=cursor)
        )

    def wait_for_run(
        self,
        job_id: str,
        *,
        since: datetime | None = None,
        states: Collection[RunState] = ENDED,
        timeout_s: float = 60.0,
        poll_s: float = 0.5,
    ) -> Run:
        """Wait until a run of the job is in one of `states` (default: ended, `succeeded`
        or `dead`) and return it.

        `since`: only a run whose scheduled_for is at or after it counts (for a recurring
        job, pass the time you start waiting to wait for its next occurrence). When
        several count, the oldest. Reads the job's newest 100 runs every `poll_s`;
        WaitTimeoutError after `timeout_s`, NotFoundError for an unknown job.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            newest = self.list_runs(job_id, limit=100).items
            matching = [
                run for run in newest if run.state in states and (since is None or run.scheduled_for >= since)
            ]
            if matching:
                return matching[-1]
            if time.monotonic() >= deadline:
                seen = f"its newest run is {newest[0].state}" if newest else "it has no run yet"
                raise WaitTimeoutError(
                    f"no run of job {job_id} reached {'/'.join(states)} within {timeout_s:g} s ({seen})"
                )
            time.sleep(max(0.0, min(poll_s, deadline - time.monotonic())))

    def list_dead_letters(self, *, limit: int | None = None, cursor: str | None = None) -> Page[Run]:
        data = self._request("GET", "/dead-letters", params={"limit": limit, "cursor": cursor})
        return Page([Run.from_json(item) for item in data["items"]], data["next_cursor"])

    def iter_dead_letters(self, *, page_size: int = 100) -> Iterator[Run]:
        return self._follow(lambda cursor: self.list_dead_letters(limit=page_size, cursor=cursor))

    def replay_run(self, run_id: str) -> Run:
        """Fire a dead run again (same idempotency key, fresh retry budget); returns it, now `replayed`."""
        return Run.from_json(self._request("POST", f"/runs/{quote(run_id, safe='')}/replay"))

    # --- schedules and operations ----------------------------------------------------

    def preview_schedule(
        self,
        cron: str | None = None,
        *,
        interval_s: int | None = None,
        timezone: str | None = None,
        count: int | None = None,
        after: datetime | str | None = None,
        gap: str | None = None,
        overlap: str | None = None,
        start_at: datetime | str | None = None,
        end_at: datetime | str | None = None,
    ) -> list[PreviewItem]:
        """The next fire instants of an expression, each flagged when DST moved or doubled it."""
        params = {
            "cron": cron,
            "interval_s": interval_s,
            "timezone": timezone,
            "count": count,
            "after": after,
            "gap": gap,
            "overlap": overlap,
            "start_at": start_at,
            "end_at": end_at,
        }
        data = self._request("GET", "/schedules/preview", params=params)
        return [PreviewItem.from_json(item) for item in data["items"]]

    def health(self) -> dict[str, Any]:
        """GET /healthz: {"shards": [{"shard", "ok"}...]}, also when some shard is down (503)."""
        health: dict[str, Any] = self._request("GET", "/healthz", ok_statuses=(503,))
        return health

    # --- plumbing ------------------------------------------------------------------

    def _follow(self, fetch: Callable[[str | None], Page[T]]) -> Iterator[T]:
        cursor = None
        while True:
            page = fetch(cursor)
            yield from page.items
            cursor = page.next_cursor
            if cursor is None:
                return

    def _request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        ok_statuses: tuple[int, ...] = (),
    ) -> Any:
        body, _headers = self._request_with_headers(
            method, path, json_body=json_body, params=params, headers=headers, ok_statuses=ok_statuses
        )
        return body

    def _request_with_headers(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        ok_statuses: tuple[int, ...] = (),
    ) -> tuple[Any, Mapping[str, str]]:
        send_headers = dict(self._auth)
        send_headers.update(headers or {})
        data = None
        if json_body is not None:
            data = json.dumps(_encode(json_body)).encode("utf-8")
            send_headers["Content-Type"] = "application/json"
        query = {k: _encode(v) for k, v in (params or {}).items() if v is not None}
        try:
            response = self.session.request(
                method,
                self.base_url + path,
                params=query,
                data=data,
                headers=send_headers,
                timeout=self.timeout_s,
            )
        except requests.RequestException as exc:
            reason = _transport_reason(exc, self.timeout_s)
            raise TransportError(f"{method} {self.base_url}{path}: {reason}", reason) from exc
        try:
            body = response.json() if response.content else None
        except ValueError:
            body = response.text
        if response.status_code >= 400 and response.status_code not in ok_statuses:
            raise error_for(response.status_code, body)
        if not isinstance(body, dict):
            raise PunctualError(f"{method} {path}: expected a JSON object, got {response.text[:200]!r}")
        return body, response.headers


def _url_problem(url: object) -> str | None:
    """Why `url` cannot be the API's base URL (None when it can)."""
    if not isinstance(url, str):
        return "is not a string"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises ValueError for a port that is not a number)
    except ValueError as exc:
        return f"is not a URL ({exc})"
    if parts.scheme not in ("http", "https"):
        return "has no http:// or https:// scheme" if "://" not in url else "is not an http(s) URL"
    if not parts.hostname:
        return "has no host"
    return None


def _transport_reason(exc: requests.RequestException, timeout_s: float) -> str:
    """Why no answer came, in plain words: the innermost OS error, not urllib3's wrappers."""
    if isinstance(exc, requests.ConnectTimeout):
        return f"no connection within {timeout_s:g} s"
    if isinstance(exc, requests.Timeout):
        return f"no answer within {timeout_s:g} s"
    seen: BaseException | None = exc
    found: OSError | None = None
    for _ in range(10):  # requests -> urllib3 MaxRetryError -> NewConnectionError -> socket error
        if seen is None:
            break
        if isinstance(seen, OSError) and getattr(seen, "strerror", None):
            found = seen
        reason = getattr(seen, "reason", None)
        seen = reason if isinstance(reason, BaseException) else (seen.__cause__ or seen.__context__)
    if isinstance(found, socket.gaierror):
        return f"cannot resolve the host ({found.strerror})"
    if found is not None:
        return str(found.strerror).lower()
    if isinstance(exc, requests.exceptions.SSLError):
        return "TLS handshake failed"
    return type(exc).__name__
