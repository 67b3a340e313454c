"""Webhook calls: one HTTP request per attempt, turned into a CallOutcome.

A worker process holds one `WebhookCaller`: one aiohttp session on the process's
event loop (app.worker.event_loop), so a call is a task on that loop, not a thread
blocked on a socket: on threads, the GIL handed between a hundred of them and
http.client's pure-Python parsing made the call the largest share of the worker's
CPU. The caller never retries (retries live in the registry, docs/design.md
invariant 3), never follows a redirect (a 3xx comes back as a status, which the
retry policy treats as fatal), keeps no cookies, reads no proxy from the
environment, and never raises for anything the target does: every answer, timeout
or connection failure is a CallOutcome.

Private targets are refused where it cannot be dodged: at the socket. Unless every
private target is allowed, each new connection checks the address it is about to
connect to (the socket factory sees each address the name resolved to, a literal
included) before a byte of HTTP or TLS is sent: public, or allowed by
PUNCTUAL_PRIVATE_TARGETS (its network, or the URL's host name), so a host whose DNS
answer changed since the API checked it (DNS rebinding) is refused.

The last look, right before the request's one write (aiohttp writes the header block
with the body, or alone without one), on the connection made: the run's name out of
its roll (WebhookCall.claim: a process killed before that leaves the run to a taker,
not to its lease), then its lease (WebhookCall.may_send, asked before too), nothing
awaited between the claim's answer and the write: a process stopped in between sends
nothing stale; the target never gets an older attempt's request after a newer one.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import aiohttp
from aiohttp.abc import AbstractStreamWriter
from aiohttp.client_reqrep import ClientResponse
from aiohttp.connector import Connection
from aiohttp.payload import BytesPayload
from yarl import URL

from app import __version__
from app.core.delivery import delivery_headers, encode_payload, is_reserved_header
from app.core.private_targets import PrivateTargets, TargetPolicy, policy_of
from app.core.retries import CallOutcome
from app.services.addresses import PrivateAddress, is_public_address
from app.worker.event_loop import LoopThread

__all__ = ["WebhookCall", "WebhookCaller", "PrivatePeer", "NotSent"]

# Methods that send no body, no Content-Type, and sign the empty string (docs/api.md).
_BODYLESS = frozenset({"GET", "DELETE"})
# Enough of an answer's body to keep the connection reusable; the body itself is
# never used, and a target must not be able to keep a call busy streaming one.
_DRAIN_BYTES = 64 * 1024
_BASE_HEADERS = {"User-Agent": f"Punctual/{__version__}", "Accept": "*/*"}
# How long a host name's addresses are kept (each new connection checks its address
# regardless).
_DNS_TTL_S = 10


@dataclass(frozen=True)
class WebhookCall:
    """One attempt of one run against a webhook target (a snapshot: no lookups)."""

    job_id: str
    scheduled_for: datetime
    attempt: int
    target: dict  # {"url", "method"?, "headers"?, "timeout_s"?, "limits"?}
    payload: Any
    signing_secrets: tuple[str, ...]  # the current secret first; the previous one too in a rotation window
    # Asked once more right before the request goes out (after the headers are built
    # and signed): False withdraws the call (NotSent) -- the run's lease may be gone.
    may_send: Callable[[], bool] | None = None
    traceparent: str | None = None  # the call's W3C trace context (app.tracing)
    # Awaited once, on the connection, right before the lease's last look and the
    # write: the run's name out of the roll (app.worker.orphans.Roll.claim). False
    # withdraws the call (NotSent): a taker had the name, so the run is not ours.
    claim: Callable[[], Awaitable[bool]] | None = None


class NotSent(Exception):
    """The call was withdrawn before its request was written whole (WebhookCall.may_send,
    WebhookCall.claim)."""


class PrivatePeer(PrivateAddress):
    """The connection would reach an address that is not public."""


@dataclass(frozen=True)
class _Sending:
    """What the connector and the request's writes need to know of the call being
    made (set for the call's task by WebhookCaller.send)."""

    url: str
    may_send: Callable[[], bool] | None
    claim: Callable[[], Awaitable[bool]] | None
    body_follows: bool


_sending: contextvars.ContextVar[_Sending | None] = contextvars.ContextVar("punctual_sending", default=None)


async def _last_look() -> None:
    """Raise NotSent unless the call being made may still be sent: its run's name taken
    out of the roll (WebhookCall.claim, awaited), then its lease (WebhookCall.may_send).
    The caller writes next, with nothing awaited in between."""
    sending = _sending.get()
    if sending is None:
        return
    if sending.claim is not None and not await sending.claim():
        raise NotSent("call withdrawn: its run's name was no longer in the roll")
    if sending.may_send is not None and not sending.may_send():
        raise NotSent("call withdrawn as its request was about to be written")


class _GuardedRequest(aiohttp.ClientRequest):
    """A request that takes its last look right before a header block with no body
    behind it is written (inside `send`, with nothing awaited in between)."""

    async def send(self, conn: Connection) -> ClientResponse:
        sending = _sending.get()
        if sending is not None and not sending.body_follows:
            await _last_look()
        return await super().send(conn)


class _GuardedBody(BytesPayload):
    """A body that takes its last look right before it is written, together with the
    header block aiohttp held back for it (one write)."""

    async def write(self, writer: AbstractStreamWriter) -> None:
        await _last_look()
        await super().write(writer)

    async def write_with_length(self, writer: AbstractStreamWriter, content_length: int | None) -> None:
        await _last_look()
        await super().write_with_length(writer, content_length)


def _checked_socket(policy: PrivateTargets, addr_info: tuple) -> socket.socket:
    """The connector's socket factory unless every private target is allowed: the
    address about to be connected to must be public, or allowed by `policy` (its
    network, or the host name of the URL being called)."""
    family, type_, proto, _, address = addr_info
    if not is_public_address(address[0]):
        sending = _sending.get()
        host = URL(sending.url).host if sending is not None else None
        if not policy.allows(host, address[0]):
            raise PrivatePeer(f"target address {address[0]} of host {host or '?'!r} is not public")
    return socket.socket(family, type_, proto)


class WebhookCaller:
    """Calls webhook targets for one worker process.

    `send` is a coroutine for the caller's loop (`self.loop`); `call` makes one call
    from any other thread and waits for it.
    """

    def __init__(self, allow_private: TargetPolicy, blocking_threads: int = 32):
        """`allow_private`: True for every private target, or the operator's allow-list
        (settings.private_target_policy); `blocking_threads`: the most threads the loop
        starts for work that blocks (app.worker.event_loop)."""
        self.private_targets = policy_of(allow_private)
        self.loop = LoopThread("calls", blocking_threads)
        self._session: aiohttp.ClientSession | None = None
        self._session_loop: asyncio.AbstractEventLoop | None = None
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {}

    def call(self, call: WebhookCall) -> CallOutcome:
        """Make one attempt from a thread that is not the loop's; never raises for a
        target-side problem."""
        return self.loop.submit(self.send(call)).result()

    def close(self, timeout_s: float = 5.0) -> None:
        session = self._session
        self._session = self._session_loop = None
        if session is not None and not session.closed:
            try:
                self.loop.submit(session.close()).result(timeout_s)
            except Exception:  # the loop is going away regardless; its sockets with it
                pass
        self.loop.stop()

    def _client(self) -> aiohttp.ClientSession:
        running = asyncio.get_running_loop()
        if self._session is None or self._session_loop is not running:
            connector = aiohttp.TCPConnector(
                # No limit: calls in flight are bounded by the dispatcher (a cap, the
                # process's PUNCTUAL_DISPATCH_THREADS), not by queueing here.
                limit=0,
                ttl_dns_cache=_DNS_TTL_S,
                socket_factory=(
                    None
                    if self.private_targets.allow_all
                    else functools.partial(_checked_socket, self.private_targets)
                ),
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                request_class=_GuardedRequest,
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False,
                trust_env=False,
                skip_auto_headers=("Accept-Encoding",),
            )
            self._session_loop = running
        return self._session

    def _timeout(self, seconds: float) -> aiohttp.ClientTimeout:
        timeout = self._timeouts.get(seconds)
        if timeout is None:
            if len(self._timeouts) > 64:  # job-chosen values: keep the table small
                self._timeouts.clear()
            timeout = self._timeouts[seconds] = aiohttp.ClientTimeout(
                total=None, connect=seconds, sock_read=seconds
            )
        return timeout

    async def send(self, call: WebhookCall) -> CallOutcome:
        """Make one attempt (on `self.loop`); never raises for a target-side problem."""
        target = call.target
        try:
            method = str(target.get("method") or "POST").upper()
            timeout_s = float(target.get("timeout_s") or 30)
            body = b"" if method in _BODYLESS else encode_payload(call.payload)
            headers = _request_headers(call, method, body)
        except (TypeError, ValueError) as exc:  # a payload that is not JSON, a bad timeout_s
            return CallOutcome(error=f"cannot build the request: {exc}", retryable_error=False)
        url = target.get("url") or ""
        if not url.lower().startswith(("http://", "https://")):
            return CallOutcome(error=f"invalid request: {url!r} is not an http(s) URL", retryable_error=False)
        if call.may_send is not None and not call.may_send():
            raise NotSent(f"call of job {call.job_id} attempt {call.attempt} withdrawn")
        _sending.set(_Sending(url, call.may_send, call.claim, method not in _BODYLESS))
        try:
            async with self._client().request(
                method,
                url,
                data=None if method in _BODYLESS else _GuardedBody(body, content_type="application/json"),
                headers=headers,
                allow_redirects=False,
                timeout=self._timeout(timeout_s),
            ) as response:
                outcome = CallOutcome(
                    status_code=response.status, retry_after=response.headers.get("Retry-After")
                )
                await _drain(response)
                return outcome
        except NotSent:
            raise
        except PrivatePeer as exc:
            return CallOutcome(error=str(exc), retryable_error=False)
        except TimeoutError:  # aiohttp's connect and read timeouts are TimeoutErrors too
            return CallOutcome(error=f"timeout after {timeout_s:g}s")
        except aiohttp.InvalidURL as exc:
            return CallOutcome(error=f"invalid request: {exc}", retryable_error=False)
        except (aiohttp.ClientError, OSError) as exc:
            if _withdrawn(exc):  # the look at the body's write: aiohttp wraps what it raised
                raise NotSent(f"call of job {call.job_id} attempt {call.attempt} withdrawn") from exc
            if isinstance(exc.__cause__, PrivatePeer):
                return CallOutcome(error=str(exc.__cause__), retryable_error=False)
            return CallOutcome(error=_connection_error_text(exc))
        except ValueError as exc:
            return CallOutcome(error=f"invalid request: {exc}", retryable_error=False)
        except Exception as exc:  # the contract: a CallOutcome, whatever the target did
            return CallOutcome(error=f"{type(exc).__name__}: {exc}")
        finally:
            _sending.set(None)


def _withdrawn(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, NotSent):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _request_headers(call: WebhookCall, method: str, body: bytes) -> dict[str, str]:
    headers = dict(_BASE_HEADERS)
    headers.update(
        (str(name), str(value))
        for name, value in (call.target.get("headers") or {}).items()
        if not is_reserved_header(str(name))
    )
    headers.update(
        delivery_headers(
            job_id=call.job_id,
            scheduled_for=call.scheduled_for,
            attempt=call.attempt,
            body=body,
            signing_secrets=call.signing_secrets,
            traceparent=call.traceparent,
        )
    )
    if method not in _BODYLESS:
        headers["Content-Type"] = "application/json"
    return headers


async def _drain(response: aiohttp.ClientResponse) -> None:
    """Read a small body so the connection can be reused; drop the connection otherwise.

    A body already whole in the buffer (the usual short answer, come with its status
    line) is not read: its end released the connection to the pool already (aiohttp
    does on the payload's EOF), and nothing uses the bytes."""
    if response.content.is_eof():
        return
    try:
        read = 0
        while chunk := await response.content.read(8192):
            read += len(chunk)
            if read > _DRAIN_BYTES:
                response.close()
                return
    except Exception:  # the status is known already; a broken body changes nothing
        response.close()


def _connection_error_text(exc: BaseException) -> str:
    """What failed, without aiohttp's wrapping: the OS's reason where there is one."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        reason = exc.os_error
        errno = getattr(reason, "errno", None)
        text = (
            os.strerror(errno)
            if isinstance(errno, int) and errno > 0
            else (str(reason) or type(reason).__name__)
        )
        return f"connection failed: {exc.host}:{exc.port}: {text}"
    return f"connection failed: {str(exc) or type(exc).__name__}"
