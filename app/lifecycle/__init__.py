"""The run lifecycle after the claim: the dispatch message, the fenced lease writes
(start, hold, heartbeat), settlement (pure) and completion (batched, fenced)."""
