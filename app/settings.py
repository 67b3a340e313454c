"""Configuration: PUNCTUAL_* environment variables, read once into one frozen object.

`VARIABLES` is the single list of what can be set; `punctual --help` prints it, and
`Settings.from_env` validates every value so that a bad one stops start-up with a
one-line error naming the variable.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from app.core.errors import SettingsError
from app.core.private_targets import PrivateTargets
from app.logs import FORMATS as LOG_FORMATS


@dataclass(frozen=True)
class Variable:
    name: str
    default: str  # the value an unset variable takes; "" when the default is not a value
    help: str
    default_text: str = ""  # what an unset variable means when `default` is "" (for --help)

    @property
    def shown_default(self) -> str:
        """The default as `punctual --help` prints it, once."""
        return self.default or self.default_text


# The contract of docs/api.md ("Running it"), then the operator's tuning knobs.
VARIABLES: tuple[Variable, ...] = (
    Variable(
        "PUNCTUAL_DATABASE_URLS",
        "",
        "comma-separated Postgres DSNs, the physical shards",
        "embedded SQLite file under PUNCTUAL_DATA_DIR",
    ),
    Variable("PUNCTUAL_SHARDS", "16", "logical shards, a power of two"),
    Variable(
        "PUNCTUAL_REPLICA_URLS",
        "",
        "comma-separated Postgres DSNs of streaming replicas of the primaries, for stale-tolerant reads",
        "none: every read on the primaries",
    ),
    Variable(
        "PUNCTUAL_REPLICA_MAX_LAG_S",
        "5",
        "a replica further behind its primary than this is skipped: the read goes to the primary",
    ),
    Variable(
        "PUNCTUAL_BROKER_URL", "", "Celery broker", "embedded filesystem transport under PUNCTUAL_DATA_DIR"
    ),
    Variable("PUNCTUAL_REDIS_URL", "", "Redis for rate limits and concurrency caps", "in-process"),
    Variable(
        "PUNCTUAL_POLL_INTERVAL_S",
        "1",
        "how often beat reads what each shard has due and asks the pollers of shards with work to claim",
    ),
    Variable(
        "PUNCTUAL_LEASE_S",
        "20",
        "lease of a run in flight, renewed by the heartbeat; a claimed run may wait 30 leases to start",
    ),
    Variable("PUNCTUAL_HEARTBEAT_S", "5", "lease extension interval while a call is in flight"),
    Variable("PUNCTUAL_MISFIRE_GRACE_S", "60", "lateness after which an occurrence counts as missed"),
    Variable("PUNCTUAL_ALLOW_PRIVATE_TARGETS", "0", "allow loopback/private target addresses"),
    Variable(
        "PUNCTUAL_PRIVATE_TARGETS",
        "",
        "networks and host names allowed as targets although private (10.0.0.0/8,db.internal,*.internal)",
        "none",
    ),
    Variable("PUNCTUAL_TARGET_RATE_PER_S", "0", "default per-target rate limit (0 = none)"),
    Variable("PUNCTUAL_TARGET_MAX_CONCURRENCY", "200", "default per-target concurrency cap (0 = none)"),
    Variable("PUNCTUAL_OWNER_MAX_IN_FLIGHT", "0", "calls in flight per owner across all workers (0 = none)"),
    Variable("PUNCTUAL_DATA_DIR", ".punctual", "where the embedded defaults keep their files (dev)"),
    Variable("PUNCTUAL_CLAIM_BATCH", "500", "rows claimed per transaction"),
    Variable(
        "PUNCTUAL_POLL_BUDGET_S", "5", "how long one poll task keeps claiming while batches come back full"
    ),
    Variable(
        "PUNCTUAL_CLAIM_AHEAD_S",
        "10",
        "how long before its fire instant a run may be claimed; "
        "it starts at that instant (0 = claim when due)",
    ),
    Variable("PUNCTUAL_DISPATCH_THREADS", "128", "concurrent target calls per worker process"),
    Variable("PUNCTUAL_DB_POOL_SIZE", "10", "connections per physical shard per process"),
    Variable("PUNCTUAL_REDIS_PREFIX", "punctual", "prefix of every Redis key Punctual writes"),
    Variable(
        "PUNCTUAL_HISTORY_DAYS",
        "30",
        "days run history and dead letters are kept after they finish (fractions allowed)",
    ),
    Variable(
        "PUNCTUAL_METRICS_PORT",
        "0",
        "port where a worker serves Prometheus metrics for all its processes (0 = off)",
    ),
    Variable("PUNCTUAL_LOG_FORMAT", "text", "text, or json for one JSON object per line (every process)"),
    Variable(
        "PUNCTUAL_BEAT_ALIVE_FILE",
        "",
        "a file beat touches whenever it has sent tasks, for health checks",
        "none",
    ),
    Variable(
        "PUNCTUAL_TARGET_DATABASES",
        "",
        "databases `postgres` targets write their inbox rows to: alias=DSN;alias=DSN",
        "none",
    ),
    Variable(
        "PUNCTUAL_TARGET_DATABASE_OWNERS",
        "",
        "which owners may target each of those databases: alias=owner,owner;alias=*",
        "none: no owner may",
    ),
    Variable("PUNCTUAL_DEV_MODE", "0", "set by `punctual dev` for its children: serves the /dev/echo target"),
)

_NAMES = {v.name for v in VARIABLES}


def _number(name: str, raw: str, cast: Callable, *, minimum: float | None = None) -> float:
    try:
        value = cast(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r}: not a number") from None
    if minimum is not None and value < minimum:
        raise SettingsError(f"{name}={raw!r}: must be at least {minimum}")
    return value


def _flag(name: str, raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise SettingsError(f"{name}={raw!r}: must be 0 or 1")


def _choice(name: str, raw: str, choices: tuple[str, ...]) -> str:
    value = raw.strip().lower()
    if value not in choices:
        raise SettingsError(f"{name}={raw!r}: must be {' or '.join(choices)}")
    return value


def _dsns(raw: str) -> tuple[str, ...]:
    dsns = tuple(part.strip() for part in raw.split(",") if part.strip())
    if raw.strip() and not dsns:
        raise SettingsError("PUNCTUAL_DATABASE_URLS: no DSN given")
    for dsn in dsns:
        parts = urlsplit(dsn)
        if parts.scheme not in ("postgresql", "postgres", "sqlite") or (
            parts.scheme != "sqlite" and not parts.path.strip("/")
        ):
            raise SettingsError(
                f"PUNCTUAL_DATABASE_URLS: {dsn!r} is not a postgresql://user@host:port/dbname URL"
            )
    return dsns


def _replica_dsns(raw: str, primaries: tuple[str, ...]) -> tuple[str, ...]:
    dsns = tuple(part.strip() for part in raw.split(",") if part.strip())
    if raw.strip() and not dsns:
        raise SettingsError("PUNCTUAL_REPLICA_URLS: no DSN given")
    for dsn in dsns:
        parts = urlsplit(dsn)
        if parts.scheme not in ("postgresql", "postgres") or not parts.path.strip("/"):
            raise SettingsError(
                f"PUNCTUAL_REPLICA_URLS: {dsn!r} is not a postgresql://user@host:port/dbname URL"
            )
        if dsn in primaries:
            raise SettingsError(f"PUNCTUAL_REPLICA_URLS: {dsn!r} is in PUNCTUAL_DATABASE_URLS: list replicas")
    if len(set(dsns)) != len(dsns):
        raise SettingsError("PUNCTUAL_REPLICA_URLS: a DSN is listed twice")
    if dsns and any(not p.startswith(("postgresql", "postgres")) for p in primaries):
        raise SettingsError(
            "PUNCTUAL_REPLICA_URLS: replicas need PostgreSQL primaries in PUNCTUAL_DATABASE_URLS"
        )
    return dsns


_ALIAS = re.compile(r"[a-z][a-z0-9_]{0,62}")


@dataclass(frozen=True)
class TargetDatabase:
    """A database `postgres` targets may write their inbox rows to, and who may."""

    alias: str
    dsn: str
    owners: tuple[str, ...]  # ("*",): every owner

    def granted(self, owner: str) -> bool:
        return "*" in self.owners or owner in self.owners


def _pairs(name: str, raw: str) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    for entry in (part.strip() for part in raw.split(";")):
        if not entry:
            continue
        alias, sep, value = entry.partition("=")
        alias = alias.strip()
        if not sep or not _ALIAS.fullmatch(alias) or not value.strip():
            raise SettingsError(
                f"{name}: {entry.split('://')[0]!r} is not alias=value "
                "(an alias of lowercase letters, digits and _, starting with a letter)"
            )
        if alias in dict(pairs):
            raise SettingsError(f"{name}: alias {alias!r} is given twice")
        pairs.append((alias, value.strip()))
    return pairs


def _target_databases(raw: str, raw_owners: str) -> tuple[TargetDatabase, ...]:
    dsns = _pairs("PUNCTUAL_TARGET_DATABASES", raw)
    for alias, dsn in dsns:
        parts = urlsplit(dsn)
        if parts.scheme not in ("postgresql", "postgres") or not parts.path.strip("/"):
            raise SettingsError(
                f"PUNCTUAL_TARGET_DATABASES: {alias}'s DSN is not a postgresql://user@host:port/dbname URL"
            )
    grants = dict(_pairs("PUNCTUAL_TARGET_DATABASE_OWNERS", raw_owners))
    for alias in grants:
        if alias not in dict(dsns):
            raise SettingsError(
                f"PUNCTUAL_TARGET_DATABASE_OWNERS: {alias!r} is not an alias of PUNCTUAL_TARGET_DATABASES"
            )
    return tuple(
        TargetDatabase(alias, dsn, tuple(o.strip() for o in grants.get(alias, "").split(",") if o.strip()))
        for alias, dsn in dsns
    )


# A run claimed ahead waits in its worker, unacknowledged, until its fire instant
# (a Celery eta); RabbitMQ closes a channel that holds a message longer than its
# consumer_timeout (30 min by default), so the wait is kept well inside it.
MAX_CLAIM_AHEAD_S = 300


def _claim_ahead(raw: str) -> float:
    value = _number("PUNCTUAL_CLAIM_AHEAD_S", raw, float, minimum=0)
    if value > MAX_CLAIM_AHEAD_S:
        raise SettingsError(f"PUNCTUAL_CLAIM_AHEAD_S={raw!r}: at most {MAX_CLAIM_AHEAD_S}")
    return value


def _replica_max_lag(raw: str) -> float:
    value = _number("PUNCTUAL_REPLICA_MAX_LAG_S", raw, float)
    if not math.isfinite(value) or value <= 0:
        raise SettingsError(f"PUNCTUAL_REPLICA_MAX_LAG_S={raw!r}: must be a number of seconds above 0")
    return value


def _history_days(raw: str) -> float:
    value = _number("PUNCTUAL_HISTORY_DAYS", raw, float)
    if not math.isfinite(value) or value <= 0:
        raise SettingsError(
            f"PUNCTUAL_HISTORY_DAYS={raw!r}: must be a number of days above 0 (say 30, or 0.5)"
        )
    return value


# How many leases a run claimed and not started may wait before the janitor takes it
# back (app.pollers.claim says why so many).
QUEUED_LEASES = 30


@dataclass(frozen=True)
class Settings:
    database_urls: tuple[str, ...]
    shards: int = 16
    replica_urls: tuple[str, ...] = ()
    replica_max_lag_s: float = 5.0
    broker_url: str = ""
    redis_url: str = ""
    poll_interval_s: float = 1.0
    lease_s: float = 20.0
    heartbeat_s: float = 5.0
    misfire_grace_s: float = 60.0
    allow_private_targets: bool = False
    # The allow-list alone; private_target_policy adds allow_private_targets to it.
    private_targets: PrivateTargets = PrivateTargets()
    target_rate_per_s: float = 0.0
    target_max_concurrency: int = 200
    owner_max_in_flight: int = 0
    data_dir: Path = Path(".punctual")
    claim_batch: int = 500
    poll_budget_s: float = 5.0
    claim_ahead_s: float = 10.0
    dispatch_threads: int = 128
    db_pool_size: int = 10
    redis_prefix: str = "punctual"
    metrics_port: int = 0
    log_format: str = "text"
    beat_alive_file: Path | None = None
    history_days: float = 30.0
    target_databases: tuple[TargetDatabase, ...] = ()
    # Set only by `punctual dev`: serves /dev/echo and allows the embedded defaults.
    dev_mode: bool = False

    @property
    def private_target_policy(self) -> PrivateTargets:
        """Which private targets may be called: all (PUNCTUAL_ALLOW_PRIVATE_TARGETS), or
        those of PUNCTUAL_PRIVATE_TARGETS."""
        return dataclasses.replace(self.private_targets, allow_all=self.allow_private_targets)

    @property
    def queued_lease_s(self) -> float:
        """How long a run claimed, and not started yet, may wait before its lease
        expires: QUEUED_LEASES x PUNCTUAL_LEASE_S."""
        return self.lease_s * QUEUED_LEASES

    @property
    def embedded(self) -> bool:
        """True when the registry is the embedded SQLite file (one poller, no SKIP LOCKED)."""
        return all(url.startswith("sqlite") for url in self.database_urls)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides) -> Settings:
        env = dict(os.environ if environ is None else environ)
        # PUNCTUAL_URL/PUNCTUAL_API_KEY are the client commands'; PUNCTUAL_TEST_* the
        # test harness's (scripts/test, .ci/run), inherited by every process a test starts.
        unknown = sorted(
            k
            for k in env
            if k.startswith("PUNCTUAL_")
            and k not in _NAMES
            and k not in ("PUNCTUAL_URL", "PUNCTUAL_API_KEY")
            and not k.startswith("PUNCTUAL_TEST_")
        )
        if unknown:
            raise SettingsError(f"{unknown[0]}: unknown variable (see `punctual --help`)")

        def get(name: str) -> str:
            raw = env.get(name)
            if raw is None or raw == "":
                return next(v.default for v in VARIABLES if v.name == name)
            return raw

        data_dir = Path(get("PUNCTUAL_DATA_DIR"))
        dsns = _dsns(get("PUNCTUAL_DATABASE_URLS")) or (
            f"sqlite:///{(data_dir / 'registry.sqlite3').resolve()}",
        )
        shards = int(_number("PUNCTUAL_SHARDS", get("PUNCTUAL_SHARDS"), int, minimum=1))
        if shards & (shards - 1):
            raise SettingsError(f"PUNCTUAL_SHARDS={shards}: must be a power of two (1, 2, 4, 8, 16, ...)")
        if shards > 1024:
            raise SettingsError(f"PUNCTUAL_SHARDS={shards}: at most 1024")
        if len(dsns) > shards:
            raise SettingsError(
                f"PUNCTUAL_DATABASE_URLS: {len(dsns)} DSNs for {shards} shards; at most one DSN per shard"
            )
        lease_s = _number("PUNCTUAL_LEASE_S", get("PUNCTUAL_LEASE_S"), float, minimum=1)
        heartbeat_s = _number("PUNCTUAL_HEARTBEAT_S", get("PUNCTUAL_HEARTBEAT_S"), float, minimum=0.1)
        if heartbeat_s >= lease_s:
            raise SettingsError(
                f"PUNCTUAL_HEARTBEAT_S={heartbeat_s:g}: must be shorter than PUNCTUAL_LEASE_S={lease_s:g}"
            )
        broker_url = get("PUNCTUAL_BROKER_URL")
        if broker_url and "://" not in broker_url:
            raise SettingsError(
                f"PUNCTUAL_BROKER_URL={broker_url!r}: not a broker URL such as amqp://guest@localhost//"
            )
        redis_url = get("PUNCTUAL_REDIS_URL")
        if redis_url and not redis_url.startswith(("redis://", "rediss://", "unix://")):
            raise SettingsError(f"PUNCTUAL_REDIS_URL={redis_url!r}: not a redis:// URL")
        values: dict[str, Any] = dict(
            database_urls=dsns,
            shards=shards,
            replica_urls=_replica_dsns(get("PUNCTUAL_REPLICA_URLS"), dsns),
            replica_max_lag_s=_replica_max_lag(get("PUNCTUAL_REPLICA_MAX_LAG_S")),
            broker_url=broker_url,
            redis_url=redis_url,
            poll_interval_s=_number(
                "PUNCTUAL_POLL_INTERVAL_S", get("PUNCTUAL_POLL_INTERVAL_S"), float, minimum=0.05
            ),
            lease_s=lease_s,
            heartbeat_s=heartbeat_s,
            misfire_grace_s=_number(
                "PUNCTUAL_MISFIRE_GRACE_S", get("PUNCTUAL_MISFIRE_GRACE_S"), float, minimum=0
            ),
            allow_private_targets=_flag(
                "PUNCTUAL_ALLOW_PRIVATE_TARGETS", get("PUNCTUAL_ALLOW_PRIVATE_TARGETS")
            ),
            private_targets=PrivateTargets.parse(get("PUNCTUAL_PRIVATE_TARGETS")),
            target_rate_per_s=_number(
                "PUNCTUAL_TARGET_RATE_PER_S", get("PUNCTUAL_TARGET_RATE_PER_S"), float, minimum=0
            ),
            target_max_concurrency=int(
                _number(
                    "PUNCTUAL_TARGET_MAX_CONCURRENCY", get("PUNCTUAL_TARGET_MAX_CONCURRENCY"), int, minimum=0
                )
            ),
            owner_max_in_flight=int(
                _number("PUNCTUAL_OWNER_MAX_IN_FLIGHT", get("PUNCTUAL_OWNER_MAX_IN_FLIGHT"), int, minimum=0)
            ),
            data_dir=data_dir,
            claim_batch=int(_number("PUNCTUAL_CLAIM_BATCH", get("PUNCTUAL_CLAIM_BATCH"), int, minimum=1)),
            poll_budget_s=_number("PUNCTUAL_POLL_BUDGET_S", get("PUNCTUAL_POLL_BUDGET_S"), float, minimum=0),
            claim_ahead_s=_claim_ahead(get("PUNCTUAL_CLAIM_AHEAD_S")),
            dispatch_threads=int(
                _number("PUNCTUAL_DISPATCH_THREADS", get("PUNCTUAL_DISPATCH_THREADS"), int, minimum=1)
            ),
            db_pool_size=int(_number("PUNCTUAL_DB_POOL_SIZE", get("PUNCTUAL_DB_POOL_SIZE"), int, minimum=1)),
            redis_prefix=get("PUNCTUAL_REDIS_PREFIX"),
            metrics_port=int(_number("PUNCTUAL_METRICS_PORT", get("PUNCTUAL_METRICS_PORT"), int, minimum=0)),
            log_format=_choice("PUNCTUAL_LOG_FORMAT", get("PUNCTUAL_LOG_FORMAT"), LOG_FORMATS),
            beat_alive_file=Path(alive_file) if (alive_file := get("PUNCTUAL_BEAT_ALIVE_FILE")) else None,
            history_days=_history_days(get("PUNCTUAL_HISTORY_DAYS")),
            target_databases=_target_databases(
                get("PUNCTUAL_TARGET_DATABASES"), get("PUNCTUAL_TARGET_DATABASE_OWNERS")
            ),
            dev_mode=_flag("PUNCTUAL_DEV_MODE", get("PUNCTUAL_DEV_MODE")),
        )
        values.update(overrides)
        return cls(**values)

    def target_database(self, alias: str) -> TargetDatabase | None:
        return next((d for d in self.target_databases if d.alias == alias), None)

    def broker(self) -> str:
        """The broker URL, or the embedded filesystem transport under the data dir."""
        return self.broker_url or "filesystem://"


_current: Settings | None = None


def get_settings() -> Settings:
    """The process's settings, read from the environment on first use."""
    global _current
    if _current is None:
        _current = Settings.from_env()
    return _current


def use_settings(settings: Settings | None) -> None:
    """Install settings for this process (tests, `punctual dev`); None forgets them."""
    global _current
    _current = settings
