"""`punctual shards`: where each logical shard lives and what it holds; `shards move`.

The listing reads every database once (a count per shard over jobs, and the
in-flight runs by their partial index ix_runs_leased), so on a registry of many
millions of jobs it takes as long as one sequential scan of jobs: an operator's
command, not a probe.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime

import click

from app.cli.help import SummaryGroup
from app.cli.ops import load_registry


@click.group(cls=SummaryGroup, invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list, one object per shard.")
@click.pass_context
def shards(ctx: click.Context, as_json: bool) -> None:
    """Where each logical shard lives, and what it holds.

    One row per logical shard: its database (index into PUNCTUAL_DATABASE_URLS),
    jobs, jobs due now, the oldest due, runs in flight, and a move in progress.
    """
    if ctx.invoked_subcommand is not None:
        return
    from app.registry.census import shard_census

    rows = shard_census(load_registry(), datetime.now(UTC))
    if as_json:
        click.echo(json.dumps([row.as_dict() for row in rows]))
        return
    header = ("shard", "database", "jobs", "due now", "oldest due", "in flight", "move")
    table = [header] + [row.as_text() for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    for line in table:
        click.echo(
            "  ".join(
                cell.rjust(width) if i < 4 or i == 5 else cell.ljust(width)
                for i, (cell, width) in enumerate(zip(line, widths, strict=True))
            ).rstrip()
        )


@shards.command("move")
@click.argument("shard", type=int)
@click.option(
    "--to",
    "to_index",
    type=int,
    default=None,
    help="The index (into PUNCTUAL_DATABASE_URLS) of the database the shard moves to.",
)
@click.option("--abort", is_flag=True, help="Undo the shard's move in progress (before its switch).")
def move(shard: int, to_index: int | None, abort: bool) -> None:
    """Move SHARD to another database, online; run it again to finish an interrupted move."""
    from app.registry.mover import MoveError, abort_move, move_shard

    if abort == (to_index is not None):
        raise click.UsageError("give either --to INDEX or --abort")
    registry = load_registry()
    try:
        if abort:
            abort_move(registry, shard, echo=click.echo)
        else:
            assert to_index is not None  # --abort or --to, checked above
            report = move_shard(registry, shard, to_index, echo=click.echo)
            click.echo(
                f"moved shard {report.shard} in {report.duration_s:.1f} s (fenced {report.fence_s:.2f} s)"
            )
    except MoveError as exc:
        click.echo(f"punctual: {exc}", err=True)
        sys.exit(1)


COMMANDS = [shards]
