"""The Celery peer's app: plain Celery, one task that POSTs to the sink with requests.

    celery -A bench.celery_peer worker -P threads -c 64

Broker and sink come from BENCH_PEER_BROKER and BENCH_PEER_SINK (set by
`python -m bench.peers celery`). Nothing is tuned: Celery's defaults, a
requests.Session per pool thread (keep-alive, as a user would write it).
"""

from __future__ import annotations

import json
import os
import threading

import requests
from celery import Celery

app = Celery("bench_peer", broker=os.environ.get("BENCH_PEER_BROKER", "amqp://guest:guest@127.0.0.1:5672//"))
_local = threading.local()


def _session() -> requests.Session:
    if not hasattr(_local, "session"):
        _local.session = requests.Session()
    return _local.session


@app.task(name="bench.hook")
def hook(i: int) -> None:
    response = _session().post(
        f"{os.environ['BENCH_PEER_SINK']}/hook/{i}",
        data=json.dumps({"n": i}),
        headers={"Content-Type": "application/json", "Idempotency-Key": f"celery-{i}"},
        timeout=30,
    )
    response.raise_for_status()
