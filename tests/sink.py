"""A local HTTP sink: the webhook target of integration, end-to-end and bench runs.

It listens on 127.0.0.1 (so workers need PUNCTUAL_ALLOW_PRIVATE_TARGETS=1), keeps
connections alive (HTTP/1.1, as a real target behind a load balancer would), records
every request, and answers each path from a script: a list of answers used in
turn, the last one repeated (`script("/j", [Answer(500), Answer(200)])`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class Answer:
    status: int = 200
    delay_s: float = 0.0
    headers: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Received:
    path: str
    method: str
    headers: dict
    body: bytes
    at: float  # time.time()

    def header(self, name: str) -> str | None:
        for key, value in self.headers.items():
            if key.lower() == name.lower():
                return value
        return None


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # a burst of new connections must not be refused


class Sink:
    def __init__(self, record: bool | Callable[[str], bool] = True):
        """`record`: whether requests are kept (every one is counted), or which paths'."""
        self.record = record
        self.received: list[Received] = []
        self.count = 0
        self._scripts: dict[str, list[Answer]] = {}
        self._cond = threading.Condition()
        self.release = threading.Event()  # answers with delay_s < 0 wait for this
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # small answers must not wait for the client's delayed ACK

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                answer = sink._answer(self.path)
                sink._record(Received(self.path, self.command, dict(self.headers), body, time.time()))
                if answer.delay_s < 0:
                    sink.release.wait(60)
                elif answer.delay_s:
                    time.sleep(answer.delay_s)
                self.send_response_only(answer.status)
                for key, value in answer.headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", "2")
                self._headers_buffer.append(b"\r\nok")  # one write: status, headers and body
                self.flush_headers()

            do_POST = do_PUT = do_GET = do_DELETE = do_PATCH = _handle

            def log_message(self, *args) -> None:  # quiet
                pass

        self.server = _Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True
        )
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def url(self, path: str) -> str:
        return self.base_url + path

    def script(self, path: str, answers: list[Answer]) -> None:
        with self._cond:
            self._scripts[path] = list(answers)

    def _answer(self, path: str) -> Answer:
        with self._cond:
            answers = self._scripts.get(path)
            if not answers:
                return Answer()
            return answers.pop(0) if len(answers) > 1 else answers[0]

    def _record(self, received: Received) -> None:
        with self._cond:
            self.count += 1
            if self.record is True or (callable(self.record) and self.record(received.path)):
                self.received.append(received)
            self._cond.notify_all()

    def calls(self, path: str | None = None) -> list[Received]:
        with self._cond:
            return [r for r in self.received if path is None or r.path == path]

    def wait_for(self, count: int, path: str | None = None, timeout_s: float = 30.0) -> list[Received]:
        """Wait until at least `count` requests (to `path`) arrived; returns them."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                found = [r for r in self.received if path is None or r.path == path] if self.record else []
                have = len(found) if self.record else self.count
                if have >= count:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{have} of {count} requests to {path or 'the sink'} in {timeout_s}s")
                self._cond.wait(min(left, 0.5))

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
