INSERT INTO runs (run_id, job_id, lease_token, shard, owner, scheduled_for, attempt, target, retry,
    lateness_ms, origin, state, leased_until, published, started_at, created_at, updated_at)
SELECT v.run_id, v.job_id, v.lease_token, v.shard, v.owner, v.scheduled_for, v.attempt, v.target,
    v.retry, v.lateness_ms, :origin, :state, :leased_until, :published, :started_at, :created_at,
    :updated_at
FROM jsonb_to_recordset(:rows) AS v(run_id uuid, job_id uuid, lease_token uuid, shard smallint,
    owner text, scheduled_for timestamptz, attempt integer, target jsonb, retry jsonb, lateness_ms
    bigint) JOIN (SELECT job_id, lease_token, state FROM jobs WHERE job_id = ANY(:keys) ORDER BY
    job_id OFFSET 0 FOR SHARE) AS lease ON lease.job_id = v.job_id
WHERE lease.lease_token IS NOT DISTINCT FROM v.lease_token
AND v.lease_token IS NOT NULL
AND coalesce(lease.state, '') IN ('running')
ON CONFLICT (run_id) DO UPDATE SET state = excluded.state, leased_until = excluded.leased_until,
    started_at = excluded.started_at, lateness_ms = excluded.lateness_ms, updated_at =
    excluded.updated_at
WHERE coalesce(runs.state, '') IN ('claimed')
AND runs.lease_token IS NOT DISTINCT FROM excluded.lease_token
RETURNING runs.run_id;
