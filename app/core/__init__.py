"""The pure scheduling core: instants, cron and schedules with DST rules, misfire,
retry and jitter decisions, and what a delivery carries. No I/O; `now` is an argument."""
