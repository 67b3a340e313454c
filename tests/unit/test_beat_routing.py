"""The beat schedule, queue routing and Celery configuration (pure, no broker)."""

from __future__ import annotations

import importlib
from datetime import timedelta

from app.beat.schedule import beat_schedule, sweep_interval_s
from app.settings import Settings
from app.tasks.routing import DISPATCH_TASK, POLL_TASK, SWEEP_TASK, route_task, shard_queues


def settings(**env) -> Settings:
    return Settings.from_env({"PUNCTUAL_DATABASE_URLS": "postgresql://u@h/db", **env})


def test_one_queue_per_logical_shard():
    assert shard_queues(settings()) == [f"shard-{s:02d}" for s in range(16)]
    assert shard_queues(settings(PUNCTUAL_SHARDS="4")) == ["shard-00", "shard-01", "shard-02", "shard-03"]


def test_a_poll_per_shard_every_poll_interval_on_its_queue():
    schedule = beat_schedule(settings(PUNCTUAL_POLL_INTERVAL_S="0.25"))
    polls = {k: v for k, v in schedule.items() if v["task"] == POLL_TASK}
    assert len(polls) == 16
    entry = polls["poll-shard-07"]
    assert entry["schedule"] == timedelta(seconds=0.25)
    assert entry["kwargs"] == {"shard": 7} and entry["options"]["queue"] == "shard-07"
    assert entry["options"]["expires"] >= 2  # a stale poll is dropped, a later tick does its work


def test_the_janitor_sweeps_on_a_slower_beat():
    s = settings(PUNCTUAL_POLL_INTERVAL_S="0.25", PUNCTUAL_LEASE_S="3", PUNCTUAL_HEARTBEAT_S="1")
    sweeps = [v for v in beat_schedule(s).values() if v["task"] == SWEEP_TASK]
    assert len(sweeps) == 16 and all(v["schedule"] == timedelta(seconds=1) for v in sweeps)
    assert sweep_interval_s(settings()) == 20 / 3  # the default 20 s lease: every 6.7 s
    assert sweep_interval_s(settings(PUNCTUAL_LEASE_S="60")) == 15.0  # a 60 s lease: every 15 s
    assert sweep_interval_s(settings(PUNCTUAL_POLL_INTERVAL_S="30")) == 30.0  # never faster than polls


def test_tasks_route_to_the_queue_of_their_shard():
    for name in (POLL_TASK, SWEEP_TASK, DISPATCH_TASK):
        assert route_task(name, (), {"shard": 11, "runs": []}, {}) == {"queue": "shard-11"}
    assert route_task("other.task", (), {"shard": 1}, {}) is None


def test_celeryconfig_is_json_only_with_deliberate_acks_and_no_retries(monkeypatch):
    monkeypatch.setenv("PUNCTUAL_DATABASE_URLS", "postgresql://u@h/db")
    monkeypatch.setenv("PUNCTUAL_BROKER_URL", "amqp://guest@localhost//")
    monkeypatch.setenv("PUNCTUAL_SHARDS", "8")
    from app import settings as settings_module

    settings_module.use_settings(None)
    try:
        import celeryconfig

        config = importlib.reload(celeryconfig)
    finally:
        settings_module.use_settings(None)
    assert config.task_serializer == "json" and config.accept_content == ["json"]
    assert config.result_serializer == "json" and config.event_serializer == "json"
    assert config.task_acks_late is True and config.worker_prefetch_multiplier == 1
    assert config.task_annotations == {"*": {"max_retries": 0}}
    assert [q.name for q in config.task_queues] == [f"shard-{s:02d}" for s in range(8)]
    assert config.broker_transport_options == {"confirm_publish": True}
    assert len([k for k in config.beat_schedule if k.startswith("poll-")]) == 8


def test_no_punctual_task_retries_through_celery():
    from app.tasks import dispatch, shard

    for task in (dispatch.dispatch, shard.poll, shard.sweep):
        assert not getattr(task, "autoretry_for", ()) and task.max_retries == 0
