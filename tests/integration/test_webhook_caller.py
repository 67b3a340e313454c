"""WebhookCaller against a real HTTP server on 127.0.0.1 (a sink in a thread)."""

from __future__ import annotations

import json
import socket
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from app.services.addresses import resolve_target
from app.worker.webhook import WebhookCall, WebhookCaller
from punctual_client.signature import verify_signature
from tests.fuzz.raw_target import read_request

pytestmark = pytest.mark.integration

SECRET = "whsec_test_secret"
JOB_ID = "7f0c2a1e-0000-4000-8000-000000000001"
SCHEDULED_FOR = datetime(2026, 12, 1, 0, 0, 0, 123000, tzinfo=UTC)


class _Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, so that connection reuse is visible

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.server.received.append(
            {
                "method": self.command,
                "path": self.path,
                "headers": dict(self.headers),
                "body": body,
                "client": self.client_address,
            }
        )
        status, extra, answer = 200, {}, b"ok"
        if self.path == "/redirect":
            status, extra = 302, {"Location": "/elsewhere"}
        elif self.path == "/fail":
            status = 500
        elif self.path == "/busy":
            status, extra = 429, {"Retry-After": "7"}
        elif self.path == "/unavailable":
            status, extra = 503, {"Retry-After": "Wed, 21 Oct 2026 07:28:00 GMT"}
        elif self.path == "/slow":
            time.sleep(2)
        elif self.path == "/big":
            answer = b"x" * (1024 * 1024)
        self.send_response(status)
        for name, value in extra.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        try:
            self.wfile.write(answer)
        except OSError:  # the caller stopped reading (the /big case)
            pass

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _handle

    def log_message(self, *args) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # socketserver's default listen backlog is 5: 32 threads connecting at once on a
    # busy box overflow it, and the kernel resets some of those connections (seen as
    # "Connection reset by peer" in 2 of 25 loaded runs; 0 of 25 with 128).
    request_queue_size = 128

    def handle_error(self, request, client_address) -> None:
        pass  # callers that hang up (the timeout and large-answer tests) are expected


@pytest.fixture(scope="module")
def sink():
    server = _Server(("127.0.0.1", 0), _Sink)
    server.received = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def received(sink):
    sink.received.clear()
    return sink.received


@pytest.fixture(scope="module")
def caller():
    c = WebhookCaller(allow_private=True)
    yield c
    c.close()


def url(sink, path: str = "/hook") -> str:
    return f"http://127.0.0.1:{sink.server_address[1]}{path}"


def make_call(target_url: str, method: str = "POST", **target) -> WebhookCall:
    return WebhookCall(
        job_id=JOB_ID,
        scheduled_for=SCHEDULED_FOR,
        attempt=3,
        target={"type": "webhook", "url": target_url, "method": method, **target},
        payload={"invoice": 42, "name": "Zoë"},
        signing_secrets=(SECRET,),
    )


def test_post_carries_every_header_and_a_valid_signature(sink, received, caller):
    call = make_call(url(sink), headers={"X-Team": "billing"})
    outcome = caller.call(call)
    assert outcome.status_code == 200 and outcome.succeeded and outcome.error is None
    [request] = received
    headers = request["headers"]
    assert request["method"] == "POST"
    assert headers["Idempotency-Key"] == f"{JOB_ID}:2026-12-01T00:00:00.123Z"
    assert headers["Punctual-Job-Id"] == JOB_ID
    assert headers["Punctual-Scheduled-For"] == "2026-12-01T00:00:00.123Z"
    assert headers["Punctual-Attempt"] == "3"
    assert headers["Content-Type"] == "application/json"
    assert headers["X-Team"] == "billing"
    assert json.loads(request["body"]) == {"invoice": 42, "name": "Zoë"}
    assert b" " not in request["body"]  # compact JSON
    verify_signature(SECRET, headers["Punctual-Signature"], request["body"])


def test_job_headers_cannot_override_punctual_headers(sink, received, caller):
    forged = {
        "Idempotency-Key": "forged",
        "punctual-job-id": "forged",
        "PUNCTUAL-ATTEMPT": "99",
        "Punctual-Signature": "t=1,v1=00",
        "content-type": "text/plain",
        "X-Ok": "yes",
    }
    outcome = caller.call(make_call(url(sink), headers=forged))
    assert outcome.status_code == 200
    headers = received[0]["headers"]
    assert headers["Idempotency-Key"] == f"{JOB_ID}:2026-12-01T00:00:00.123Z"
    assert headers["Punctual-Job-Id"] == JOB_ID
    assert headers["Punctual-Attempt"] == "3"
    assert headers["Content-Type"] == "application/json"
    assert headers["X-Ok"] == "yes"
    verify_signature(SECRET, headers["Punctual-Signature"], received[0]["body"])


@pytest.mark.parametrize("method", ["GET", "DELETE"])
def test_get_and_delete_send_no_body_and_sign_the_empty_string(sink, received, caller, method):
    outcome = caller.call(make_call(url(sink), method=method, headers={"Content-Type": "text/plain"}))
    assert outcome.status_code == 200
    [request] = received
    assert request["method"] == method
    assert request["body"] == b""
    assert "Content-Type" not in request["headers"]
    assert request["headers"].get("Content-Length", "0") == "0"
    verify_signature(SECRET, request["headers"]["Punctual-Signature"], b"")
    verify_signature(SECRET, request["headers"]["Punctual-Signature"], "")


@pytest.mark.parametrize("method", ["PUT", "PATCH"])
def test_put_and_patch_send_the_payload(sink, received, caller, method):
    outcome = caller.call(make_call(url(sink), method=method))
    assert outcome.status_code == 200
    assert received[0]["method"] == method
    assert json.loads(received[0]["body"]) == {"invoice": 42, "name": "Zoë"}


def test_a_redirect_is_returned_not_followed(sink, received, caller):
    outcome = caller.call(make_call(url(sink, "/redirect")))
    assert outcome.status_code == 302 and not outcome.succeeded
    assert [r["path"] for r in received] == ["/redirect"]


def test_server_error_and_retry_after_are_mapped(sink, received, caller):
    fail = caller.call(make_call(url(sink, "/fail")))
    assert fail.status_code == 500 and fail.retry_after is None and fail.error is None
    busy = caller.call(make_call(url(sink, "/busy")))
    assert busy.status_code == 429 and busy.retry_after == "7"
    unavailable = caller.call(make_call(url(sink, "/unavailable")))
    assert unavailable.status_code == 503 and unavailable.retry_after == "Wed, 21 Oct 2026 07:28:00 GMT"


def test_a_large_answer_is_not_read_to_the_end(sink, received, caller):
    outcome = caller.call(make_call(url(sink, "/big")))
    assert outcome.status_code == 200


def test_connections_are_pooled(sink, received, caller):
    for _ in range(3):
        assert caller.call(make_call(url(sink))).status_code == 200
    assert len({r["client"] for r in received}) == 1


def test_timeout(sink, received, caller):
    started = time.monotonic()
    outcome = caller.call(make_call(url(sink, "/slow"), timeout_s=0.5))
    assert outcome.status_code is None
    assert outcome.error == "timeout after 0.5s"
    assert outcome.retryable_error and not outcome.succeeded
    assert time.monotonic() - started < 1.9


def test_connection_refused(caller):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    outcome = caller.call(make_call(f"http://127.0.0.1:{port}/hook"))
    assert outcome.status_code is None and outcome.retryable_error
    assert outcome.error.startswith("connection failed:")
    assert "refused" in outcome.error.lower()


def test_unresolvable_host_is_a_retryable_connection_error(caller):
    outcome = caller.call(make_call("http://no-such-host.invalid/hook"))
    assert outcome.status_code is None and outcome.retryable_error
    assert outcome.error.startswith("connection failed:")


def test_a_bad_url_is_fatal(caller):
    outcome = caller.call(make_call("ftp://example.com/hook"))
    assert outcome.error and not outcome.retryable_error


def test_private_peer_is_refused_when_not_allowed(sink, received):
    strict = WebhookCaller(allow_private=False)
    try:
        outcome = strict.call(make_call(url(sink)))
    finally:
        strict.close()
    assert outcome.status_code is None
    assert outcome.retryable_error is False
    assert "127.0.0.1" in outcome.error and "is not public" in outcome.error
    assert received == []


def test_the_allow_list_lets_its_networks_and_names_through_at_the_socket(sink, received, monkeypatch):
    from app.core.private_targets import PrivateTargets

    real_getaddrinfo = socket.getaddrinfo

    def named(host, port, *args, **kwargs):  # two names for the sink on loopback
        if host in ("sink.internal", "other.internal"):
            return real_getaddrinfo("127.0.0.1", port, *args, **kwargs)
        return real_getaddrinfo(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", named)
    port = sink.server_address[1]
    cases = [
        (PrivateTargets.parse("127.0.0.0/8"), url(sink), 200),
        (PrivateTargets.parse("sink.internal"), f"http://sink.internal:{port}/hook", 200),
        (PrivateTargets.parse("sink.internal"), f"http://other.internal:{port}/hook", None),
        (PrivateTargets.parse("10.0.0.0/8"), url(sink), None),
    ]
    for policy, target, status in cases:
        caller = WebhookCaller(allow_private=policy)
        try:
            outcome = caller.call(make_call(target))
        finally:
            caller.close()
        assert outcome.status_code == status, (policy, target, outcome)
        if status is None:  # refused before a byte went out, for good
            assert "is not public" in outcome.error and outcome.retryable_error is False
    assert len(received) == 2


def test_dns_rebinding_is_refused_at_connect(sink, received, monkeypatch):
    """The API saw a public address; by call time the name points at loopback."""
    real_getaddrinfo = socket.getaddrinfo
    answers = iter(["93.184.216.34"])  # the first answer only, then loopback

    def rebinding(host, port, *args, **kwargs):
        if host == "rebind.example":
            return real_getaddrinfo(next(answers, "127.0.0.1"), port, *args, **kwargs)
        return real_getaddrinfo(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    target = f"http://rebind.example:{sink.server_address[1]}/hook"
    assert resolve_target(target, allow_private=False) == ["93.184.216.34"]
    strict = WebhookCaller(allow_private=False)
    try:
        outcome = strict.call(make_call(target))
    finally:
        strict.close()
    assert outcome.retryable_error is False
    assert "127.0.0.1" in outcome.error and "is not public" in outcome.error
    assert received == []


def test_many_threads_share_one_caller(sink, received, caller):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(32) as pool:
        outcomes = list(pool.map(lambda _: caller.call(make_call(url(sink))), range(200)))
    assert [o for o in outcomes if o.status_code != 200] == []
    assert len(received) == 200


def test_a_payload_that_is_not_json_is_an_outcome_not_an_exception(caller):
    call = WebhookCall(JOB_ID, SCHEDULED_FOR, 1, {"url": "http://127.0.0.1:9/"}, {"x": object()}, SECRET)
    outcome = caller.call(call)
    assert outcome.error.startswith("cannot build the request") and not outcome.retryable_error


def _raw_sink(body_later: bool):
    """A keep-alive sink on a raw socket answering each request with `ok`: in one write
    with its header block, or (`body_later`) the body a moment after the headers.
    Returns (url, the peers of its connections, a stop function)."""
    listener = socket.create_server(("127.0.0.1", 0))
    peers: list = []
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            while not stop.is_set():
                try:
                    read_request(conn)
                    head = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n"
                    if body_later:
                        conn.sendall(head)
                        time.sleep(0.05)
                        conn.sendall(b"ok")
                    else:
                        conn.sendall(head + b"ok")
                except OSError:  # the caller closed the connection
                    return

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, peer = listener.accept()
            except OSError:
                return
            peers.append(peer)
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()

    def close() -> None:
        stop.set()
        listener.close()

    return f"http://127.0.0.1:{listener.getsockname()[1]}/hook", peers, close


@pytest.mark.parametrize("body_later", [False, True], ids=["body-with-headers", "body-later"])
def test_a_connection_is_reused_whether_or_not_the_body_came_with_the_status(caller, body_later):
    # A body already whole when the status is read is not read again; one still on its
    # way is read: either way the connection goes back to the pool.
    target, peers, close = _raw_sink(body_later)
    try:
        for _ in range(3):
            assert caller.call(make_call(target)).status_code == 200
        assert len(peers) == 1
    finally:
        close()
