"""The garbage collector of a worker's pool process, set for a burst.

CPython starts a collection of its youngest generation each time the objects it
tracks have grown by 700 since the last one. A worker under a burst holds a few
hundred calls in flight, each with its request, its task, its futures and its
headers alive across awaits, so that count is crossed again and again by objects
that are still alive: each collection walks them and promotes them, and they fill
the older generations, whose collections walk the whole heap (the imported modules,
Celery, SQLAlchemy's caches) again and again. An engine handed 10,000 runs
(bench.dispatch) made about 3,000 young, 275 middle and 25 full collections and
spent 0.61-0.70 CPU-ms per run; with the young threshold at 50,000, 8 collections
and 0.44-0.53; with the heap frozen as well, 0.48-0.56 whatever the threshold. In the
burst as a user runs it (bench.burst, 20,000 runs), the worker's CPU per run fell
from 1.00-1.09 ms to 0.69-0.85 and its starts per second rose by a third to a half
(bench/README.md, 2026-12-03).

So a pool process, once its imports are done:

- freezes what it holds then (gc.freeze): the modules and everything made at
  start-up are never walked again;
- collects the young generation after a growth of YOUNG_THRESHOLD objects, not 700.
  Garbage in a cycle waits longer to be freed; objects freed by their reference
  count, nearly all of them, go at once as before. Under a 20,000 burst the pool
  processes peaked at 99-101 MiB resident against 98-99 MiB before.
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
