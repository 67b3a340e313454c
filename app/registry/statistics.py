"""The planner's statistics of a shard database's busy tables, kept fresh by the sweep.

The fair claim's plan depends on them (app.pollers.claim, docs/design.md "The fair
claim"). Without them PostgreSQL takes the tables and indexes for as empty as they
were when `punctual migrate` created them, every index costs the same, and it probed
each owner's share through ix_jobs_due (shard, next_run_at), filtering by owner,
instead of ix_jobs_due_by_owner: each probe read the shard's whole due range, and a
batch of 500 owners took 0.2-3 s instead of about 2 ms. 1,000 owners' 100,000 jobs
then drained in 134 s against 87 s for one owner's (bench.fairness many).

Autovacuum analyzes a table once it has changed by more than 50 rows plus a tenth of
its size, but only when it comes by (once a minute per database by default), and not
at all where it is switched off. So the sweep applies the same rule itself: at most
once per CHECK_EVERY_S per database and process it reads the tables' counters, and
analyzes the ones past the rule. Where autovacuum keeps up this finds nothing to do.
One process at a time analyzes (an advisory lock); the others skip their turn.
"""

from __future__ import annotations

import threading
import time

import sqlalchemy as sa

from app.registry.dialect import is_postgres

TABLES = ("jobs", "runs")
# Autovacuum's defaults (autovacuum_analyze_threshold, autovacuum_analyze_scale_factor).
ANALYZE_BASE_ROWS = 50
ANALYZE_SCALE = 0.1
CHECK_EVERY_S = 30.0
# The registry's advisory locks are 77102xx (app.registry.mover, app.registry.shard_map).
_LOCK_KEY = 7710228

STALE_TABLES = sa.text(
    """
    SELECT s.relname FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
    WHERE s.schemaname = current_schema() AND s.relname = ANY(:tables)
      AND s.n_mod_since_analyze > :base + :scale * greatest(c.reltuples, 0)
    ORDER BY s.relname
    """
)

_next_check: dict[str, float] = {}
_guard = threading.Lock()


def analyze_if_stale(engine: sa.Engine, force_check: bool = False) -> list[str]:
    """ANALYZE the tables of TABLES that changed past autovacuum's rule since their
    last analyze; the ones analyzed. Checks at most once per CHECK_EVERY_S per database
    in this process (unless `force_check`); SQLite (embedded) has nothing to do."""
    if not is_postgres(engine):
        return []
    key = engine.url.render_as_string()
    now = time.monotonic()
    with _guard:
        if not force_check and _next_check.get(key, 0.0) > now:
            return []
        _next_check[key] = now + CHECK_EVERY_S
    with engine.begin() as conn:
        stale = list(
            conn.execute(
                STALE_TABLES, {"tables": list(TABLES), "base": ANALYZE_BASE_ROWS, "scale": ANALYZE_SCALE}
            ).scalars()
        )
        if not stale:
            return []
        locked = conn.execute(sa.text("SELECT pg_try_advisory_xact_lock(:key)"), {"key": _LOCK_KEY})
        if not locked.scalar_one():
            return []
        for table in stale:
            conn.exec_driver_sql(f'ANALYZE "{table}"')  # a name from TABLES, never from input
    return stale
