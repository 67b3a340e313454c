UPDATE jobs SET state = v.state, nominal_at = v.nominal_at, next_run_at = v.next_run_at, attempt =
    :attempt, misfire_exempt = :misfire_exempt, skipped_after = :skipped_after, skipped_through =
    :skipped_through, updated_at = :updated_at
FROM jsonb_to_recordset(:rows) AS v(job_id uuid, state text, nominal_at timestamptz, next_run_at
    timestamptz)
WHERE jobs.job_id = v.job_id
AND jobs.job_id = ANY(:keys);
