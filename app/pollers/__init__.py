"""Pollers: claim (due jobs -> runs), relay (outbox -> dispatch messages), janitor
(expired leases -> due again) and retention, each run by a shard's poll or sweep
task (app.tasks.shard) on beat's schedule (app.beat.schedule)."""
