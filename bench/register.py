"""Registering jobs through Punctual's HTTP API, as a client would, and how fast.

`POST /jobs/batch` ({"jobs": [...]}, up to 1,000 a request) when the server has it;
a server without it answers 404 or 405 to the first batch, and the jobs then go
one `POST /jobs` each from `clients` threads, each on its own keep-alive
connection. Every request carries an Idempotency-Key, so a request that failed on
the wire is sent again once without creating a job twice.
"""

from __future__ import annotations

import http.client
import json
import queue
import threading
import time
import uuid
from urllib.parse import urlsplit

BATCH_SIZE = 1000


def _connect(url: str) -> http.client.HTTPConnection:
    parts = urlsplit(url)
    return http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)


def _post(conn: http.client.HTTPConnection, path: str, headers: dict, body: bytes) -> tuple[int, bytes]:
    conn.request("POST", path, body=body, headers=headers)
    response = conn.getresponse()
    return response.status, response.read()


def _send(url: str, path: str, headers: dict, body: bytes, local: threading.local) -> tuple[int, bytes]:
    for attempt in (1, 2):
        conn = getattr(local, "conn", None) or _connect(url)
        local.conn = conn
        try:
            return _post(conn, path, headers, body)
        except (OSError, http.client.HTTPException):
            conn.close()
            local.conn = None
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def _batch_failures(status: int, answer: bytes, sent: int) -> int:
    """How many jobs of a batch were not created, from its answer."""
    if status >= 300:
        return sent
    try:
        data = json.loads(answer)
    except ValueError:
        return 0
    results = data.get("results", data.get("jobs")) if isinstance(data, dict) else data
    if not isinstance(results, list):
        return 0
    return sum(
        1
        for r in results
        if isinstance(r, dict) and (r.get("error") or r.get("problem") or int(r.get("status", 201)) >= 300)
    )


def register(url: str, api_key: str, bodies: list[dict], clients: int = 16) -> dict:
    """Create one job per body; returns the figures (jobs/s, failures, the way used)."""
    run = uuid.uuid4().hex[:8]
    auth = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}
    began = time.perf_counter()
    local = threading.local()
    failures: list[str] = []
    first = bodies[:BATCH_SIZE]
    status, answer = _send(
        url,
        "/jobs/batch",
        {**auth, "Idempotency-Key": f"bench-{run}-b0"},
        json.dumps({"jobs": first}).encode(),
        local,
    )
    way = "POST /jobs/batch" if status not in (404, 405) else f"POST /jobs from {clients} threads"
    work: queue.SimpleQueue = queue.SimpleQueue()
    if status in (404, 405):
        for i in range(len(bodies)):
            work.put(i)
    else:
        lost = _batch_failures(status, answer, len(first))
        failures += [f"batch HTTP {status}"] * lost
        for start in range(BATCH_SIZE, len(bodies), BATCH_SIZE):
            work.put(start)

    def client() -> None:
        mine = threading.local()
        while True:
            try:
                i = work.get_nowait()
            except queue.Empty:
                break
            try:
                if status in (404, 405):
                    got, text = _send(
                        url,
                        "/jobs",
                        {**auth, "Idempotency-Key": f"bench-{run}-{i}"},
                        json.dumps(bodies[i]).encode(),
                        mine,
                    )
                    if got != 201:
                        failures.append(f"HTTP {got}: {text[:200]!r}")
                else:
                    chunk = bodies[i : i + BATCH_SIZE]
                    got, text = _send(
                        url,
                        "/jobs/batch",
                        {**auth, "Idempotency-Key": f"bench-{run}-b{i}"},
                        json.dumps({"jobs": chunk}).encode(),
                        mine,
                    )
                    failures.extend([f"batch HTTP {got}"] * _batch_failures(got, text, len(chunk)))
            except (OSError, http.client.HTTPException) as exc:
                failures.append(type(exc).__name__)
        conn = getattr(mine, "conn", None)
        if conn is not None:
            conn.close()

    # Daemon threads, and the queue emptied on Ctrl-C: an interrupted bench unwinds at
    # once (its `with` blocks stop the processes) instead of finishing registration.
    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            thread.join()
    except KeyboardInterrupt:
        while not work.empty():
            work.get_nowait()
        raise
    elapsed = time.perf_counter() - began
    if getattr(local, "conn", None) is not None:
        local.conn.close()
    return {
        "way": way,
        "clients": clients,
        "jobs": len(bodies),
        "failures": len(failures),
        "failure_examples": sorted(set(failures))[:5],
        "elapsed_s": round(elapsed, 2),
        "jobs_per_s": round((len(bodies) - len(failures)) / elapsed, 1),
    }
