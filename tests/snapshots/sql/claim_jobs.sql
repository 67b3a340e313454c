UPDATE jobs SET lease_token = v.lease_token, leased_until = v.leased_until, nominal_at =
    v.nominal_at, next_run_at = v.next_run_at, attempt = v.attempt, skipped_after = v.skipped_after,
    skipped_through = v.skipped_through, state = :state, updated_at = :updated_at
FROM jsonb_to_recordset(:rows) AS v(job_id uuid, lease_token uuid, leased_until timestamptz,
    nominal_at timestamptz, next_run_at timestamptz, attempt integer, skipped_after timestamptz,
    skipped_through timestamptz)
WHERE jobs.job_id = v.job_id
AND jobs.job_id = ANY(:keys);
