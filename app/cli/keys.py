"""Operator commands for API keys and signing secrets: `punctual keys create|list|revoke|rotate`.

They write the registry's home DSN directly (PUNCTUAL_DATABASE_URLS), as
`punctual migrate` does: an operator with the database manages keys, no API key
needed. A key is shown once, at creation; afterwards it is named by its id, the
first characters of its SHA-256 (which is all the registry keeps).
"""

from __future__ import annotations

import json

import click

from app.cli.help import SummaryGroup
from app.cli.ops import load_registry

_json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")


def _registry():
    return load_registry()  # refused with one line on a DSN list the shard map disagrees with


@click.group(cls=SummaryGroup)
def keys() -> None:
    """API keys and signing secrets."""


@keys.command("create")
@click.option("--owner", required=True, help="The owner the key belongs to (created on first use).")
@click.option(
    "--json", "as_json", is_flag=True, help="Print {owner, key_id, api_key, signing_secret} as JSON."
)
def keys_create(owner: str, as_json: bool) -> None:
    """Print a new API key and the owner's signing secret (only a hash of the key is stored)."""
    from app.services.owners import create_key

    try:
        new = create_key(_registry(), owner)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--owner") from None
    if as_json:
        click.echo(json.dumps(new.as_dict()))
    else:
        click.echo(f"owner:          {new.owner}")
        click.echo(f"key id:         {new.key_id}")
        click.echo(f"api key:        {new.api_key}")
        click.echo(f"signing secret: {new.signing_secret}")
        click.echo("The key is shown once; only its hash is stored.")


@keys.command("list")
@click.option("--owner", help="Only this owner's keys.")
@_json_option
def keys_list(owner: str | None, as_json: bool) -> None:
    """Every API key (id, owner, created, revoked), oldest first; never the keys themselves."""
    from app.services.owners import list_keys

    found = list_keys(_registry(), owner)
    if as_json:
        click.echo(json.dumps({"items": [key.as_dict() for key in found]}, indent=2))
        return
    rows = [["ID", "OWNER", "CREATED", "REVOKED"]]
    rows += [[k.key_id, k.owner, k.as_dict()["created_at"], k.as_dict()["revoked_at"] or "-"] for k in found]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        click.echo("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())


@keys.command("revoke")
@click.argument("key_id")
@_json_option
def keys_revoke(key_id: str, as_json: bool) -> None:
    """Revoke the key KEY_ID (from `keys list`): every API process refuses it within seconds."""
    from app.services.errors import NotFound
    from app.services.owners import KEY_CACHE_TTL_S, revoke_key

    try:
        key = revoke_key(_registry(), key_id)
    except (NotFound, ValueError) as exc:
        raise click.BadParameter(
            str(exc) if isinstance(exc, ValueError) else f"no key {key_id!r}", param_hint="KEY_ID"
        ) from None
    if as_json:
        click.echo(json.dumps(key.as_dict()))
    else:
        click.echo(
            f"revoked {key.key_id} of {key.owner} at {key.as_dict()['revoked_at']}; "
            f"every API process refuses it within {KEY_CACHE_TTL_S:g} s"
        )


@keys.command("rotate")
@click.option("--owner", required=True, help="Whose signing secret to replace.")
@click.option(
    "--window-s",
    type=click.IntRange(0, 30 * 86400),
    default=86400,
    show_default=True,
    help="Seconds the old secret keeps signing next to the new one.",
)
@_json_option
def keys_rotate(owner: str, window_s: int, as_json: bool) -> None:
    """A new signing secret for OWNER; the old one keeps signing during the window.

    Until the window ends, calls carry `Punctual-Signature: t=..,v1=<new>,v1=<old>`,
    so a receiver still checking the old secret keeps verifying them; switch it to
    the new secret before the window ends.
    """
    from app.core.timefmt import utcnow
    from app.services.errors import NotFound
    from app.services.owners import rotate_secret

    try:
        rotation = rotate_secret(_registry(), owner, window_s, utcnow())
    except NotFound:
        raise click.BadParameter(f"no owner {owner!r}", param_hint="--owner") from None
    if as_json:
        click.echo(json.dumps(rotation.as_dict()))
    else:
        click.echo(f"owner:              {rotation.owner}")
        click.echo(f"new signing secret: {rotation.signing_secret}")
        click.echo(f"old secret signs until {rotation.as_dict()['previous_secret_until']} as well")


COMMANDS = [keys]
