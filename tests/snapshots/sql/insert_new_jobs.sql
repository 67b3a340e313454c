INSERT INTO jobs (job_id, shard, owner, name, target, payload, schedule_kind, run_at, cron,
    timezone, interval_s, start_at, end_at, retry_max_attempts, retry_backoff_s,
    retry_max_backoff_s, misfire, dst_gap, dst_overlap, jitter_s, state, next_run_at, nominal_at,
    attempt, misfire_exempt, skipped_after, skipped_through, lease_token, leased_until,
    idempotency_key, request_hash, created_at, updated_at, labels, job_key, rescheduled_at, overlap)
SELECT v.job_id, v.shard, v.owner, v.name, v.target, v.payload, v.schedule_kind, v.run_at, v.cron,
    v.timezone, v.interval_s, v.start_at, v.end_at, v.retry_max_attempts, v.retry_backoff_s,
    v.retry_max_backoff_s, v.misfire, v.dst_gap, v.dst_overlap, v.jitter_s, v.state, v.next_run_at,
    v.nominal_at, v.attempt, v.misfire_exempt, v.skipped_after, v.skipped_through, v.lease_token,
    v.leased_until, v.idempotency_key, v.request_hash, v.created_at, v.updated_at, v.labels,
    v.job_key, v.rescheduled_at, v.overlap
FROM jsonb_to_recordset(:rows) AS v(job_id uuid, shard smallint, owner text, name text, target
    jsonb, payload jsonb, schedule_kind text, run_at timestamptz, cron text, timezone text,
    interval_s integer, start_at timestamptz, end_at timestamptz, retry_max_attempts integer,
    retry_backoff_s double precision, retry_max_backoff_s double precision, misfire text, dst_gap
    text, dst_overlap text, jitter_s integer, state text, next_run_at timestamptz, nominal_at
    timestamptz, attempt integer, misfire_exempt boolean, skipped_after timestamptz, skipped_through
    timestamptz, lease_token uuid, leased_until timestamptz, idempotency_key text, request_hash
    text, created_at timestamptz, updated_at timestamptz, labels jsonb, job_key text, rescheduled_at
    timestamptz, overlap text)
ON CONFLICT (job_id) DO NOTHING
RETURNING job_id;
