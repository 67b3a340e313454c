UPDATE runs SET lateness_ms = v.lateness_ms, leased_until = v.leased_until, state = :state,
    started_at = :started_at, updated_at = :updated_at
FROM jsonb_to_recordset(:rows) AS v(run_id uuid, lease_token uuid, lateness_ms bigint, leased_until
    timestamptz)
WHERE runs.run_id = v.run_id
AND runs.run_id = ANY(:keys)
AND runs.lease_token IS NOT DISTINCT FROM v.lease_token
AND v.lease_token IS NOT NULL
AND coalesce(runs.state, '') IN ('claimed')
RETURNING runs.run_id;
