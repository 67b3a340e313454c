"""A TCP proxy on 127.0.0.1 that can freeze: a broker that stops answering, made on demand.

While it forwards, a client behind it talks to the real server. `freeze()` stops
forwarding in both directions but keeps every socket open, as a peer behind a
dead network path or a stalled broker does: the client's reads then block, with
no error and no FIN. Used to test what a process does when its broker goes quiet,
without touching the shared RabbitMQ.
"""

from __future__ import annotations

import socket
import threading


class FreezingProxy:
    def __init__(self, upstream: tuple[str, int]):
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._frozen = threading.Event()
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self.forwarded_bytes = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def freeze(self) -> None:
        self._frozen.set()

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                try:
                    sock.close()
                except OSError:
                    pass

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._sockets += [client, server]
            threading.Thread(target=self._pipe, args=(client, server), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        while not self._closed.is_set():
            try:
                data = source.recv(65536)
            except OSError:
                return
            if not data:
                return
            if self._frozen.is_set():
                continue  # swallowed: the peer never hears of it, and never hears a close
            try:
                sink.sendall(data)
            except OSError:
                return
            with self._lock:
                self.forwarded_bytes += len(data)
