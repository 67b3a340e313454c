"""Each owner's share of a claim batch (pure): weighted round-robin between owners.

The claim (app.pollers.claim) first lists the owners of a shard that have due rows;
`fair_shares` then says how many rows each may take in this batch of `limit`:

- A round gives every owner with due rows `weight` rows (the owner's weight,
  app.core.weights; set with `punctual owners set`, default 1). As many whole rounds
  as fit in the batch are given, and what is left goes one row each to the owners
  waiting longest (oldest due instant first).
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

from collections.abc import Mapping, Sequence
from typing import NamedTuple

from app.core.weights import DEFAULT_WEIGHT, weight_of

__all__ = ["Shares", "fair_shares"]


class Shares(NamedTuple):
    takes: list[tuple[str, int]]  # (owner, rows it may take), in turn order
    turn_ends: str | None  # where the next batch's turn starts after; None: wherever it was


def fair_shares(
    due_owners: Sequence[str], weights: Mapping[str, int], limit: int, after: str | None = None
) -> Shares:
    """Each owner's share of a batch of `limit`, for the owners in `due_owners` (those
    with due rows), in turn order after `after`.

    `weights` holds the owners whose weight is not DEFAULT_WEIGHT. `turn_ends` is the
    last owner that got one of the odd rows left after dividing by weight (or, when not
    every owner fitted, the last owner served): the next batch's turns start after it,
    so that no owner always gets the odd rows."""
    if limit <= 0 or not due_owners:
        return Shares([], None)
    by_name = sorted(set(due_owners))
    turn = next((i for i, owner in enumerate(by_name) if after is not None and owner > after), 0)
    order = by_name[turn:] + by_name[:turn]
    weight = {owner: weight_of(weights.get(owner, DEFAULT_WEIGHT)) for owner in order}
    round_rows = sum(weight.values())
    if round_rows > limit:  # not every owner fits: those next in turn get their round
        takes, left = [], limit
        for owner in order:
            if left <= 0:
                break
            take = min(weight[owner], left)
            takes.append((owner, take))
            left -= take
        return Shares(takes, takes[-1][0])
    rounds = limit // round_rows
    left = limit - rounds * round_rows  # a part of one more round, shared by weight too
    extra = {owner: left * weight[owner] // round_rows for owner in order}
    odd = left - sum(extra.values())  # fewer than the owners: one row each, in turn
    turn_ends = order[odd - 1] if odd else None
    for owner in order[:odd]:
        extra[owner] += 1
    return Shares([(owner, rounds * weight[owner] + extra[owner]) for owner in order], turn_ends)
