"""An owner's weight: its share of each claim batch against the other owners with due
rows (pure).

`punctual owners set OWNER --weight N` stores it (app.services.owners), and the
claim divides each batch by it (app.pollers.shares). An owner weighs DEFAULT_WEIGHT
until one is set. A stored value is read through `weight_of`, which never trusts it:
a weight out of range is taken as the nearest bound, and one that is not a number as
the default, so a bad row can skew a share but never stop a claim.
"""

from __future__ import annotations

__all__ = ["DEFAULT_WEIGHT", "MAX_WEIGHT", "MIN_WEIGHT", "weight_of"]

DEFAULT_WEIGHT = 1
MIN_WEIGHT = 1
MAX_WEIGHT = 1000


def weight_of(value: int | float | str | None) -> int:
    """`value` as a weight: clamped to MIN_WEIGHT..MAX_WEIGHT; DEFAULT_WEIGHT when it is
    not a number."""
    if value is None:
        return DEFAULT_WEIGHT
    try:
        return min(MAX_WEIGHT, max(MIN_WEIGHT, int(value)))
    except (TypeError, ValueError):
        return DEFAULT_WEIGHT
