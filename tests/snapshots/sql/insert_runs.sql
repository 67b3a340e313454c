INSERT INTO runs (run_id, job_id, shard, owner, origin, scheduled_for, attempt, state, lease_token,
    leased_until, due_at, published, target, retry, started_at, finished_at, lateness_ms,
    status_code, error, created_at, updated_at)
SELECT v.run_id, v.job_id, v.shard, v.owner, v.origin, v.scheduled_for, v.attempt, v.state,
    v.lease_token, v.leased_until, v.due_at, v.published, v.target, v.retry, v.started_at,
    v.finished_at, v.lateness_ms, v.status_code, v.error, v.created_at, v.updated_at
FROM jsonb_to_recordset(:rows) AS v(run_id uuid, job_id uuid, shard smallint, owner text, origin
    text, scheduled_for timestamptz, attempt integer, state text, lease_token uuid, leased_until
    timestamptz, due_at timestamptz, published boolean, target jsonb, retry jsonb, started_at
    timestamptz, finished_at timestamptz, lateness_ms bigint, status_code integer, error text,
    created_at timestamptz, updated_at timestamptz);
