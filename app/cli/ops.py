"""Operator commands: `punctual migrate` and `punctual owners` (and the settings and the
checked registry every operator command loads).

`punctual keys ...` lives in app.cli.keys.
"""

from __future__ import annotations

import json
import logging
import sys

import click

from app.cli.help import SummaryGroup
from app.core.errors import SettingsError
from app.core.weights import MAX_WEIGHT, MIN_WEIGHT


def load_settings():
    """Settings from the environment; a bad variable ends the command with one line."""
    from app.settings import get_settings

    try:
        return get_settings()
    except SettingsError as exc:
        click.echo(f"punctual: {exc}", err=True)
        sys.exit(2)


def load_registry(serving: bool = False):
    """The process's Registry with its shard map read and checked: a DSN list that
    disagrees with the stored map ends the command with one line. A server
    (`serving`) starts while the home does not answer and reads the map later."""
    from app.registry.engines import registry_for
    from app.registry.shard_map import MapUnavailable, ShardMapError

    settings = load_settings()
    registry = registry_for(settings)
    try:
        registry.check()
    except MapUnavailable as exc:
        if not serving:
            click.echo(f"punctual: {_embedded_reason(settings) or exc}", err=True)
            sys.exit(2)
        click.echo(f"punctual: warning: {exc}; the map is read when it answers", err=True)
    except ShardMapError as exc:
        click.echo(f"punctual: {_embedded_reason(settings) or exc}", err=True)
        sys.exit(2)
    return registry


def _embedded_reason(settings) -> str | None:
    """Why the embedded registry was not there, when PUNCTUAL_DATABASE_URLS is unset
    (an operator command run away from `punctual dev`'s data dir, or with the
    variable not exported): the real cause, not "no database answers"."""
    import os
    from pathlib import Path

    if os.environ.get("PUNCTUAL_DATABASE_URLS") or not settings.embedded:
        return None
    path = Path(settings.database_urls[0].removeprefix("sqlite:///"))
    found = "does not exist" if not path.exists() else "holds no migrated registry"
    return (
        f"PUNCTUAL_DATABASE_URLS is not set, so the embedded registry in PUNCTUAL_DATA_DIR "
        f"({settings.data_dir}) was used, and {path} {found}: set PUNCTUAL_DATABASE_URLS to your "
        f"databases' DSNs, or run this where `punctual dev` keeps its data"
    )


@click.command()
def migrate() -> None:
    """Create or upgrade the schema on every database.

    Safe to repeat. The first run also writes the shard map, and a database added
    at the end of PUNCTUAL_DATABASE_URLS gets its identity.
    """
    import sqlalchemy as sa

    from app.registry.migrate import establish_cluster, migrate_schema
    from app.registry.shard_map import ShardMapError

    settings = load_settings()
    log = start_logging("migrate", settings)
    for dsn in settings.database_urls:
        try:
            [(_dsn, before, after)] = migrate_schema((dsn,))
        except (sa.exc.OperationalError, sa.exc.InterfaceError) as exc:
            click.echo(f"punctual: cannot migrate {_redact(dsn)}: {_reason(exc)}", err=True)
            sys.exit(1)
        state = "up to date" if before == after else f"{before or 'empty'} -> {after}"
        if settings.log_format == "json":  # one JSON object per line, like every process's log
            log.info(
                "%s: %s",
                _redact(dsn),
                state,
                extra={"database": _redact(dsn), "before": before, "after": after},
            )
        else:
            click.echo(f"{_redact(dsn)}: {state}")
    try:
        establish_cluster(settings.database_urls, settings.shards, echo=click.echo)
    except (sa.exc.OperationalError, sa.exc.InterfaceError) as exc:
        click.echo(f"punctual: cannot write the shard map: {_reason(exc)}", err=True)
        sys.exit(1)
    except ShardMapError as exc:
        click.echo(f"punctual: {exc}", err=True)
        sys.exit(2)


def start_logging(process: str, settings) -> logging.Logger:
    """Logs of a `punctual` command in PUNCTUAL_LOG_FORMAT: libraries at WARNING, ours at INFO."""
    from app.logs import configure

    configure(process, settings.log_format, logging.WARNING)
    logging.getLogger("punctual").setLevel(logging.INFO)
    return logging.getLogger(f"punctual.{process}")


def _reason(exc: Exception) -> str:
    """The driver's own words, on one line, without SQLAlchemy's background link."""
    text = str(getattr(exc, "orig", None) or exc)
    return " ".join(text.split())


@click.group(cls=SummaryGroup, invoke_without_command=True)
@click.pass_context
def owners(ctx: click.Context) -> None:
    """Owners: their weights, quota, switch and runs on the way.

    Alone, the same as `owners list`.
    """
    if ctx.invoked_subcommand is None:
        ctx.invoke(owners_list)


@owners.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per owner.")
def owners_list(as_json: bool) -> None:
    """Every owner: weight, quota (PUNCTUAL_OWNER_MAX_IN_FLIGHT), its jobs due, runs
    waiting (claimed, not started) and running, counted in the registry now, and
    whether it is paused."""
    from app.services.owners import activity

    registry = load_registry()
    quota = registry.settings.owner_max_in_flight or None
    found = activity(registry)
    if as_json:
        for item in found:
            click.echo(json.dumps({**item.as_dict(), "max_in_flight": quota}))
        return
    width = max([len("owner")] + [len(item.owner) for item in found])
    click.echo(
        f"{'owner'.ljust(width)}  {'weight':>6}  {'quota':>6}  {'due':>8}  {'waiting':>8}  {'running':>8}"
        "  switch"
    )
    for item in found:
        click.echo(
            f"{item.owner.ljust(width)}  {item.weight:>6}  {quota or '-':>6}  {item.due:>8}  "
            f"{item.waiting:>8}  {item.running:>8}  {'paused' if item.paused else 'on'}"
        )


@owners.command("set")
@click.argument("owner")
@click.option(
    "--weight",
    type=click.IntRange(MIN_WEIGHT, MAX_WEIGHT),
    required=True,
    help=f"The owner's share of each claim batch relative to other owners with due rows "
    f"({MIN_WEIGHT}-{MAX_WEIGHT}).",
)
def owners_set(owner: str, weight: int) -> None:
    """Set an owner's weight (pollers pick it up within 30 s)."""
    from app.services.owners import set_weight

    try:
        set_weight(load_registry(), owner, weight)
    except LookupError as exc:
        click.echo(f"punctual: {exc.args[0]}", err=True)
        sys.exit(1)
    click.echo(f"{owner}: weight {weight}")


@owners.command("pause")
@click.argument("owner")
def owners_pause(owner: str) -> None:
    """Pause an owner: none of its runs starts until resumed.

    Runs in flight finish. Returns once every poller knows (a few seconds) and what
    was claimed meanwhile is taken back.
    """
    from app.services.owners import pause_owner

    try:
        paused = pause_owner(load_registry(), owner)
    except LookupError as exc:
        click.echo(f"punctual: {exc.args[0]}", err=True)
        sys.exit(1)
    click.echo(
        f"{owner}: paused ({paused.taken_back} claimed runs taken back,"
        f" {paused.held} runs held until the resume)"
    )


@owners.command("resume")
@click.argument("owner")
def owners_resume(owner: str) -> None:
    """Resume a paused owner: its jobs and held runs start again.

    Each job's misfire policy applies to what it missed while the owner was paused.
    """
    from app.services.owners import resume_owner

    try:
        renewed = resume_owner(load_registry(), owner)
    except LookupError as exc:
        click.echo(f"punctual: {exc.args[0]}", err=True)
        sys.exit(1)
    click.echo(f"{owner}: resumed ({renewed} held runs released)")


def _redact(dsn: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(dsn).render_as_string(hide_password=True)


COMMANDS = [migrate, owners]
