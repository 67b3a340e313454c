"""A cheap webhook target for benchmarks: asyncio, HTTP/1.1 keep-alive, 200 to all.

It runs in its own process (so it does not share a GIL with anything measured) and
counts requests in shared memory. It parses only what it must (the header block and
Content-Length): the point is to measure Punctual, not an HTTP server; a real
target behind a load balancer costs the scheduler the same calls.
"""
from __future__ import annotations

import asyncio
import multiprocessing
import socket
import time

_ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"


def _header(head: bytes, name: bytes) -> bytes:
    at = head.find(name)
    if at < 0:
        return b""
    end = head.find(b"\r\n", at)
    return head[at + len(name): end if end >= 0 else None].strip()


class _Protocol(asyncio.Protocol):
    def __init__(self, counter, records: list | None = None):
        self.counter = counter
        self.records = records  # (arrival time, Idempotency-Key) per call, when recording
        self.buffer = b""

    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        answers = 0
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                break
            head = self.buffer[:end].lower()
            length = 0
            at = head.find(b"content-length:")
            if at >= 0:
                line_end = head.find(b"\r\n", at)
                length = int(head[at + 15: line_end if line_end >= 0 else None])
            total = end + 4 + length
            if len(self.buffer) < total:
                break
            self.buffer = self.buffer[total:]
            answers += 1
            if self.records is not None:
                self.records.append((time.time(), _header(head, b"idempotency-key:")))
        if answers:
            self.transport.write(_ANSWER * answers)
            with self.counter.get_lock():
                self.counter.value += answers


def _serve(port_value, counter, ready, control) -> None:
    records: list | None = [] if control is not None else None

    def answer_control() -> None:  # the parent asks for the arrivals: send them, start afresh
        control.recv()
        control.send(records)
        records.clear()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _Protocol(counter, records), "127.0.0.1", 0, backlog=4096)
        if control is not None:
            loop.add_reader(control.fileno(), answer_control)
        port_value.value = server.sockets[0].getsockname()[1]
        ready.set()
        await asyncio.Event().wait()

    asyncio.run(main())


class FastSink:
    """`record=True` keeps (arrival time, Idempotency-Key) of every call; `arrivals()`
    hands them over (and starts a fresh list): the burst bench counts duplicates and
    missing runs, and lateness as the target saw it, from them."""

    def __init__(self, record: bool = False):
        ctx = multiprocessing.get_context("fork")  # made before any thread or connection
        self._port = ctx.Value("i", 0)
        self._count = ctx.Value("q", 0)
        ready = ctx.Event()
        self._control, child_end = ctx.Pipe() if record else (None, None)
        self._process = ctx.Process(target=_serve, args=(self._port, self._count, ready, child_end), daemon=True)
        self._process.start()
        if not ready.wait(10):
            raise RuntimeError("the bench sink did not start")

    @property
    def pid(self) -> int:
        return self._process.pid

    def arrivals(self) -> list[tuple[float, bytes]]:
        if self._control is None:
            raise RuntimeError("the sink was not started with record=True")
        # Records are appended after the counter is bumped in the same callback, so
        # once the count is reached every record is there too.
        self._control.send("dump")
        return self._control.recv()

    @property
    def count(self) -> int:
        return self._count.value

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self._port.value}{path}"

    def wait_for(self, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.count < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.count} of {count} calls in {timeout_s}s")
            time.sleep(0.01)

    def close(self) -> None:
        self._process.kill()
        self._process.join(5)
