"""Beat's gate (app.beat.gate): which ticks are sent, decided from what the registry
says of each shard's work; no I/O (the read is a function the test hands in)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from app.beat.gate import FAR_SHARE, IDLE_SWEEP_S, MAX_QUIET_S, Gate, idle_sweep_s, wants_poll, wants_sweep
from app.pollers.watch import ShardWork
from app.settings import Settings

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
AHEAD_S = 10.0


def at(seconds: float) -> datetime:
    return NOW + timedelta(seconds=seconds)


@pytest.mark.parametrize(
    ("work", "wanted"),
    [
        (None, True),  # unknown: sent, as without the gate
        (ShardWork(), False),
        (ShardWork(job_due=at(-5)), True),
        (ShardWork(job_due=at(0)), True),
        (ShardWork(job_due=at(AHEAD_S)), True),  # claimed ahead, as the poll would
        (ShardWork(job_due=at(AHEAD_S + 0.001)), False),
        (ShardWork(outbox_due=at(0)), True),
        (ShardWork(outbox_due=at(1)), False),
        (ShardWork(lease_ends=at(-1), finished=at(-(10**6))), False),  # a sweep's work, not a poll's
    ],
)
def test_a_poll_is_sent_only_for_work_it_does(work, wanted):
    assert wants_poll(work, NOW, AHEAD_S) is wanted


FAR_S = FAR_SHARE * AHEAD_S


@pytest.mark.parametrize(
    ("work", "since_s", "wanted"),
    [
        (ShardWork(job_due=at(0)), 0.0, True),  # due now: polled every interval
        (ShardWork(job_due=at(AHEAD_S - FAR_S)), 0.0, True),  # the near part
        (ShardWork(job_due=at(AHEAD_S - FAR_S + 0.001)), FAR_S - 0.001, False),  # far, polled lately
        (ShardWork(job_due=at(AHEAD_S)), FAR_S, True),  # far, not polled for a while
        (ShardWork(job_due=at(AHEAD_S + 0.001)), FAR_S, False),  # beyond the window
        (ShardWork(job_due=at(AHEAD_S), outbox_due=at(0)), 0.0, True),  # the relay's work
    ],
)
def test_a_job_in_the_windows_far_part_waits_for_a_poll_at_most_its_share(work, since_s, wanted):
    assert wants_poll(work, NOW, AHEAD_S, since_s) is wanted


def test_a_steady_shard_is_polled_every_far_share_and_a_first_due_row_at_once():
    """Each poll claims the window up to now + AHEAD_S; the next row is due just past
    it. A shard never polled is polled as soon as a row enters the window."""
    clock = Clock()
    claimed_to = [NOW - timedelta(seconds=1)]

    def read():
        now = NOW + timedelta(seconds=clock.t - 1000.0)
        first = max(claimed_to[0], now - timedelta(seconds=AHEAD_S))
        return {0: ShardWork(job_due=first + timedelta(seconds=0.01))}

    gate = Gate(Settings(database_urls=("sqlite://",), poll_interval_s=1.0), read, clock)
    sent = []
    for _ in range(20):
        now = NOW + timedelta(seconds=clock.t - 1000.0)
        if gate.poll(0, now):
            sent.append(clock.t - 1000.0)
            claimed_to[0] = now + timedelta(seconds=AHEAD_S)
        clock.t += 1.0
    assert sent == [0.0, 5.0, 10.0, 15.0]


@pytest.mark.parametrize(
    ("work", "since_s", "wanted"),
    [
        (None, 0.0, True),
        (ShardWork(), 0.0, False),
        (ShardWork(), IDLE_SWEEP_S, True),
        (ShardWork(job_due=at(-1), outbox_due=at(-1)), 0.0, False),  # a poll's work
        (ShardWork(lease_ends=at(0)), 0.0, True),
        (ShardWork(lease_ends=at(1)), 0.0, False),
        (ShardWork(finished=NOW - timedelta(days=30, seconds=1)), 0.0, True),
        (ShardWork(finished=NOW - timedelta(days=29)), 0.0, False),
    ],
)
def test_a_sweep_is_sent_for_expired_leases_old_history_or_after_a_while(work, since_s, wanted):
    assert wants_sweep(work, NOW, since_s, history_days=30) is wanted


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_one_read_serves_a_round_and_a_new_interval_reads_again():
    reads: list[float] = []
    works = {0: ShardWork(), 1: ShardWork(job_due=NOW)}
    clock = Clock()

    def read():
        reads.append(clock.t)
        return works

    gate = Gate(Settings(database_urls=("sqlite://",), poll_interval_s=1.0), read, clock)
    assert [gate.poll(s, NOW) for s in (0, 1)] == [False, True]
    assert len(reads) == 1
    clock.t += 1.0
    works = {0: ShardWork(job_due=NOW), 1: ShardWork()}
    assert [gate.poll(s, NOW) for s in (0, 1)] == [True, False]
    assert len(reads) == 2


def test_a_shard_the_read_does_not_cover_is_polled():
    gate = Gate(Settings(database_urls=("sqlite://",)), lambda: {0: ShardWork()}, Clock())
    assert gate.poll(1, NOW) and gate.sweep(1, NOW)
    assert not gate.poll(0, NOW)


def test_a_failed_read_sends_every_tick_until_one_succeeds():
    clock = Clock()
    answers: list = [RuntimeError("down"), {0: ShardWork()}]

    def read():
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    gate = Gate(Settings(database_urls=("sqlite://",), poll_interval_s=1.0), read, clock)
    assert gate.poll(0, NOW)
    clock.t += 1.0
    assert not gate.poll(0, NOW)


def test_an_idle_shard_is_swept_once_per_idle_period():
    clock = Clock()
    gate = Gate(Settings(database_urls=("sqlite://",), poll_interval_s=1.0), lambda: {0: ShardWork()}, clock)
    sent = []
    for _ in range(int(3 * idle_sweep_s(16))):
        sent.append(gate.sweep(0, NOW))
        clock.t += 1.0
    assert sent.count(True) == 3
    assert sent[0]  # the first sweep after start


def test_a_sweep_takes_the_last_read_and_a_poll_reads_again():
    clock = Clock()
    reads: list[float] = []

    def read():
        reads.append(clock.t)
        return {0: ShardWork()}

    gate = Gate(Settings(database_urls=("sqlite://",), poll_interval_s=1.0), read, clock)
    gate.sweep(0, NOW)  # nothing read yet: reads
    clock.t += 5.0
    gate.sweep(0, NOW)
    assert len(reads) == 1
    gate.poll(0, NOW)
    assert len(reads) == 2


class Rounds:
    """A GatedScheduler over 4 shards (polls every 1 s, sweeps every 5 s) whose sends
    are recorded and whose gate reads `work`."""

    def __init__(self, work: dict[int, ShardWork]):
        from celery import Celery

        from app.beat.scheduler import GatedScheduler

        app = Celery("gate-test", set_as_current=False)
        schedule = {}
        for shard in range(4):
            for task, every in (("punctual.poll", 1.0), ("punctual.sweep", 5.0)):
                kind = task.split(".")[1]
                schedule[f"{kind}-shard-{shard:02d}"] = {
                    "task": task,
                    "schedule": timedelta(seconds=every),
                    "kwargs": {"shard": shard},
                }
        app.conf.beat_schedule = schedule
        self.sent: list[str] = []
        self.clock = Clock()
        recording = self
        settings = Settings(database_urls=("sqlite://",), poll_interval_s=1.0, shards=4)

        class Recorded(GatedScheduler):
            def apply_async(self, entry, producer=None, advance=True, **kwargs):
                recording.sent.append(entry.name)

            def _make_gate(self):
                self._gate = Gate(settings, lambda: work, recording.clock)
                return self._gate

        self.scheduler = Recorded(app, max_interval=0.5, lazy=False)
        self.scheduler.producer = None
        self.rounds = self.scheduler._make_rounds()

    def round(self, at: float) -> list[str]:
        self.clock.t = at
        self.sent.clear()
        self.scheduler._round(self.rounds, at)
        return sorted(self.sent)


def test_a_round_polls_only_shards_with_work_and_sweeps_on_the_sweep_interval():
    rounds = Rounds({0: ShardWork(), 1: ShardWork(job_due=NOW), 2: ShardWork(lease_ends=NOW), 3: ShardWork()})
    first = rounds.round(1000.0)
    assert [name for name in first if name.startswith("poll")] == ["poll-shard-01"]
    # Shard 0's idle turn comes first; shard 2's lease passed.
    assert [name for name in first if name.startswith("sweep")] == ["sweep-shard-00", "sweep-shard-02"]
    assert rounds.round(1001.0) == ["poll-shard-01"]
    assert rounds.round(1005.0) == ["poll-shard-01", "sweep-shard-02"]  # only the expired lease


def test_a_tick_before_the_next_round_sends_nothing_and_says_how_long_to_wait():
    rounds = Rounds({s: ShardWork(job_due=NOW) for s in range(4)})
    rounds.scheduler._rounds = rounds.rounds
    rounds.rounds.next_at = float("inf")
    assert rounds.scheduler.tick() == 0.5  # max_interval
    assert rounds.sent == []


def test_idle_sweeps_take_turns_so_beat_sends_a_task_every_few_seconds():
    clock = Clock()
    settings = Settings(database_urls=("sqlite://",), poll_interval_s=1.0, shards=4)
    gate = Gate(settings, lambda: {s: ShardWork() for s in range(4)}, clock)
    swept: list[tuple[float, int]] = []
    for _ in range(int(2 * idle_sweep_s(4))):
        swept += [(clock.t - 1000.0, s) for s in range(4) if gate.sweep(s, NOW)]
        clock.t += 1.0
    assert [s for _, s in swept] == [0, 1, 2, 3] * 2
    gaps = [b - a for (a, _), (b, _) in zip(swept, swept[1:], strict=False)]
    assert max(gaps) <= idle_sweep_s(4) / 4


@pytest.mark.parametrize("shards", [1, 2, 4, 16, 64])
def test_beat_sends_a_sweep_at_least_every_max_quiet_s_whatever_the_shard_count(shards):
    clock = Clock()
    settings = Settings(database_urls=("sqlite://",), poll_interval_s=1.0, shards=shards)
    gate = Gate(settings, lambda: {s: ShardWork() for s in range(shards)}, clock)
    sent_at = []
    for _ in range(int(3 * IDLE_SWEEP_S)):
        if any([gate.sweep(s, NOW) for s in range(shards)]):
            sent_at.append(clock.t)
        clock.t += 1.0
    assert sent_at[0] == 1000.0
    assert max(b - a for a, b in zip(sent_at, sent_at[1:], strict=False)) <= MAX_QUIET_S
