"""Webhook calls: one HTTP request per attempt, turned into a CallOutcome.

A worker process holds one `WebhookCaller`: one pooled requests.Session shared by
all of its dispatch threads. The caller never retries (retries live in the
registry, DESIGN.md invariant 3), never follows a redirect (a 3xx comes back as a
status, which the retry policy treats as fatal), and never raises for anything the
target does: every answer, timeout or connection failure is a CallOutcome.

Private targets are refused where it cannot be dodged: on the socket. Unless
private targets are allowed, every new connection checks the address it actually
connected to (`getpeername()`), before a single byte of HTTP or TLS is sent, so a
host whose DNS answer changed since the API checked it (DNS rebinding) is refused.
"""
from __future__ import annotations

import http.cookiejar
import re
import socket
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from requests.structures import CaseInsensitiveDict
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from app import __version__
from app.addresses import PrivateAddress, is_public_address
from app.retries import CallOutcome
from app.tasks.headers import RESERVED_HEADERS, delivery_headers, encode_payload

__all__ = ["WebhookCall", "WebhookCaller", "PrivatePeer"]

# Methods that send no body, no Content-Type, and sign the empty string (API.md).
_BODYLESS = frozenset({"GET", "DELETE"})
# Enough of an answer's body to keep the connection reusable; the body itself is
# never used, and a target must not be able to keep a thread busy streaming one.
_DRAIN_BYTES = 64 * 1024
# How urllib3 prefixes a connection error with the connection object.
_CONNECTION_PREFIX = re.compile(r"^(<[^>]*>|\w+\(host=[^)]*\)): ")
# Distinct hosts whose connection pools are kept (each pool opens connections lazily).
_HOST_POOLS = 512


@dataclass(frozen=True)
class WebhookCall:
    """One attempt of one run against a webhook target (a snapshot: no lookups)."""

    job_id: str
    scheduled_for: datetime
    attempt: int
    target: dict  # {"url", "method"?, "headers"?, "timeout_s"?, "limits"?}
    payload: Any
    signing_secret: str


class PrivatePeer(PrivateAddress):
    """The socket connected to an address that is not public."""


def _refuse_private_peer(sock: socket.socket, host: str) -> None:
    peer = sock.getpeername()[0]
    if not is_public_address(peer):
        sock.close()
        raise PrivatePeer(f"target address {peer} of host {host!r} is not public")


class _PublicHTTPConnection(HTTPConnection):
    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()
        _refuse_private_peer(sock, self.host)
        return sock


class _PublicHTTPSConnection(HTTPSConnection):
    # HTTPSConnection.connect() gets its raw socket from _new_conn() too, so the
    # check runs before the TLS handshake.
    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()
        _refuse_private_peer(sock, self.host)
        return sock


class _PublicHTTPConnectionPool(HTTPConnectionPool):
    ConnectionCls = _PublicHTTPConnection


class _PublicHTTPSConnectionPool(HTTPSConnectionPool):
    ConnectionCls = _PublicHTTPSConnection


class _PublicOnlyAdapter(HTTPAdapter):
    """An HTTPAdapter whose connections refuse non-public peers."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {
            "http": _PublicHTTPConnectionPool,
            "https": _PublicHTTPSConnectionPool,
        }


class WebhookCaller:
    """Calls webhook targets for one worker process; safe to share across threads."""

    def __init__(self, allow_private: bool, pool_maxsize: int = 256):
        self.allow_private = allow_private
        adapter_cls = HTTPAdapter if allow_private else _PublicOnlyAdapter
        # max_retries=0: the registry is the only layer that retries. pool_block
        # False: a burst beyond pool_maxsize opens extra connections rather than
        # queueing calls behind each other (they are simply not kept afterwards).
        adapter = adapter_cls(
            pool_connections=_HOST_POOLS, pool_maxsize=pool_maxsize, max_retries=0, pool_block=False
        )
        session = requests.Session()
        session.mount("http://", adapter)
        session.mount("https://", adapter)
        # No proxies or .netrc from the environment: the peer check must see the target.
        session.trust_env = False
        # Owners share this session: a cookie set by one target must never reach another call.
        session.cookies.set_policy(_NoCookies())
        session.headers = CaseInsensitiveDict({"User-Agent": f"Punctual/{__version__}", "Accept": "*/*"})
        self._session = session

    def close(self) -> None:
        self._session.close()

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
        try:
            response = self._session.request(
                method,
                target.get("url") or "",
                data=body if method not in _BODYLESS else None,
                headers=headers,
                timeout=(timeout_s, timeout_s),
                allow_redirects=False,
                stream=True,
            )
        except PrivatePeer as exc:
            return CallOutcome(error=str(exc), retryable_error=False)
        except requests.Timeout:
            return CallOutcome(error=f"timeout after {timeout_s:g}s")
        except requests.ConnectionError as exc:
            return CallOutcome(error=_connection_error_text(exc))
        except (requests.exceptions.InvalidURL, requests.exceptions.InvalidSchema,
                requests.exceptions.MissingSchema, requests.exceptions.InvalidHeader) as exc:
            return CallOutcome(error=f"invalid request: {exc}", retryable_error=False)
        except Exception as exc:  # the contract: a CallOutcome, whatever the target did
            return CallOutcome(error=f"{type(exc).__name__}: {exc}")
        try:
            return CallOutcome(status_code=response.status_code, retry_after=response.headers.get("Retry-After"))
        finally:
            _drain_and_close(response)


def _request_headers(call: WebhookCall, method: str, body: bytes) -> dict[str, str]:
    headers = {
        str(name): str(value)
        for name, value in (call.target.get("headers") or {}).items()
        if str(name).lower() not in RESERVED_HEADERS
    }
    headers.update(
        delivery_headers(
            job_id=call.job_id,
            scheduled_for=call.scheduled_for,
            attempt=call.attempt,
            body=body,
            signing_secret=call.signing_secret,
        )
    )
    if method not in _BODYLESS:
        headers["Content-Type"] = "application/json"
    return headers


def _drain_and_close(response: requests.Response) -> None:
    """Read a small body so the connection can be reused; close it otherwise."""
    try:
        read = 0
        for chunk in response.iter_content(8192):
            read += len(chunk)
            if read > _DRAIN_BYTES:
                break
    except Exception:  # the status is known already; a broken body changes nothing
        pass
    finally:
        response.close()


def _connection_error_text(exc: requests.ConnectionError) -> str:
    """The innermost reason of a connection failure, without urllib3's wrapping."""
    reason: BaseException | None = exc.args[0] if exc.args and isinstance(exc.args[0], BaseException) else None
    reason = getattr(reason, "reason", None) or reason  # MaxRetryError -> NewConnectionError
    # "HTTPConnection(host='h', port=80): Failed to ..." -> "Failed to ..."
    text = _CONNECTION_PREFIX.sub("", str(reason or exc))
    return f"connection failed: {text}"


class _NoCookies(http.cookiejar.DefaultCookiePolicy):
    def set_ok(self, cookie, request) -> bool:  # noqa: ANN001
        return False

    def return_ok(self, cookie, request) -> bool:  # noqa: ANN001
        return False
