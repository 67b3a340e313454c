"""Forward-only, reviewed schema migrations (Alembic), applied by `punctual migrate`."""
