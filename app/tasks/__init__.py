"""The Celery entry points: the dispatch task (app.tasks.dispatch) and a shard's
beat-driven poll and sweep tasks (app.tasks.shard). Each parses its message and calls
the layer that does the work."""
