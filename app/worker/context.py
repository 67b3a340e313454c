"""A worker process's long-lived parts, made lazily after fork, one set per process.

The registry's engine pools, the owner directory (signing secrets, cached), the
limiter, the pooled HTTP session, the AMQP publisher for queue targets and the
dispatcher with its event loop must never cross a fork: a prefork child starts
with none (`reset_after_fork`) and builds its own on first use.
"""

from __future__ import annotations

import os
import threading
from functools import cached_property
from typing import TYPE_CHECKING

from app.registry.engines import Registry, registry_for
from app.services.owners import OwnerDirectory
from app.settings import Settings, get_settings

if TYPE_CHECKING:  # imported at run time only when each part is first made
    from app.limits.keys import LimitKeyDirectory
    from app.limits.limiter import Limiter
    from app.worker.engine import Dispatcher
    from app.worker.orphans import Roll
    from app.worker.queue_publisher import QueuePublisher
    from app.worker.webhook import WebhookCaller


class WorkerContext:
    """One process's parts, each made on first use; `pid` tells a forked child's
    inherited context from its own."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.pid = os.getpid()

    @cached_property
    def registry(self) -> Registry:
        return registry_for(self.settings)

    @cached_property
    def owners(self) -> OwnerDirectory:
        return OwnerDirectory(self.registry)

    @cached_property
    def limiter(self) -> Limiter:
        from app.limits import limiter_for

        return limiter_for(self.settings)

    @cached_property
    def limit_keys(self) -> LimitKeyDirectory:
        from app.limits.keys import LimitKeyDirectory

        return LimitKeyDirectory(self.registry)

    @cached_property
    def webhooks(self) -> WebhookCaller:
        from app.worker.webhook import WebhookCaller

        # A queue target's publish blocks, on one of the loop's threads: as many as calls.
        return WebhookCaller(
            allow_private=self.settings.private_target_policy, blocking_threads=self.settings.dispatch_threads
        )

    @cached_property
    def queues(self) -> QueuePublisher:
        from celery import current_app

        from app.worker.queue_publisher import QueuePublisher

        # The broker exactly as Celery reaches it: in `punctual dev` that is the
        # embedded transport under the data dir, not kombu's stock filesystem one.
        conf = current_app.conf
        return QueuePublisher(
            self.settings.broker(),
            transport=conf.broker_transport,
            transport_options=dict(conf.broker_transport_options or {}),
        )

    @cached_property
    def roll(self) -> Roll | None:
        """Started as the process starts: a restarted worker takes a dead one's runs
        before any message comes to it."""
        from app.worker.orphans import roll_for

        return roll_for(self.settings, lambda: self.registry)

    @cached_property
    def dispatcher(self) -> Dispatcher:
        from app.worker.engine import Dispatcher

        return Dispatcher(
            self.settings,
            self.registry,
            self.owners,
            self.limiter,
            self.limit_keys,
            self.webhooks,
            queues=lambda: self.queues,
            roll=self.roll,
        )

    def close(self, timeout_s: float = 30.0) -> None:
        if "dispatcher" in self.__dict__:
            self.dispatcher.close(timeout_s)
        roll = self.__dict__.get("roll")
        if roll is not None:
            roll.close()
        if "webhooks" in self.__dict__:
            self.webhooks.close()
        if "queues" in self.__dict__:
            self.queues.close()


_context: WorkerContext | None = None
_lock = threading.Lock()


def get_context() -> WorkerContext:
    """This process's context for the process's settings (rebuilt in a forked child)."""
    global _context
    with _lock:
        if _context is None or _context.pid != os.getpid():
            _context = WorkerContext(get_settings())
        return _context


def reset_after_fork() -> None:
    """In a fresh child: forget the parent's context and its connection pools."""
    global _context
    from app.registry import engines as registry

    _context = None
    for reg in list(registry._registries.values()):
        if "engines" in reg.__dict__:
            for engine in reg.engines:
                engine.dispose(close=False)
    registry._registries.clear()


def shutdown_context(timeout_s: float = 30.0) -> None:
    """Let calls in flight finish and their completions flush (worker shutdown)."""
    global _context
    with _lock:
        context, _context = _context, None
    if context is not None and context.pid == os.getpid():
        context.close(timeout_s)
