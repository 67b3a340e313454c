"""An asyncio event loop in a thread of its own: where a worker process makes its calls.

One loop a process carries every webhook call of that process: a call is a task on
it, not a thread blocked on a socket, so a hundred calls in flight do not mean a
hundred threads taking turns at the GIL (app.worker.webhook says what it saved).

The thread starts on first use, so a loop made before a fork (Celery's prefork pool)
is started anew in the child, where the parent's thread does not exist. Work that
blocks (a registry round trip, an AMQP publish) does not belong on the loop: it goes
to the loop's thread pool (`asyncio.to_thread`), which starts threads as needed, up
to `blocking_threads`.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    def __init__(self, name: str, blocking_threads: int = 32):
        self._name = name
        self._blocking_threads = blocking_threads
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._pid = 0

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The running loop of this process (started here on first use)."""
        loop = self._loop
        if loop is None or self._pid != os.getpid():
            loop = self._start()
        return loop

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Run `coro` on the loop; its result comes back through the Future (any thread)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call_soon(self, callback: Callable[..., Any], *args: Any) -> None:
        """Run `callback(*args)` on the loop's thread, soon (from any thread)."""
        self.loop.call_soon_threadsafe(callback, *args)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the loop (tasks still on it are dropped) and its thread pool."""
        with self._lock:
            loop, thread, executor = self._loop, self._thread, self._executor
            self._loop = self._thread = self._executor = None
        if loop is None or thread is None or self._pid != os.getpid():
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout_s)
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)

    def _start(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is not None and self._pid == os.getpid():
                return self._loop
            loop = asyncio.new_event_loop()
            executor = ThreadPoolExecutor(self._blocking_threads, thread_name_prefix=f"{self._name}-blocking")
            loop.set_default_executor(executor)
            ready = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                try:
                    loop.run_forever()
                finally:
                    loop.close()

            thread = threading.Thread(target=run, name=self._name, daemon=True)
            thread.start()
            ready.wait()
            self._loop, self._thread, self._executor, self._pid = loop, thread, executor, os.getpid()
            return loop
