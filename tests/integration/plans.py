"""What the plan tests look for in EXPLAIN output."""

from __future__ import annotations

import re

# ix_jobs_due itself, as `Index Scan using ix_jobs_due on` or `Bitmap Index Scan on
# ix_jobs_due`, and not ix_jobs_due_by_owner, whose name contains it.
PLAIN_DUE_INDEX = re.compile(r"\bix_jobs_due\b")
