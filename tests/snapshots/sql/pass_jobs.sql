UPDATE jobs SET state = v.state, nominal_at = v.nominal_at, next_run_at = v.next_run_at,
    skipped_after = v.skipped_after, skipped_through = v.skipped_through, attempt = :attempt,
    misfire_exempt = :misfire_exempt, updated_at = :updated_at
FROM jsonb_to_recordset(:rows) AS v(job_id uuid, state text, nominal_at timestamptz, next_run_at
    timestamptz, skipped_after timestamptz, skipped_through timestamptz)
WHERE jobs.job_id = v.job_id
AND jobs.job_id = ANY(:keys);
