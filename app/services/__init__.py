"""The job and run services the interfaces call: validation, idempotency, paging,
owners and their keys, the private-address policy."""
