"""A webhook target that answers any bytes at all: the hostile targets of the fuzz tier.

Each path is given the raw answer to write (status line, headers and body exactly as
scripted, well-formed or not); the target reads the request, writes the answer, and
closes the connection, so no answer can keep a call waiting. A path without a script
gets a plain 200.
"""

from __future__ import annotations

import socket
import socketserver
import threading

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"


class RawTarget:
    def __init__(self) -> None:
        self._answers: dict[str, bytes] = {}
        self._lock = threading.Lock()
        target = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                conn: socket.socket = self.request
                conn.settimeout(10)
                try:
                    path = read_request(conn)
                    with target._lock:
                        answer = target._answers.get(path, OK)
                    conn.sendall(answer)
                    conn.shutdown(socket.SHUT_WR)
                except OSError:  # the worker gave up on the answer first: nothing to do
                    pass

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True
            request_queue_size = 256

        self._server = Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1})
        self._thread.daemon = True
        self._thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}{path}"

    def answer(self, path: str, raw: bytes) -> None:
        with self._lock:
            self._answers[path] = raw

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def read_request(conn: socket.socket) -> str:
    """Read one request (head and Content-Length body); its path (`/` once the peer
    has closed)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip() or 0)
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    parts = lines[0].split(" ")
    return parts[1] if len(parts) > 1 else "/"
