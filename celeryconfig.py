"""Celery configuration for Punctual, read by app/celery.py.

Everything comes from the PUNCTUAL_* environment (Settings.from_env), read once.
The choices below are deliberate; each says why.
"""

import os

from kombu import Exchange, Queue

from app.beat.schedule import beat_schedule as _beat_schedule
from app.settings import get_settings
from app.tasks.routing import route_task, shard_queues

_settings = get_settings()

broker_url = _settings.broker()
if broker_url == "filesystem://":
    # Embedded mode (`punctual dev`): folders under the data dir stand in for the
    # broker. app.devserver.broker says why this transport, and why kombu's own
    # filesystem channel is replaced by one that writes and takes files atomically.
    from app.devserver.broker import TRANSPORT as broker_transport  # noqa: F401  (a Celery setting)

    _broker_dir = (_settings.data_dir / "broker").resolve()
    broker_transport_options = {
        "data_folder_in": str(_broker_dir / "queue"),
        "data_folder_out": str(_broker_dir / "queue"),
        # Exchange bindings; kombu's default is ./control in each process's own cwd.
        "control_folder": str(_broker_dir / "control"),
        # A consumer sleeps this long when no queue has a message or its prefetch is
        # full; kombu's 1 s would add a second per hop and fall behind 16 shards' polls.
        "polling_interval": 0.1,
    }
else:
    # Publisher confirms: a dispatch message counts as published (and its runs are
    # marked so) only once RabbitMQ has taken responsibility for it. Without a
    # confirm a crash could lose it, and the relay sweep would have to wait for it.
    # (visibility_timeout is not set: it only exists for Redis/SQS brokers; on
    # RabbitMQ an unacked message comes back when its consumer's channel closes.)
    broker_transport_options = {"confirm_publish": True}
broker_connection_retry_on_startup = True
# AMQP heartbeats every 10 s: RabbitMQ closes the connection of a worker it has not
# heard from for two of them (a partition, a frozen host) and hands the messages that
# worker held unacknowledged to another one within ~20 s, instead of after the
# default 120 s heartbeat's 4 minutes. Beats come from the worker's main process,
# which does no calls, so a busy worker still sends them.
broker_heartbeat = 10

# JSON only: nothing on the broker is code, and every message is readable by hand.
task_serializer = "json"
result_serializer = "json"
event_serializer = "json"
accept_content = ["json"]
result_accept_content = ["json"]
enable_utc = True
timezone = "UTC"

# No result backend: outcomes go to the registry, which is the only place of record.
task_ignore_result = True
task_store_errors_even_if_ignored = False

# Retries happen in exactly one layer, the registry (invariant 3). No task sets
# autoretry_for, and a task that raises is not retried by Celery.
task_default_retry_delay = 0
task_annotations = {"*": {"max_retries": 0}}

# Queues: one per logical shard, shard-00 .. shard-NN. `celery -A app worker -Q
# shard-07` serves shard 7; poll, sweep and dispatch of a shard share its queue, so
# a shard's work goes wherever its queue is consumed.
task_queues = [
    Queue(name, Exchange(name, type="direct"), routing_key=name, durable=True)
    for name in shard_queues(_settings)
]
task_default_queue = "shard-00"
task_routes = (route_task,)
task_create_missing_queues = False

# Acknowledgement. A dispatch task returns once its runs are *started* (the fenced
# claimed -> running UPDATE) and handed to the process's event loop; it does not
# wait for the calls. So acks_late acknowledges exactly when the message has done
# its job: a crash before that redelivers it, and the redelivery is harmless because
# starting is fenced (a run already started is skipped). After the start, recovery
# belongs to the lease and the janitor, not to the broker.
task_acks_late = True
# A child killed mid-task (OOM, SIGKILL) puts the message back for the same reason:
# a fenced start makes redelivery cost only work.
task_reject_on_worker_lost = True
# (A task that raised is acknowledged, Celery's default: its runs come back through
# their leases, and a poison message must not loop.)

# Prefetch 1: a process takes its next message only when it is free, so a burst's
# dispatch messages spread over every process and every worker instead of queueing
# behind one busy process (each message already carries up to ~100 runs).
worker_prefetch_multiplier = 1
# Messages with an eta (runs claimed ahead, app.lifecycle.message) are the exception:
# the worker keeps each one, unacknowledged, until its instant (Celery raises the
# prefetch count by one for each, so they do not block other work), and if the
# worker dies RabbitMQ hands them to another, which waits for the same instant.

# The pool: prefork. Each process runs up to PUNCTUAL_DISPATCH_THREADS calls at once
# on its own event loop (app/worker/engine.py), so hundreds of calls are in flight per
# process while the Celery task itself only starts runs and returns; prefork spreads
# the Python work (HTTP, JSON, HMAC) over the cores, which one threaded process under
# the GIL cannot. One process more than cores: a process is GIL-bound but also waits
# on database and broker round trips, and the extra one keeps the cores busy.
# `-c N` on the command line overrides it.
worker_pool = "prefork"
worker_concurrency = (os.cpu_count() or 1) + 1
# Keep the processes: their event loops and pooled HTTP connections are the point.
worker_max_tasks_per_child = None
worker_hijack_root_logger = False
worker_send_task_events = False
task_send_sent_event = False

# Beat: in-memory schedule (no celerybeat-schedule file), so several beats can run
# side by side and a restarted beat starts fresh; a missed tick is harmless because
# a poll claims everything due, however late.
beat_scheduler = "app.beat.scheduler:GatedScheduler"
beat_schedule = _beat_schedule(_settings)
beat_max_loop_interval = max(0.05, min(1.0, _settings.poll_interval_s / 2))

imports = ("app.tasks.shard", "app.tasks.dispatch")
