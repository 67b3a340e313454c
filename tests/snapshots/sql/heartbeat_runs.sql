UPDATE runs SET leased_until = :leased_until
FROM jsonb_to_recordset(:rows) AS v(run_id uuid, lease_token uuid)
WHERE runs.run_id = v.run_id
AND runs.run_id = ANY(ARRAY(SELECT run_id FROM runs WHERE run_id = ANY(:keys) AND
    coalesce(runs.state, '') IN ('running') ORDER BY run_id FOR UPDATE))
AND runs.lease_token IS NOT DISTINCT FROM v.lease_token
AND v.lease_token IS NOT NULL
RETURNING runs.run_id;
