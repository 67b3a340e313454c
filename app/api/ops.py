"""Operations, no API key needed: /healthz, /metrics, /openapi.json.

/healthz asks every physical DSN and the broker in parallel (bounded by
HEALTH_TIMEOUT_S) and answers per LOGICAL shard, so an operator sees which shards a
dead primary takes down, plus `broker`: with the broker down no job fires, so the
answer is 503 then too. /metrics is Prometheus text: the counters (app.metrics,
summed over the process group in multiprocess mode, app.metrics_endpoint) plus
registry gauges (jobs by state, dead letters, backlog and its age per shard), counted while the
tables are small and estimated from PostgreSQL's statistics once they are big
(app.registry.estimates), cached for GAUGE_TTL_S.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

import sqlalchemy as sa
from flask import Blueprint, Response, current_app
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

import app.metrics  # noqa: F401  (defines the process's counters in the default registry)
from app.api.openapi import document
from app.api.wire import json_response
from app.core.timefmt import utcnow
from app.metrics import REGISTRY_GAUGES
from app.metrics_endpoint import collecting_registry
from app.registry.engines import Registry
from app.services import jobs, runs
from app.settings import Settings

bp = Blueprint("ops", __name__)

HEALTH_TIMEOUT_S = 3.0
GAUGE_TTL_S = 10.0


@bp.get("/healthz")
def healthz():
    registry = current_app.extensions["punctual"].registry
    shards, broker = health(registry)
    ok = all(s["ok"] for s in shards) and broker["ok"]
    return json_response({"shards": shards, "broker": broker}, 200 if ok else 503)


def health(registry: Registry) -> tuple[list[dict], dict]:
    """([{"shard": s, "ok": bool}] for every logical shard, {"ok": bool} for the broker),
    failures with an `error`."""
    engines = registry.engines
    pool = ThreadPoolExecutor(max_workers=len(engines) + 1)
    futures = [pool.submit(_ping, engine) for engine in engines]
    broker_future = pool.submit(_ping_broker, registry.settings)
    wait([*futures, broker_future], timeout=HEALTH_TIMEOUT_S)
    pool.shutdown(wait=False)  # a hung DSN or broker must not hold the answer
    status = [_answer(future) for future in futures]
    broker_error = _answer(broker_future)
    broker = {"ok": broker_error is None, **({"error": broker_error} if broker_error else {})}
    try:
        routing = registry.routing()
    except Exception as exc:  # no map, no shard is served; the class says enough
        unread = [
            {"shard": shard, "ok": False, "error": f"shard map unreadable ({type(exc).__name__})"}
            for shard in range(registry.settings.shards)
        ]
        return unread, broker
    shards = []
    for shard in range(registry.settings.shards):
        error = status[routing.shard_index[shard]]
        entry: dict[str, Any] = {"shard": shard, "ok": error is None}
        if error is not None:
            entry["error"] = error
        shards.append(entry)
    return shards, broker


def _answer(future) -> str | None:
    return future.result() if future.done() else f"no answer within {HEALTH_TIMEOUT_S:g}s"


def _ping_broker(settings: Settings) -> str | None:
    from kombu import Connection

    url = settings.broker()
    if url.startswith("filesystem://"):
        return None  # the embedded broker (`punctual dev`) is folders on this machine
    try:
        with Connection(url, connect_timeout=HEALTH_TIMEOUT_S) as conn:
            conn.connect()
        return None
    except Exception as exc:  # any failure is "not ok"; the class says enough, the URL stays private
        return f"broker unreachable ({type(exc).__name__})"


def _ping(engine: sa.Engine) -> str | None:
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
        return None
    except Exception as exc:  # any failure is "not ok"; the class says enough, the DSN stays private
        return f"database unreachable ({type(exc).__name__})"


@bp.get("/metrics")
def metrics():
    gauges = current_app.extensions["punctual"].gauges
    text = generate_latest(collecting_registry()) + generate_latest(gauges.registry)
    return Response(
        text, mimetype="text/plain", headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
    )


@bp.get("/openapi.json")
def openapi():
    return json_response(document())


class RegistryGauges:
    """Jobs by state, dead letters and backlog per shard, read from every DSN at most every GAUGE_TTL_S."""

    def __init__(self, registry: Registry, ttl_s: float = GAUGE_TTL_S):
        self._source = registry
        self._ttl_s = ttl_s
        self._lock = threading.Lock()
        self._expires = 0.0
        self._values: tuple[dict[str, int], int, dict[int, tuple[int, float]]] | None = None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def _read(self) -> tuple[dict[str, int], int, dict[int, tuple[int, float]]] | None:
        with self._lock:
            if time.monotonic() >= self._expires:
                try:
                    self._values = (
                        jobs.count_by_state(self._source),
                        runs.count_dead(self._source),
                        jobs.backlog_by_shard(self._source, utcnow()),
                    )
                except sa.exc.SQLAlchemyError:
                    pass  # keep the last values; /healthz is where an outage shows
                self._expires = time.monotonic() + self._ttl_s
            return self._values

    def collect(self):
        values = self._read()
        if values is None:
            return
        by_state, dead, backlog = values
        family = GaugeMetricFamily("punctual_jobs", REGISTRY_GAUGES["punctual_jobs"], labels=["state"])
        for state, count in sorted(by_state.items()):
            family.add_metric([state], count)
        yield family
        yield GaugeMetricFamily(
            "punctual_dead_letter_runs", REGISTRY_GAUGES["punctual_dead_letter_runs"], value=dead
        )
        for name, pick in (("punctual_backlog_jobs", 0), ("punctual_backlog_age_seconds", 1)):
            family = GaugeMetricFamily(name, REGISTRY_GAUGES[name], labels=["shard"])
            for shard, counted in sorted(backlog.items()):
                family.add_metric([str(shard)], counted[pick])
            yield family
