"""The embedded broker (app.devserver.broker): folders, whole messages, one taker each.

Real kombu connections on the transport, in a temp dir; no external service.
"""

from __future__ import annotations

import os
import threading
from datetime import UTC

import pytest
from kombu import Connection, Exchange, Queue

from app.devserver.broker import TAKEN, TRANSPORT


@pytest.fixture
def folders(tmp_path):
    return {
        "data_folder_in": str(tmp_path / "queue"),
        "data_folder_out": str(tmp_path / "queue"),
        "control_folder": str(tmp_path / "control"),
        "polling_interval": 0.01,
    }


def _connection(folders) -> Connection:
    return Connection("filesystem://", transport=TRANSPORT, transport_options=folders)


QUEUE = Queue("shard-03", Exchange("shard-03", type="direct"), routing_key="shard-03")


def test_folders_are_made_and_a_message_goes_through(folders, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with _connection(folders) as conn:
        conn.Producer().publish({"n": 1}, exchange=QUEUE.exchange, routing_key="shard-03", declare=[QUEUE])
        message = QUEUE(conn.default_channel).get()
        assert message.payload == {"n": 1}
        message.ack()
        assert QUEUE(conn.default_channel).get() is None
    assert sorted(os.listdir(tmp_path)) == ["control", "queue"]  # nothing in the cwd (kombu's ./control)
    assert os.listdir(tmp_path / "queue") == [TAKEN]


def test_a_message_being_written_is_invisible(folders):
    with _connection(folders) as conn:
        QUEUE(conn.default_channel).declare()
        # What a publisher's temporary file looks like mid-write: hidden, not `<stem>.<queue>.msg`.
        with open(os.path.join(folders["data_folder_in"], ".4f2a.part"), "wb") as partial:
            partial.write(b'{"body": ')
        assert QUEUE(conn.default_channel).get() is None


def test_two_consumers_never_take_the_same_message(folders):
    with _connection(folders) as conn:
        producer = conn.Producer()
        for n in range(300):
            producer.publish({"n": n}, exchange=QUEUE.exchange, routing_key="shard-03", declare=[QUEUE])
    taken: list[list[int]] = [[], []]

    def consume(into: list[int]) -> None:
        with _connection(folders) as own:
            while (message := QUEUE(own.default_channel).get()) is not None:
                into.append(message.payload["n"])
                message.ack()

    threads = [threading.Thread(target=consume, args=(bucket,)) for bucket in taken]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(taken[0] + taken[1]) == list(range(300))


def test_messages_come_out_oldest_first(folders):
    with _connection(folders) as conn:
        producer = conn.Producer()
        for n in range(5):
            producer.publish({"n": n}, exchange=QUEUE.exchange, routing_key="shard-03", declare=[QUEUE])
            threading.Event().wait(0.002)  # file names carry milliseconds
        got = []
        while (message := QUEUE(conn.default_channel).get()) is not None:
            got.append(message.payload["n"])
            message.ack()
    assert got == list(range(5))


def test_a_queue_target_published_on_the_embedded_broker_reaches_a_bound_queue(folders):
    from datetime import datetime

    from app.worker.queue_publisher import EXCHANGE, QueueCall, QueuePublisher

    reports = Queue("reports", EXCHANGE, routing_key="reports.*")
    with _connection(folders) as conn:
        reports(conn.default_channel).declare()
    publisher = QueuePublisher("filesystem://", transport=TRANSPORT, transport_options=folders)
    try:
        scheduled_for = datetime(2026, 12, 1, tzinfo=UTC)
        outcome = publisher.publish(QueueCall("job-1", scheduled_for, 1, "reports.daily", {"n": 7}, "secret"))
        assert outcome.succeeded, outcome
    finally:
        publisher.close()
    with _connection(folders) as conn:
        message = reports(conn.default_channel).get()
        assert message is not None and message.headers["Idempotency-Key"] == "job-1:2026-12-01T00:00:00Z"
        assert message.body in (b'{"n":7}', '{"n":7}')
