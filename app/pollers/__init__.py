"""Pollers: claim (due jobs -> runs), relay (outbox -> dispatch messages), janitor
(expired leases -> due again), and the beat schedule that drives them per shard."""
