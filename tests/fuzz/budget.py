"""The fuzz tier's budget: a fixed number of examples per test, derandomized, so CI
runs the same inputs every time in bounded time (about a minute for the tier).

PUNCTUAL_TEST_FUZZ_SCALE=N multiplies each test's examples by N; PUNCTUAL_TEST_FUZZ_RANDOM=1
draws new inputs each run (explore locally, then pin what fails with @example).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

SCALE = int(os.environ.get("PUNCTUAL_TEST_FUZZ_SCALE", "1"))
RANDOM = bool(os.environ.get("PUNCTUAL_TEST_FUZZ_RANDOM"))


def fuzz_settings(examples: int) -> settings:
    return settings(
        max_examples=examples * SCALE,
        derandomize=not RANDOM,
        deadline=None,
        database=None,
        # Module-scoped fixtures (a worker, a target) serve every example on purpose.
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
        ],
    )
