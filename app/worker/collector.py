"""The garbage collector of a worker's pool process, set for a burst.

CPython starts a collection of its youngest generation each time the objects it
tracks have grown by 700 since the last one. A worker under a burst holds a few
hundred calls in flight, each with its request, its task, its futures and its
headers alive across awaits, so that count is crossed again and again by objects
that are still alive: each collection walks them and promotes them, and they fill
the older generations, whose collections walk the whole heap (the imported modules,
Celery, SQLAlchemy's caches) again and again. That collecting was a large share of
a worker's CPU per run under a burst (docs/design.md, "Decisions").

So a pool process, once its imports are done:

- freezes what it holds then (gc.freeze): the modules and everything made at
  start-up are never walked again;
- collects the young generation after a growth of YOUNG_THRESHOLD objects, not 700.
  Garbage in a cycle waits longer to be freed; objects freed by their reference
  count, nearly all of them, go at once as before, so the processes' resident size
  barely grows.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 50_000
# The default ratios of the older generations: a middle collection every 10 young
# ones, a full one every 10 middle ones (and only once the heap has grown by a
# quarter since the last, CPython's own rule).
OLDER_THRESHOLDS = (10, 10)


def tune() -> None:
    """Set this process's collector for a worker's load (call once its imports are done)."""
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *OLDER_THRESHOLDS)
