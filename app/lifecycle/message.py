"""The dispatch message: one Celery message carries a batch of runs.

Each entry holds all a worker needs without reading the job (docs/design.md, "The
dispatch message"): run_id, job_id, shard, owner, origin, lease_token,
scheduled_for, attempt, the target and retry snapshots and the payload, fire_at
when the run was claimed ahead of its fire instant, and own_lease for an `allow`
job's occurrence (leased on its row). The signing secret is never on the broker;
the worker looks it up.

A run claimed ahead (PUNCTUAL_CLAIM_AHEAD_S) travels in a message that holds the runs
firing within HOLD_SPAN of its first run's instant; its Celery eta is that instant
less START_LEAD. The worker starts the message's runs then (fenced, and acknowledges
it) and holds each call on a timer of its event loop until the run's own instant
(app.worker.engine), so a run is never called before its instant, and a steady load's
runs share a message per shard and poll instead of one per 100 ms step.

The entries travel as one JSON text in the message (`encode_runs`), not as a list
inside Celery's own JSON: kombu decodes its JSON with a Python hook called for every
object, and a message holds a hundred runs of several objects each; one plain
`json.loads` of the text is C from end to end. A worker still reads a message whose runs are a list.

Pure: building entries from run rows, grouping them into messages, parsing them back.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import orjson

from app.core.timefmt import format_instant, parse_instant
from app.registry.records import Row

# Runs per dispatch message. A claim batch of 500 becomes 5 messages, so the
# processes of one or several workers start a burst in parallel, while the broker
# still sees ~100x fewer messages than runs.
CHUNK_RUNS = 100
# Runs claimed ahead whose fire instants fall within this span of the first one's share
# a message: a poll claims each shard's next poll interval of runs, and a message costs
# a worker about the same whatever it carries (its handover to a pool process, the
# limiter's round trip, the fenced start). A run waits on a worker's timer for at most
# this long after its start, and a worker killed meanwhile leaves it to a live one
# (app.worker.orphans).
HOLD_SPAN = timedelta(seconds=1.5)
# How long before its first run's instant a message runs: its start is written and its
# calls are on their timers by the instant, however long the start and the handover to
# a pool process take.
START_LEAD = timedelta(milliseconds=100)
# An owner with at least this many runs of one eta and lane gets messages of its own
# (to_messages); owners with fewer share them, so that a thousand owners with one run
# each do not become a thousand messages.
OWN_MESSAGE_RUNS = 20


@dataclass(frozen=True)
class DispatchRun:
    run_id: uuid.UUID
    job_id: uuid.UUID
    shard: int
    owner: str
    origin: str  # schedule | trigger | replay
    lease_token: uuid.UUID
    scheduled_for: datetime
    attempt: int
    target: dict
    retry: dict
    payload: Any
    fire_at: datetime | None = None  # set when claimed ahead: not to start before it
    # An occurrence of a cron or interval job: it travels in the prompt lane, which a
    # worker serves before one-off runs (app.worker.turns), so that a job every few
    # seconds keeps its pace while a burst of one-offs drains.
    recurring: bool = False
    # An occurrence of a job whose overlap is `allow` (app.core.overlap): it holds its
    # lease on its run row, as an off-schedule run does, not on the job.
    own_lease: bool = False

    @functools.cached_property
    def texts(self) -> tuple[str, str, str]:
        """The run's id, its job's and its lease token, as text (str of each UUID): for a
        run read from a message, the message's own texts, not printed again per run."""
        return str(self.run_id), str(self.job_id), str(self.lease_token)

    @property
    def leased_on_run(self) -> bool:
        """The run holds its lease on its own row, not the job's: a triggered, replayed
        or backfilled run, and an occurrence of a job whose overlap is `allow`."""
        return self.own_lease or self.origin != "schedule"

    def to_message(self) -> dict:
        return {
            "run_id": str(self.run_id),
            "job_id": str(self.job_id),
            "shard": self.shard,
            "owner": self.owner,
            "origin": self.origin,
            "lease_token": str(self.lease_token),
            "scheduled_for": format_instant(self.scheduled_for),
            "attempt": self.attempt,
            "target": self.target,
            "retry": self.retry,
            "payload": self.payload,
            **({"fire_at": format_instant(self.fire_at)} if self.fire_at is not None else {}),
            **({"recurring": True} if self.recurring else {}),
            **({"own_lease": True} if self.own_lease else {}),
        }

    @classmethod
    def from_message(cls, entry: Mapping[str, Any]) -> DispatchRun:
        # Every field is set here, so the instance's dictionary is filled in one step:
        # the frozen dataclass's __init__ sets each of its fourteen fields through
        # object.__setattr__, for each run of every message.
        run = object.__new__(cls)
        fire_at = entry.get("fire_at")
        run_id, job_id, token = entry["run_id"], entry["job_id"], entry["lease_token"]
        run.__dict__.update(
            run_id=uuid.UUID(run_id),
            job_id=uuid.UUID(job_id),
            shard=int(entry["shard"]),
            owner=entry["owner"],
            origin=entry["origin"],
            lease_token=uuid.UUID(token),
            scheduled_for=parse_instant(entry["scheduled_for"]),
            attempt=int(entry["attempt"]),
            target=entry["target"],
            retry=entry["retry"] or {},
            payload=entry.get("payload"),
            fire_at=parse_instant(fire_at) if fire_at else None,
            recurring=bool(entry.get("recurring")),
            own_lease=bool(entry.get("own_lease")),
        )
        if _printed(run_id) and _printed(job_id) and _printed(token):  # (any other form is printed anew)
            run.__dict__["texts"] = (run_id, job_id, token)
        return run

    @classmethod
    def from_row(
        cls,
        row: Row,
        payload: Any,
        fire_at: datetime | None = None,
        recurring: bool = False,
        own_lease: bool | None = None,
    ) -> DispatchRun:
        """From a runs row (plus the job's payload, which runs do not store, the fire
        instant of a run claimed ahead, which is the job's next_run_at, and whether the
        job is recurring, which the claim knows from the job row). `own_lease` unsaid: a
        row not started yet with a leased_until holds a lease of its own (a run leased
        by its job has no row until it starts); the janitor, which also reads started
        rows, says which (the job holds the run's token or not)."""
        if own_lease is None:
            own_lease = row["origin"] == "schedule" and row.get("leased_until") is not None
        return cls(
            run_id=row["run_id"],
            job_id=row["job_id"],
            shard=row["shard"],
            owner=row["owner"],
            origin=row["origin"],
            lease_token=row["lease_token"],
            scheduled_for=row["scheduled_for"],
            attempt=row["attempt"],
            target=row["target"],
            retry=row["retry"] or {},
            payload=payload,
            fire_at=fire_at,
            recurring=recurring,
            own_lease=own_lease,
        )


def _printed(text: str) -> bool:
    """Whether `text`, which uuid.UUID has parsed, is already what str() prints of it:
    36 characters, hyphens at their places and lowercase hex (an id or token goes into
    headers and Redis fields, where it must be the one form)."""
    return len(text) == 36 and text[8] == text[13] == text[18] == text[23] == "-" and text.islower()


def round_robin(items: Sequence, key) -> list:
    """`items` reordered so that the groups by `key` take turns, one item each, in the
    order each group first appears; within a group the order is kept.

    [a1, a2, a3, b1, c1, c2] -> [a1, b1, c1, a2, c2, a3]."""
    groups: dict = {}
    for item in items:
        groups.setdefault(key(item), []).append(item)
    if len(groups) <= 1:
        return list(items)
    out: list = []
    queues = list(groups.values())
    depth = 0
    while queues:
        out.extend(queue[depth] for queue in queues)
        depth += 1
        queues = [queue for queue in queues if len(queue) > depth]
    return out


def chunks(items: list, size: int = CHUNK_RUNS) -> Iterator[list]:
    """`items` in consecutive slices of at most `size`, spread evenly.

    501 runs become six slices of 83-84 rather than 5 x 100 + 1, so no message is a
    straggler.
    """
    if not items:
        return
    count = -(-len(items) // size)
    base, extra = divmod(len(items), count)
    start = 0
    for index in range(count):
        end = start + base + (1 if index < extra else 0)
        yield items[start:end]
        start = end


def holds(runs: Sequence[DispatchRun], now: datetime) -> list[datetime | None]:
    """Each run's message eta. Taken by fire instant (a run due, or with no instant,
    as at `now`), a run opens a hold at its instant, and the runs firing less than
    HOLD_SPAN after it join that hold; a hold runs START_LEAD before its first instant,
    or at once (None) if that has come."""
    instants = [max(run.fire_at, now) if run.fire_at is not None else now for run in runs]
    etas: list[datetime | None] = [None] * len(runs)
    opened: datetime | None = None
    eta: datetime | None = None
    for index in sorted(range(len(runs)), key=instants.__getitem__):
        if opened is None or instants[index] >= opened + HOLD_SPAN:
            opened = instants[index]
            eta = opened - START_LEAD if opened - START_LEAD > now else None
        etas[index] = eta
    return etas


def to_messages(
    runs: Iterable[DispatchRun], now: datetime, size: int = CHUNK_RUNS
) -> list[tuple[datetime | None, list[dict]]]:
    """The messages that carry `runs`: (eta, entries) pairs, the ones due now first.

    Runs are grouped by eta (`holds`: the runs firing within HOLD_SPAN together) and by lane
    (recurring runs apart from one-offs, and first; fewer than OWN_MESSAGE_RUNS one-offs
    of an eta join that eta's recurring runs); within a group an owner with
    OWN_MESSAGE_RUNS runs or more gets messages of its own, and the owners with fewer
    share messages, taking turns (`round_robin`); all in
    slices of at most `size`. A worker serves messages by lane and then fairly by owner
    (app.worker.turns), which only works if one owner's bulk does not share its
    messages with another owner's few runs."""
    runs = list(runs)
    groups: dict[tuple[datetime | None, bool], list[DispatchRun]] = {}
    for run, eta in zip(runs, holds(runs, now), strict=True):
        groups.setdefault((eta, not run.recurring), []).append(run)
    for eta, one_off in list(groups):
        # A few one-off runs sharing an eta with recurring runs ride in their messages
        # (and lane) rather than in messages of their own: at a steady load most groups
        # hold a run or two, and a message costs the same work whatever it carries.
        # A burst's one-offs are never this few, so they still queue in their own lane.
        if one_off and len(groups[(eta, True)]) < OWN_MESSAGE_RUNS and (eta, False) in groups:
            groups[(eta, False)].extend(groups.pop((eta, True)))
    order = sorted(groups, key=lambda group: (group[0] is not None, group[0] or now, group[1]))
    messages: list[tuple[datetime | None, list[dict]]] = []
    for eta, one_off in order:
        by_owner: dict[str, list[DispatchRun]] = {}
        for run in groups[(eta, one_off)]:
            by_owner.setdefault(run.owner, []).append(run)
        shared = [run for owned in by_owner.values() if len(owned) < OWN_MESSAGE_RUNS for run in owned]
        slices = [*chunks(round_robin(shared, _owner), size)] + [
            chunk
            for owned in by_owner.values()
            if len(owned) >= OWN_MESSAGE_RUNS
            for chunk in chunks(owned, size)
        ]
        messages.extend((eta, [run.to_message() for run in chunk]) for chunk in slices)
    return messages


# What a worker's turnstile reads from a dispatch message's headers, without decoding
# its body (app.tasks.turnstile): its lane, the owner it is charged to, and how many
# runs it holds.
LANE_HEADER = "punctual_lane"
OWNER_HEADER = "punctual_owner"
RUNS_HEADER = "punctual_runs"
RECURRING_LANE = "recurring"
ONE_OFF_LANE = "one-off"


def encode_runs(entries: Sequence[Mapping[str, Any]]) -> str:
    """The `runs` of a dispatch message: its entries as one compact JSON text, written
    by orjson (json.dumps walked each entry's objects in Python); what orjson refuses
    (an integer past 64 bits or a lone surrogate in an owner's payload) goes the
    standard library's way. Either text reads back with `decode_runs` alike."""
    try:
        return orjson.dumps(entries).decode()
    except orjson.JSONEncodeError:
        return json.dumps(entries, separators=(",", ":"))


def decode_runs(runs: str | Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """A dispatch message's entries, from `encode_runs`' text or a plain list."""
    return json.loads(runs) if isinstance(runs, str) else list(runs)


def message_headers(entries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The headers of a dispatch message holding `entries`: the recurring lane if any
    run is recurring, and the owner with the most runs (the first to reach it)."""
    counts: dict[str, int] = {}
    for entry in entries:
        counts[entry["owner"]] = counts.get(entry["owner"], 0) + 1
    return {
        LANE_HEADER: RECURRING_LANE if any(entry.get("recurring") for entry in entries) else ONE_OFF_LANE,
        OWNER_HEADER: max(counts, key=counts.__getitem__, default=""),
        RUNS_HEADER: len(entries),
    }


def _owner(run: DispatchRun) -> str:
    return run.owner
