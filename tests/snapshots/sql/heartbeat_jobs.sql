UPDATE jobs SET leased_until = :leased_until
FROM jsonb_to_recordset(:rows) AS v(job_id uuid, lease_token uuid)
WHERE jobs.job_id = v.job_id
AND jobs.job_id = ANY(:keys)
AND jobs.lease_token IS NOT DISTINCT FROM v.lease_token
AND v.lease_token IS NOT NULL
AND jobs.job_id IN (SELECT job_id FROM jobs WHERE job_id = ANY(:keys) ORDER BY job_id FOR UPDATE)
RETURNING jobs.job_id;
