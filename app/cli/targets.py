"""`punctual targets`: the target databases of `postgres` targets; `targets init ALIAS`."""

from __future__ import annotations

import sys

import click

from app.cli.help import SummaryGroup
from app.cli.ops import load_settings


@click.group(cls=SummaryGroup, invoke_without_command=True)
@click.pass_context
def targets(ctx: click.Context) -> None:
    """Target databases of `postgres` targets, and who may use each.

    PUNCTUAL_TARGET_DATABASES names them (alias=DSN), PUNCTUAL_TARGET_DATABASE_OWNERS
    grants them (alias=owner,owner or alias=*). Without a subcommand, one line each.
    """
    if ctx.invoked_subcommand is not None:
        return
    settings = load_settings()
    if not settings.target_databases:
        click.echo("no target databases (PUNCTUAL_TARGET_DATABASES is unset)")
    for database in settings.target_databases:
        owners = ", ".join(database.owners) if database.owners else "no owner"
        click.echo(f"{database.alias}: {owners}")


@targets.command("init")
@click.argument("alias")
def init(alias: str) -> None:
    """Create the inbox table (punctual_inbox) in target database ALIAS.

    Safe to repeat. The connecting user needs CREATE there; the receiving
    application's user needs SELECT and UPDATE on the table.
    """
    import sqlalchemy as sa

    from app.worker.inbox import init_inbox

    settings = load_settings()
    database = settings.target_database(alias)
    if database is None:
        known = ", ".join(d.alias for d in settings.target_databases) or "none"
        click.echo(f"punctual: {alias!r} is not in PUNCTUAL_TARGET_DATABASES (it names {known})", err=True)
        sys.exit(2)
    try:
        init_inbox(database.dsn)
    except sa.exc.SQLAlchemyError as exc:
        cause = getattr(exc, "orig", None) or exc
        first = (str(cause).strip().splitlines() or [""])[0]
        click.echo(f"punctual: target database {alias!r}: {type(cause).__name__}: {first}", err=True)
        sys.exit(1)
    click.echo(f"{alias}: punctual_inbox ready")


COMMANDS = [targets]
