"""The registry: the schema, one engine per physical database, batched writes, row
shapes, shard routing and migrations."""
