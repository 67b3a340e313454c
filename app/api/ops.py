"""Operations, no API key needed: /healthz, /metrics, /openapi.json.

/healthz asks every physical DSN in parallel (bounded by HEALTH_TIMEOUT_S) and
answers per LOGICAL shard, so an operator sees which shards a dead primary takes
down. /metrics is Prometheus text: this process's counters (app.metrics) plus
registry gauges (jobs by state, dead letters) that cost a count over every DSN,
so they are cached for GAUGE_TTL_S.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

import sqlalchemy as sa
from flask import Blueprint, Response, current_app
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

import app.metrics  # noqa: F401  (defines the process's counters in the default registry)
from app.api.openapi import document
from app.api.wire import json_response
from app.registry.engines import Registry
from app.services import jobs, runs

bp = Blueprint("ops", __name__)

HEALTH_TIMEOUT_S = 3.0
GAUGE_TTL_S = 10.0


@bp.get("/healthz")
def healthz():
    registry = current_app.extensions["punctual"].registry
    shards = shard_health(registry)
    return json_response({"shards": shards}, 200 if all(s["ok"] for s in shards) else 503)


def shard_health(registry: Registry) -> list[dict]:
    """[{"shard": s, "ok": bool}] for every logical shard, failures with an `error`."""
    engines = registry.engines
    pool = ThreadPoolExecutor(max_workers=len(engines))
    futures = [pool.submit(_ping, engine) for engine in engines]
    wait(futures, timeout=HEALTH_TIMEOUT_S)
    pool.shutdown(wait=False)  # a hung DSN must not hold the answer
    status: list[str | None] = []
    for future in futures:
        if not future.done():
            status.append(f"no answer within {HEALTH_TIMEOUT_S:g}s")
        else:
            status.append(future.result())
    shards = []
    for shard in range(registry.settings.shards):
        error = status[registry.database_index(shard)]
        entry: dict[str, Any] = {"shard": shard, "ok": error is None}
        if error is not None:
            entry["error"] = error
        shards.append(entry)
    return shards


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
    text = generate_latest(REGISTRY) + generate_latest(gauges.registry)
    return Response(text, mimetype="text/plain", headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


@bp.get("/openapi.json")
def openapi():
    return json_response(document())


class RegistryGauges:
    """Jobs by state and dead letters, read from every DSN at most every GAUGE_TTL_S."""

    def __init__(self, registry: Registry, ttl_s: float = GAUGE_TTL_S):
        self._source = registry
        self._ttl_s = ttl_s
        self._lock = threading.Lock()
        self._expires = 0.0
        self._values: tuple[dict[str, int], int] | None = None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def _read(self) -> tuple[dict[str, int], int] | None:
        with self._lock:
            if time.monotonic() >= self._expires:
                try:
                    self._values = (jobs.count_by_state(self._source), runs.count_dead(self._source))
                except sa.exc.SQLAlchemyError:
                    pass  # keep the last values; /healthz is where an outage shows
                self._expires = time.monotonic() + self._ttl_s
            return self._values

    def collect(self):
        values = self._read()
        if values is None:
            return
        by_state, dead = values
        family = GaugeMetricFamily("punctual_jobs", "Jobs in the registry by state", labels=["state"])
        for state, count in sorted(by_state.items()):
            family.add_metric([state], count)
        yield family
        yield GaugeMetricFamily("punctual_dead_letter_runs", "Runs in state dead (dead letters)", value=dead)
