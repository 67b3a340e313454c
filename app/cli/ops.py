"""Operator commands: `punctual migrate` (and the settings every operator command loads).

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


@click.command()
def migrate() -> None:
    """Create or upgrade the schema on every physical shard (safe to repeat)."""
    from app.registry.migrate import migrate_all

    import sqlalchemy as sa

    settings = load_settings()
    log = start_logging("migrate", settings)
    for dsn in settings.database_urls:
        try:
            [(_dsn, before, after)] = migrate_all((dsn,))
        except (sa.exc.OperationalError, sa.exc.InterfaceError) as exc:
            click.echo(f"punctual: cannot migrate {_redact(dsn)}: {_reason(exc)}", err=True)
            sys.exit(1)
        state = "up to date" if before == after else f"{before or 'empty'} -> {after}"
        if settings.log_format == "json":  # one JSON object per line, like every process's log
            log.info("%s: %s", _redact(dsn), state,
                     extra={"database": _redact(dsn), "before": before, "after": after})
        else:
            click.echo(f"{_redact(dsn)}: {state}")


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
