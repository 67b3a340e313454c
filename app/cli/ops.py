"""Operator commands: `punctual migrate` (and the settings and the checked registry
every operator command loads).

`punctual keys ...` lives in app.cli.keys.
"""
from __future__ import annotations

import logging
import sys

import click

from app.core.errors import SettingsError


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

    registry = registry_for(load_settings())
    try:
        registry.check()
    except MapUnavailable as exc:
        if not serving:
            click.echo(f"punctual: {exc}", err=True)
            sys.exit(2)
        click.echo(f"punctual: warning: {exc}; the map is read when it answers", err=True)
    except ShardMapError as exc:
        click.echo(f"punctual: {exc}", err=True)
        sys.exit(2)
    return registry


@click.command()
def migrate() -> None:
    """Create or upgrade the schema on every database (safe to repeat); the first run
    also writes the shard map, and a database added at the end gets its identity."""
    from app.registry.migrate import establish_cluster, migrate_schema
    from app.registry.shard_map import ShardMapError

    import sqlalchemy as sa

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
            log.info("%s: %s", _redact(dsn), state,
                     extra={"database": _redact(dsn), "before": before, "after": after})
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


def _redact(dsn: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(dsn).render_as_string(hide_password=True)


COMMANDS = [migrate]
