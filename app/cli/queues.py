"""`punctual queues`: the shard queues a worker consumes, for `celery worker -Q`.

Every logical shard's queue needs a worker (docs/design.md "Sharding"), and a
hand-written `-Q shard-00,...` list goes wrong the day PUNCTUAL_SHARDS changes.
`punctual queues --worker I/N` splits the PUNCTUAL_SHARDS queues into N contiguous
blocks as even as they go (the first blocks one longer when N does not divide them)
and prints block I, comma-separated: N workers given 1/N ... N/N consume every
queue exactly once. With the shard map's s mod N placement, a contiguous block
spans every database, so each worker's load spreads over all of them.
"""

from __future__ import annotations

import click

from app.cli.ops import load_settings


def worker_shards(shards: int, index: int, workers: int) -> range:
    """The logical shards of worker `index` (1-based) of `workers`: a contiguous block,
    the first `shards % workers` blocks one longer."""
    size, extra = divmod(shards, workers)
    start = (index - 1) * size + min(index - 1, extra)
    return range(start, start + size + (1 if index <= extra else 0))


def _worker(_ctx: click.Context, _param: click.Parameter, value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    index, sep, workers = value.partition("/")
    if not (sep and index.isdigit() and workers.isdigit() and 1 <= int(index) <= int(workers)):
        raise click.BadParameter(f"{value!r} is not I/N with 1 <= I <= N (say 1/2)")
    return int(index), int(workers)


@click.command("queues")
@click.option(
    "--worker",
    metavar="I/N",
    callback=_worker,
    help="Only worker I's share when N workers split the queues (say 1/2); default every queue.",
)
def queues(worker: tuple[int, int] | None) -> None:
    """Print the shard queues a worker consumes.

    Comma-separated, for `celery -A app worker -Q "$(punctual queues --worker 1/2)"`.
    """
    from app.registry.sharding import queue_name

    shards = load_settings().shards
    if worker is None:
        chosen = range(shards)
    else:
        index, workers = worker
        if workers > shards:
            raise click.BadParameter(
                f"{workers} workers for PUNCTUAL_SHARDS={shards} queues would leave a worker idle",
                param_hint="--worker",
            )
        chosen = worker_shards(shards, index, workers)
    click.echo(",".join(queue_name(shard) for shard in chosen))


COMMANDS = [queues]
