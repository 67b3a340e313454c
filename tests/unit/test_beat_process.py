"""app.beat.process: what beat says about itself, and its alive file."""

from __future__ import annotations

import os
import time

from app.beat.process import SentCounter, liveness_line, schedule_summary
from app.settings import Settings


def test_the_start_line_says_what_beat_sends_how_often_and_where():
    settings = Settings.from_env(
        {"PUNCTUAL_SHARDS": "4", "PUNCTUAL_POLL_INTERVAL_S": "0.5", "PUNCTUAL_LEASE_S": "30"}
    )
    assert schedule_summary(settings) == (
        "beat alive: sending punctual.poll every 0.5 s and punctual.sweep every 10 s "
        "to each of 4 shard queues (shard-00..shard-03) that has work for it"
    )


def test_the_liveness_line_counts_what_was_sent_since_the_last_one():
    counter = SentCounter(None)
    for name in ["punctual.poll"] * 3 + ["punctual.sweep"]:
        counter.sent(name)
    assert liveness_line(counter.take(), 60) == (
        "beat alive: sent 3 punctual.poll, 1 punctual.sweep in the last 60 s"
    )
    assert liveness_line(counter.take(), 60) == "beat alive: sent nothing in the last 60 s"


def test_the_alive_file_is_touched_when_something_was_sent_at_most_once_a_second(tmp_path):
    alive = tmp_path / "beat.alive"
    counter = SentCounter(alive)
    assert not alive.exists()
    counter.sent("punctual.poll")
    assert alive.exists()
    os.utime(alive, (0, 0))
    counter.sent("punctual.poll")  # within a second of the last touch: not touched again
    assert alive.stat().st_mtime == 0
    counter._touched = time.monotonic() - 2
    counter.sent("punctual.poll")
    assert alive.stat().st_mtime > 0
