"""The line of a concurrency cap: which waiting run takes its next free slot (pure).

Owners share a cap (the operator's default per target origin), and when it is full its
slots go to their runs in turns, as app.worker.turns hands out dispatch messages:

1. lanes: runs of recurring jobs (cron, interval) before one-off runs;
2. within a lane, start-time fair queueing by owner, weighted: each owner (a `flow`:
   its lane and name) has a finish tag F, each lane a clock v; the owner's next run
   starts at S = max(F, v), the owner with the lowest S goes next, and its slot moves
   v on to S and F to S + 1 / weight. An owner that starts waiting begins level with
   the clock, so an idle spell banks no credit; one served a moment ago keeps what it
   was served. A flow whose F fell behind its lane's clock is level with it: its tag
   may be forgotten;
3. within an owner, first come first served (the caller's order).

The limiter keeps each cap's tags and which flows wait, in which worker process (a
`line`: app.worker.slot_wait), and `allot` decides both its admissions and, from its
answer to a line's `look`, which run a slot ending in that process goes to. The Redis
script repeats this arithmetic (app.limits.redis_limiter).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import quote

__all__ = ["ANYONE", "ONE_OFF", "RECURRING", "Ahead", "Tags", "Turn", "allot", "order"]

# Lanes, in the order they are served: the first character of a flow.
RECURRING, ONE_OFF = "r", "o"


@dataclass(frozen=True)
class Turn:
    """Whose turn a run takes in a cap's line: its owner, the owner's weight (its share
    relative to the other owners waiting) and whether it is an occurrence of a recurring
    job. `flow` names the owner in its lane, with no space or line break in it (the
    Redis script's texts are split on them)."""

    owner: str
    weight: int = 1
    recurring: bool = False
    flow: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "weight", max(1, int(self.weight)))
        lane = RECURRING if self.recurring else ONE_OFF
        object.__setattr__(self, "flow", lane + quote(self.owner, safe=""))


# The turn of a run whose caller names none: one anonymous owner.
ANYONE = Turn("")


def _rank(flow: str) -> int:
    return 0 if flow[:1] == RECURRING else 1


@dataclass
class Tags:
    """A cap's virtual times: each lane's clock and each flow's finish tag."""

    clock: dict[str, float] = field(default_factory=dict)  # lane -> v
    finish: dict[str, float] = field(default_factory=dict)  # flow -> F

    def start(self, flow: str) -> float:
        """When `flow`'s next run starts in virtual time."""
        return max(self.finish.get(flow, 0.0), self.clock.get(flow[:1], 0.0))

    def charge(self, served: Mapping[str, tuple[int, int]]) -> None:
        """Slots went to flows (flow -> (weight, slots)), each flow's one after the other.
        Every start is read before any is moved on, so the order of `served` is of no
        account (the Redis script charges a batch's admissions in no particular order)."""
        begins = {flow: self.start(flow) for flow in served}
        for flow, (weight, runs) in served.items():
            if runs <= 0:
                continue
            begin = begins[flow]
            self.finish[flow] = begin + runs / weight
            lane = flow[:1]
            self.clock[lane] = max(self.clock.get(lane, 0.0), begin + (runs - 1) / weight)

    def forget_level(self) -> None:
        """Drop the tags of flows level with their lane's clock: they start there anyway."""
        self.finish = {f: tag for f, tag in self.finish.items() if tag > self.clock.get(f[:1], 0.0)}


@dataclass
class Ahead:
    """A flow waiting for a cap in another line: its start, weight and waiting runs."""

    flow: str
    start: float
    weight: int
    runs: int

    def order(self) -> tuple[int, float, str]:
        return (_rank(self.flow), self.start, self.flow)


def allot(
    free: int, here: Mapping[str, tuple[int, int]], elsewhere: Iterable[Ahead], tags: Tags
) -> dict[str, int]:
    """How many of `free` slots each flow of `here` (flow -> (weight, runs waiting)) takes
    when the flows waiting elsewhere take their turns too.

    Slot after slot goes to the flow whose next run starts first (`order`: lane, S, then
    the flow's name, so that every process breaks a tie alike), as if each were taken
    at once; `elsewhere` flows that are also `here` count as here.
    """
    grants = dict.fromkeys(here, 0)
    if free <= 0 or not here:
        return grants
    others = [a for a in elsewhere if a.runs > 0 and a.flow not in here]
    if not others and sum(runs for _, runs in here.values()) <= free:
        return {flow: runs for flow, (_, runs) in here.items()}
    heap: list[tuple[int, float, str, bool, int, int]] = []
    for flow, (weight, runs) in here.items():
        if runs > 0:
            heap.append((_rank(flow), tags.start(flow), flow, True, weight, runs))
    for other in others:
        heap.append((_rank(other.flow), other.start, other.flow, False, other.weight, other.runs))
    heapq.heapify(heap)
    while free > 0 and heap:
        rank, begin, flow, mine, weight, runs = heapq.heappop(heap)
        if mine:
            grants[flow] += 1
        free -= 1
        if runs > 1:
            heapq.heappush(heap, (rank, begin + 1 / weight, flow, mine, weight, runs - 1))
    return grants


def order(flow: str, tags: Tags) -> tuple[int, float, str]:
    """Where `flow`'s next run stands in the cap's line: first in turn, lowest."""
    return (_rank(flow), tags.start(flow), flow)
