"""Operator commands: `punctual migrate`, `punctual keys create`."""
from __future__ import annotations

import json
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

    settings = load_settings()
    for dsn, before, after in migrate_all(settings.database_urls):
        state = "up to date" if before == after else f"{before or 'empty'} -> {after}"
        click.echo(f"{_redact(dsn)}: {state}")


@click.group()
def keys() -> None:
    """API keys and signing secrets."""


@keys.command("create")
@click.option("--owner", required=True, help="The owner the key belongs to (created on first use).")
@click.option("--json", "as_json", is_flag=True, help="Print {owner, api_key, signing_secret} as JSON.")
def keys_create(owner: str, as_json: bool) -> None:
    """Print a new API key and the owner's signing secret (only a hash of the key is stored)."""
    from app.services.owners import create_key
    from app.registry.engines import registry_for

    settings = load_settings()
    try:
        new = create_key(registry_for(settings), owner)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--owner")
    if as_json:
        click.echo(json.dumps(new.as_dict()))
    else:
        click.echo(f"owner:          {new.owner}")
        click.echo(f"api key:        {new.api_key}")
        click.echo(f"signing secret: {new.signing_secret}")
        click.echo("The key is shown once; only its hash is stored.")


def _redact(dsn: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(dsn).render_as_string(hide_password=True)


COMMANDS = [migrate, keys]
