"""Each owner's share of a claim batch (pure): weighted round-robin between owners.

The claim (app.pollers.claim) first lists the owners of a shard that have due rows;
`fair_shares` then says how many rows each may take in this batch of `limit`:

- A round gives every owner with due rows `weight` rows (the owner's weight, set
  with `punctual owners set`, default 1). As many whole rounds as fit in the batch are given, and what is left
  goes one row each to the owners waiting longest (oldest due instant first).
- When one round does not fit (more owners due than the batch holds), the owners
  waiting longest get their round and the others wait for the next batch. Those
  served move on to later rows, so the ones left out are the oldest next time:
  across batches every owner is served in turn.

A share is an upper bound: an owner with fewer due rows takes what it has, and the
batch is smaller than `limit` (the poll goes on, since an owner that filled its
share may have more). So an owner with few due rows gets all of them in the next
batch, whatever another owner has waiting, and one owner alone gets the whole batch.
"""
from __future__ import annotations

from typing import Mapping, Sequence

__all__ = ["DEFAULT_WEIGHT", "MAX_WEIGHT", "fair_shares"]

DEFAULT_WEIGHT = 1
MAX_WEIGHT = 1000


def fair_shares(due_owners: Sequence[str], weights: Mapping[str, int], limit: int,
                after: str | None = None) -> list[tuple[str, int]]:
    """(owner, rows it may take) for the owners in `due_owners` (those with due rows)
    that get a share of a batch of `limit`, in turn order.

    `weights` holds the owners whose weight is not DEFAULT_WEIGHT."""
    if limit <= 0 or not due_owners:
        return []
    by_name = sorted(set(due_owners))
    turn = next((i for i, owner in enumerate(by_name) if after is not None and owner > after), 0)
    order = by_name[turn:] + by_name[:turn]
    weight = {owner: _weight(weights.get(owner, DEFAULT_WEIGHT)) for owner in order}
    round_rows = sum(weight.values())
    if round_rows > limit:  # not every owner fits: those next in turn get their round
        shares, left = [], limit
        for owner in order:
            if left <= 0:
                break
            take = min(weight[owner], left)
            shares.append((owner, take))
            left -= take
        return shares
    rounds = limit // round_rows
    left = limit - rounds * round_rows
    shares = []
    for owner in order:
        extra = min(weight[owner], left)  # a part of one more round
        left -= extra
        shares.append((owner, rounds * weight[owner] + extra))
    return shares


def _weight(value) -> int:
    try:
        return min(MAX_WEIGHT, max(1, int(value)))
    except (TypeError, ValueError):
        return DEFAULT_WEIGHT
