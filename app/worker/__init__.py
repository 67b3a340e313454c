"""A worker process's call engine: admits runs through the limits, starts them
(fenced), calls their targets (webhook or queue) and records what came back."""
