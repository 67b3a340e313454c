"""Beat's scheduler sleeps until an entry is due and sends it then: no spin before it.

The loop is Celery's beat service loop (tick, then sleep what it said if positive);
the broker is left out: the scheduler's `apply_async` records what would be sent.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

import pytest
from celery import Celery
from celery.beat import Scheduler

from app.beat.scheduler import TickScheduler


class Recording:
    """A scheduler class's sends recorded, and the ticks that returned at once without one."""

    def __init__(self, scheduler_class: type[Scheduler], every_s: float):
        app = Celery("beat-test", set_as_current=False)
        app.conf.beat_schedule = {
            f"poll-shard-{shard:02d}": {"task": "punctual.poll", "schedule": timedelta(seconds=every_s)}
            for shard in range(4)
        }
        self.sent: list[str] = []
        recording = self

        class Recorded(scheduler_class):  # type: ignore[misc, valid-type]
            def apply_async(self, entry, producer=None, advance=True, **kwargs):
                recording.sent.append(entry.name)

        self.scheduler = Recorded(app, max_interval=0.5, lazy=False)
        self.scheduler.producer = None  # nothing is published
        self.idle_ticks = 0  # ticks that asked to be called again at once but sent nothing

    def run(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            before = len(self.sent)
            interval = self.scheduler.tick()
            if interval and interval > 0:
                time.sleep(min(interval, max(0.0, deadline - time.monotonic())))
            elif len(self.sent) == before:
                self.idle_ticks += 1


def test_each_entry_is_sent_when_due_without_spinning_before_it():
    recording = Recording(TickScheduler, every_s=0.2)
    recording.run(1.1)
    # Sent at once (due at start), then every 0.2 s: 5 or 6 times each in 1.1 s.
    for shard in range(4):
        assert 5 <= recording.sent.count(f"poll-shard-{shard:02d}") <= 6, recording.sent
    # Celery's scheduler wakes 10 ms early and spins until the entry is due: hundreds
    # of ticks that send nothing. This one wakes when the entry is due; a tick may
    # come back at once without a send only when another entry is due with it.
    assert recording.idle_ticks <= len(recording.sent)


def test_celerys_own_scheduler_spins_which_is_what_this_one_avoids():
    recording = Recording(Scheduler, every_s=0.2)
    recording.run(1.1)
    assert recording.idle_ticks > 10 * len(recording.sent)


def test_sending_a_due_task_is_logged_at_debug_not_info(caplog: pytest.LogCaptureFixture):
    recording = Recording(TickScheduler, every_s=0.02)
    with caplog.at_level(logging.INFO):
        recording.run(0.1)
    assert recording.sent and not [r for r in caplog.records if "due task" in r.getMessage()]
    with caplog.at_level(logging.DEBUG, logger="punctual.beat"):
        recording.scheduler.apply_entry(next(iter(recording.scheduler.schedule.values())))
    assert any("sending due task poll-shard-" in r.getMessage() for r in caplog.records)


def test_an_entry_that_cannot_be_sent_is_logged_and_beat_goes_on(caplog: pytest.LogCaptureFixture):
    class Failing(TickScheduler):
        def apply_async(self, entry, producer=None, advance=True, **kwargs):
            raise ConnectionError("broker gone")

    app = Celery("beat-test", set_as_current=False)
    app.conf.beat_schedule = {"poll-shard-00": {"task": "punctual.poll", "schedule": timedelta(seconds=0.02)}}
    scheduler = Failing(app, max_interval=0.5)
    scheduler.producer = None
    with caplog.at_level(logging.ERROR):
        time.sleep(scheduler.tick())  # until it is due
        assert scheduler.tick() == 0  # sent (and failed), and due again in 0.02 s
        assert 0 < scheduler.tick() <= 0.02
    assert any("sending poll-shard-00 (punctual.poll) failed" in r.getMessage() for r in caplog.records)
