"""Webhook calls: one HTTP request per attempt, turned into a CallOutcome.

A worker process holds one `WebhookCaller`: one urllib3 PoolManager shared by all
of its dispatch threads. urllib3 directly, not requests: on the burst the call is
the worker's hot path, and requests' session machinery (hooks, cookie jars,
environment merging) cost about three times urllib3's own per-call CPU here. For
the same reason a call goes to its origin's connection pool directly (found once per
origin, `_Origins`) with the URL's path as it will be sent, rather than through
`PoolManager.request`, which parses the whole URL and looks the pool up again on
every call. The
caller never retries (retries live in the registry, docs/design.md invariant 3),
never follows a redirect (a 3xx comes back as a status, which the retry policy treats
as fatal), and never raises for anything the target does: every answer, timeout or
connection failure is a CallOutcome.

Private targets are refused where it cannot be dodged: on the socket. Unless
private targets are allowed, every new connection checks the address it actually
connected to (`getpeername()`), before a single byte of HTTP or TLS is sent, so a
host whose DNS answer changed since the API checked it (DNS rebinding) is refused.
"""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import HTTPError, LocationValueError, NewConnectionError
from urllib3.exceptions import TimeoutError as Urllib3Timeout
from urllib3.util.retry import Retry
from urllib3.util.url import parse_url

from app import __version__
from app.core.delivery import delivery_headers, encode_payload, is_reserved_header
from app.core.retries import CallOutcome
from app.services.addresses import PrivateAddress, is_public_address

__all__ = ["WebhookCall", "WebhookCaller", "PrivatePeer", "NotSent"]

# Methods that send no body, no Content-Type, and sign the empty string (docs/api.md).
_BODYLESS = frozenset({"GET", "DELETE"})
# Enough of an answer's body to keep the connection reusable; the body itself is
# never used, and a target must not be able to keep a thread busy streaming one.
_DRAIN_BYTES = 64 * 1024
# How urllib3 prefixes a connection error with the connection object.
_CONNECTION_PREFIX = re.compile(r"^(<[^>]*>|\w+\(host=[^)]*\)): ")
# Distinct hosts whose connection pools are kept (each pool opens connections lazily).
_HOST_POOLS = 512
_BASE_HEADERS = {"User-Agent": f"Punctual/{__version__}", "Accept": "*/*"}
# What retries=False, redirect=False become inside urllib3 (no retry, a 3xx returned
# as it is), made once rather than on every call.
_NO_RETRIES = Retry.from_int(False, redirect=False)
# A path and query that urllib3 would send exactly as written: no percent escapes
# (it upper-cases them), no dot segments (it removes them), no fragment, nothing it
# would escape. Any other URL has its request target made by urllib3's own parser.
_PLAIN_TARGET = re.compile(r"/[A-Za-z0-9\-_~!$&'()*+,;=:@/?]*")


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


class NotSent(Exception):
    """The call was withdrawn before its request was written whole (WebhookCall.may_send)."""


class PrivatePeer(PrivateAddress):
    """The socket connected to an address that is not public."""


def _refuse_private_peer(sock: socket.socket, host: str) -> None:
    peer = sock.getpeername()[0]
    if not is_public_address(peer):
        sock.close()
        raise PrivatePeer(f"target address {peer} of host {host!r} is not public")


# The call this thread is sending (WebhookCall.may_send, whether a body follows its
# header block, and that block while it is held): set by WebhookCaller.call around
# urlopen, read by `_last_write`.
_last_look = threading.local()


def _last_write(data: Any) -> Any:
    """What to write now for `data`, one of the request's writes, or None to hold it.

    http.client writes the header block and then the body. Stopped between the two,
    a process would send the body when it woke, and the target would get the whole
    request then: an older attempt after a newer one. So the header block of a
    request with a body is held and written with the body, in one write, and the
    lease is looked at once more right before it (WebhookCall.may_send)."""
    look = _last_look
    if getattr(look, "body_follows", False) and getattr(look, "headers", None) is None:
        look.headers = bytes(data)
        return None
    may_send = getattr(look, "may_send", None)
    if may_send is not None and not may_send():
        raise NotSent("call withdrawn as its request was about to be written")
    held, look.headers = getattr(look, "headers", None), None
    return held + bytes(data) if held is not None else data


class _LastLook:
    """Mixed into a connection class ahead of it: its writes go through `_last_write`."""

    def send(self, data: Any) -> None:
        data = _last_write(data)
        if data is not None:
            super().send(data)  # type: ignore[misc]


class _CheckedHTTPConnection(_LastLook, HTTPConnection):
    pass


class _CheckedHTTPSConnection(_LastLook, HTTPSConnection):
    pass


class _PublicHTTPConnection(_CheckedHTTPConnection):
    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()
        _refuse_private_peer(sock, self.host)
        return sock


class _PublicHTTPSConnection(_CheckedHTTPSConnection):
    # HTTPSConnection.connect() gets its raw socket from _new_conn() too, so the
    # check runs before the TLS handshake.
    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()
        _refuse_private_peer(sock, self.host)
        return sock


class _CheckedHTTPConnectionPool(HTTPConnectionPool):
    ConnectionCls = _CheckedHTTPConnection


class _CheckedHTTPSConnectionPool(HTTPSConnectionPool):
    ConnectionCls = _CheckedHTTPSConnection


class _PublicHTTPConnectionPool(HTTPConnectionPool):
    ConnectionCls = _PublicHTTPConnection


class _PublicHTTPSConnectionPool(HTTPSConnectionPool):
    ConnectionCls = _PublicHTTPSConnection


class WebhookCaller:
    """Calls webhook targets for one worker process; safe to share across threads."""

    def __init__(self, allow_private: bool, pool_maxsize: int = 256):
        self.allow_private = allow_private
        # retries=False: the registry is the only layer that retries, and errors
        # surface as themselves. block=False: a burst beyond pool_maxsize opens
        # extra connections rather than queueing calls behind each other (they
        # are simply not kept afterwards). urllib3 keeps no cookies and reads no
        # proxy from the environment, so the peer check sees the real target and
        # nothing one target sets reaches another owner's call.
        self._pool = urllib3.PoolManager(
            num_pools=_HOST_POOLS, maxsize=pool_maxsize, block=False, retries=False
        )
        self._pool.pool_classes_by_scheme = (
            {"http": _CheckedHTTPConnectionPool, "https": _CheckedHTTPSConnectionPool}
            if allow_private
            else {"http": _PublicHTTPConnectionPool, "https": _PublicHTTPSConnectionPool}
        )
        self._origins = _Origins(self._pool)
        self._timeouts: dict[float, urllib3.Timeout] = {}

    def close(self) -> None:
        self._origins.clear()
        self._pool.clear()

    def _timeout(self, seconds: float) -> urllib3.Timeout:
        timeout = self._timeouts.get(seconds)
        if timeout is None:
            if len(self._timeouts) > 64:  # job-chosen values: keep the table small
                self._timeouts.clear()
            timeout = self._timeouts[seconds] = urllib3.Timeout(connect=seconds, read=seconds)
        return timeout

    def call(self, call: WebhookCall) -> CallOutcome:
        """Make one attempt; never raises for a target-side problem."""
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
        _last_look.may_send, _last_look.body_follows, _last_look.headers = call.may_send, bool(body), None
        try:
            pool, request_target = self._origins.route(url)
            response = pool.urlopen(
                method,
                request_target,
                body=body if method not in _BODYLESS else None,
                headers=headers,
                retries=_NO_RETRIES,
                redirect=False,
                assert_same_host=False,
                timeout=self._timeout(timeout_s),
                preload_content=False,
                release_conn=False,
            )
        except NotSent:
            raise
        except PrivatePeer as exc:
            return CallOutcome(error=str(exc), retryable_error=False)
        except NewConnectionError as exc:  # before timeouts: urllib3 makes it a ConnectTimeoutError subclass
            return CallOutcome(error=_connection_error_text(exc))
        except Urllib3Timeout:
            return CallOutcome(error=f"timeout after {timeout_s:g}s")
        except (LocationValueError, ValueError) as exc:
            return CallOutcome(error=f"invalid request: {exc}", retryable_error=False)
        except (HTTPError, OSError) as exc:
            return CallOutcome(error=_connection_error_text(exc))
        except Exception as exc:  # the contract: a CallOutcome, whatever the target did
            return CallOutcome(error=f"{type(exc).__name__}: {exc}")
        finally:
            _last_look.may_send, _last_look.body_follows, _last_look.headers = None, False, None
        try:
            return CallOutcome(status_code=response.status, retry_after=response.headers.get("Retry-After"))
        finally:
            _drain_and_release(response)


class _Origins:
    """The connection pool of each origin (scheme://authority), looked up in a dict.

    The pools themselves are the PoolManager's (so its pool classes, its limit of
    _HOST_POOLS and its own parsing of the host decide them); this only remembers
    which pool an origin string maps to. A pool the PoolManager has since dropped
    (and closed) is looked up again.
    """

    def __init__(self, manager: urllib3.PoolManager):
        self._manager = manager
        self._pools: dict[str, HTTPConnectionPool] = {}

    def route(self, url: str) -> tuple[HTTPConnectionPool, str]:
        """The pool for `url` and the request target to send it (path and query)."""
        start = url.index("://") + 3
        end = len(url)
        for mark in "/?#":
            found = url.find(mark, start)
            if found != -1 and found < end:
                end = found
        origin, rest = url[:end], url[end:]
        pool = self._pools.get(origin)
        if pool is None or pool.pool is None:  # new, or closed by the PoolManager
            if len(self._pools) >= _HOST_POOLS:
                self._pools.clear()
            pool = self._pools[origin] = self._manager.connection_from_url(origin)
        if not (rest and "/." not in rest and _PLAIN_TARGET.fullmatch(rest)):
            # PoolManager's own way: normalised by urllib3's parser.
            rest = parse_url(url).request_uri
        return pool, rest

    def clear(self) -> None:
        self._pools.clear()


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
        )
    )
    if method not in _BODYLESS:
        headers["Content-Type"] = "application/json"
    return headers


def _drain_and_release(response: urllib3.BaseHTTPResponse) -> None:
    """Read a small body so the connection can be reused; drop the connection otherwise."""
    try:
        read = 0
        for chunk in response.stream(8192, decode_content=False):
            read += len(chunk)
            if read > _DRAIN_BYTES:
                response.close()
                break
    except Exception:  # the status is known already; a broken body changes nothing
        response.close()
    finally:
        response.release_conn()


def _connection_error_text(exc: BaseException) -> str:
    """The innermost reason of a connection failure, without urllib3's wrapping."""
    reason = getattr(exc, "reason", None) or exc  # MaxRetryError / ProtocolError -> the cause
    # "HTTPConnection(host='h', port=80): Failed to ..." -> "Failed to ..."
    text = _CONNECTION_PREFIX.sub("", str(reason))
    return f"connection failed: {text}"
