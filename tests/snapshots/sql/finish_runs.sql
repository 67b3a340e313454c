UPDATE runs SET state = v.state, finished_at = v.finished_at, status_code = v.status_code, error =
    v.error, started_at = v.started_at, lateness_ms = v.lateness_ms, leased_until = :leased_until,
    updated_at = :updated_at
FROM jsonb_to_recordset(:rows) AS v(run_id uuid, lease_token uuid, state text, finished_at
    timestamptz, status_code integer, error text, started_at timestamptz, lateness_ms bigint)
WHERE runs.run_id = v.run_id
AND runs.run_id = ANY(ARRAY(SELECT run_id FROM runs WHERE run_id = ANY(:keys) AND
    coalesce(runs.state, '') IN ('running') ORDER BY run_id FOR UPDATE))
AND runs.lease_token IS NOT DISTINCT FROM v.lease_token
AND v.lease_token IS NOT NULL
RETURNING runs.run_id;
