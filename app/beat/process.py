"""The beat process: it says what it schedules, shows that it is alive, and stops on SIGTERM.

- At start, one INFO line: what beat sends, how often, to how many shard queues.
- Every LIVENESS_S an INFO line with how many tasks it sent since the last one, so
  a log reader sees a beat that is alive, and one that stopped sending.
- PUNCTUAL_BEAT_ALIVE_FILE (optional): touched, at most once a second, each time
  the broker took a task from beat; a container health check reads its age, so a
  beat that runs but sends nothing (wedged on the broker) counts as unhealthy.
- SIGTERM / SIGINT: Celery's handler closes the scheduler (with its broker
  connection) and raises SystemExit. Closing an AMQP connection waits for the
  broker's close-ok and a confirmed publish waits for its ack; on a socket the
  broker no longer answers either blocks until TCP gives up, minutes later. Beat
  holds nothing worth that wait (the schedule is in memory; a poll not sent is sent
  by the next tick of any beat), so a watchdog ends the process STOP_GRACE_S after
  the first signal, whatever it is blocked in.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path

from celery import signals

from app.beat.schedule import sweep_interval_s
from app.settings import Settings
from app.tasks.routing import POLL_TASK, SWEEP_TASK

LIVENESS_S = 60.0
STOP_GRACE_S = 5.0
ALIVE_FILE_EVERY_S = 1.0

log = logging.getLogger("punctual.beat")


def schedule_summary(settings: Settings) -> str:
    last = f"shard-{settings.shards - 1:02d}"
    return (
        f"beat alive: sending {POLL_TASK} every {settings.poll_interval_s:g} s and {SWEEP_TASK} every "
        f"{sweep_interval_s(settings):g} s to each of {settings.shards} shard queues (shard-00..{last}) "
        f"that has work for it"
    )


class SentCounter:
    """Counts what beat handed to the broker, by task name, and touches the alive file."""

    def __init__(self, alive_file: Path | None):
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._alive_file = alive_file
        self._touched = 0.0

    def sent(self, task_name: str) -> None:
        with self._lock:
            self._counts[task_name] = self._counts.get(task_name, 0) + 1
        now = time.monotonic()
        if self._alive_file is not None and now - self._touched >= ALIVE_FILE_EVERY_S:
            self._touched = now
            touch(self._alive_file)

    def take(self) -> dict[str, int]:
        with self._lock:
            counts, self._counts = self._counts, {}
        return counts


def touch(path: Path) -> None:
    try:
        path.touch()
    except OSError as exc:  # a health check reading a stale file says enough; beat goes on
        log.warning("beat: cannot touch %s (%s)", path, exc)


def liveness_line(counts: dict[str, int], every_s: float) -> str:
    sent = ", ".join(f"{count} {name}" for name, count in sorted(counts.items())) or "nothing"
    return f"beat alive: sent {sent} in the last {every_s:g} s"


def _report_forever(counter: SentCounter, every_s: float) -> None:
    while True:
        time.sleep(every_s)
        counts = counter.take()
        log.info(liveness_line(counts, every_s), extra={"sent": counts})


def install_stop_watchdog(grace_s: float = STOP_GRACE_S) -> None:
    """Wrap the SIGTERM / SIGINT handlers in place: the first signal arms a timer that
    ends the process after `grace_s`, then Celery's own handler runs."""
    armed = threading.Event()

    def _force_exit() -> None:
        # Log from a thread of its own: if the main thread holds a logging lock while
        # it is blocked, the exit must not wait for it.
        note = threading.Thread(
            target=log.warning, daemon=True, args=("beat: still stopping after %g s; exiting now", grace_s)
        )
        note.start()
        note.join(0.5)
        os._exit(0)

    def _arm() -> None:
        if not armed.is_set():
            armed.set()
            timer = threading.Timer(grace_s, _force_exit)
            timer.daemon = True
            timer.start()

    for signum in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(signum)

        def _handler(num, frame, previous=previous):
            _arm()
            if callable(previous):
                previous(num, frame)
            else:
                raise SystemExit()

        signal.signal(signum, _handler)


def start(settings: Settings, alive_file: Path | None) -> SentCounter:
    """Everything above, for the beat process that calls it (from Celery's beat_init)."""
    install_stop_watchdog()
    counter = SentCounter(alive_file)

    def _published(sender=None, **_kw) -> None:
        counter.sent(str(sender))

    signals.after_task_publish.connect(_published, weak=False)
    log.info(schedule_summary(settings))
    if alive_file is not None:
        touch(alive_file)
    threading.Thread(
        target=_report_forever, args=(counter, LIVENESS_S), name="beat-liveness", daemon=True
    ).start()
    return counter
