UPDATE jobs SET attempt = v.attempt, leased_until = v.leased_until, misfire_exempt =
    v.misfire_exempt, next_run_at = v.next_run_at, nominal_at = v.nominal_at, skipped_after =
    v.skipped_after, skipped_through = v.skipped_through, state = v.state, updated_at = :updated_at,
    lease_token = :lease_token
FROM jsonb_to_recordset(:rows) AS v(job_id uuid, lease_token uuid, attempt integer, leased_until
    timestamptz, misfire_exempt boolean, next_run_at timestamptz, nominal_at timestamptz,
    skipped_after timestamptz, skipped_through timestamptz, state text)
WHERE jobs.job_id = v.job_id
AND jobs.job_id = ANY(:keys)
AND jobs.lease_token IS NOT DISTINCT FROM v.lease_token
AND v.lease_token IS NOT NULL;
