"""How a client command reaches the API: one rule for --url, --api-key and --json.

Every command that talks to the API (`punctual jobs ...`, `runs ...`,
`dead-letters`, `preview`) takes `--url` and `--api-key`, and `--json` where it
prints JSON, after its group or after itself: `punctual jobs --api-key K list` and
`punctual jobs list --api-key K` are the same command. A value typed on the command
line wins over PUNCTUAL_URL / PUNCTUAL_API_KEY; typed in both places, the one after
the subcommand wins. ClientGroup and ClientCommand attach the options, so a verb
added to a client group follows the rule without doing anything.

The options keep their values in `ctx.meta` (shared by a group and its subcommand)
rather than as parameters, because the subcommand's own default (read from the
environment) must not override a value typed after the group.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import click
from click.core import ParameterSource

from app.cli.help import SummaryGroup

DEFAULT_URL = "http://127.0.0.1:8000"
_TYPED = "punctual.client.typed"  # ctx.meta key: what was typed on the command line


def _remember(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Keep a value typed on the command line (a later one, the subcommand's, wins)."""
    assert param.name is not None
    if value not in (None, False) and ctx.get_parameter_source(param.name) is ParameterSource.COMMANDLINE:
        ctx.meta.setdefault(_TYPED, {})[param.name] = value
    return value


def _url_option() -> click.Option:
    return click.Option(
        ["--url"],
        envvar="PUNCTUAL_URL",
        metavar="URL",
        expose_value=False,
        callback=_remember,
        help=f"The API's base URL [env PUNCTUAL_URL; default {DEFAULT_URL}].",
    )


def _key_option() -> click.Option:
    return click.Option(
        ["--api-key"],
        envvar="PUNCTUAL_API_KEY",
        metavar="KEY",
        expose_value=False,
        callback=_remember,
        help="An API key from `punctual keys create` [env PUNCTUAL_API_KEY].",
    )


def _group_json_option() -> click.Option:
    return click.Option(
        ["--json", "as_json"],
        is_flag=True,
        expose_value=False,
        callback=_remember,
        help="Print the API's JSON instead of a table (as the subcommand's --json).",
    )


def _with(params: list[click.Parameter], extra: list[click.Option]) -> None:
    names = {p.name for p in params}
    params.extend(option for option in extra if option.name not in names)


class ClientCommand(click.Command):
    """A command that talks to the API: --url and --api-key after it or after its group;
    a --json typed after the group counts as the command's own."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _with(self.params, [_url_option(), _key_option()])

    def invoke(self, ctx: click.Context) -> Any:
        if "as_json" in ctx.params and typed(ctx).get("as_json"):
            ctx.params["as_json"] = True
        return super().invoke(ctx)


class ClientGroup(SummaryGroup):
    """A group of client commands: takes --url, --api-key and --json itself, and makes
    each subcommand a ClientCommand."""

    command_class = ClientCommand

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _with(self.params, [_url_option(), _key_option(), _group_json_option()])


def typed(ctx: click.Context | None = None) -> dict[str, Any]:
    """What the running command got on its command line (url, api_key, as_json)."""
    ctx = ctx or click.get_current_context(silent=True)
    return ctx.meta.get(_TYPED, {}) if ctx is not None else {}


def server_named(ctx: click.Context | None = None) -> bool:
    """True when the command was pointed at a server: --url, or PUNCTUAL_URL set."""
    return "url" in typed(ctx) or bool(os.environ.get("PUNCTUAL_URL"))


def api_url(ctx: click.Context | None = None) -> str:
    """The API the running command talks to: --url, else PUNCTUAL_URL, else the default."""
    return typed(ctx).get("url") or os.environ.get("PUNCTUAL_URL") or DEFAULT_URL


def url_problem(url: str) -> str | None:
    """Why `url` is not an API base URL (None when it is one)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises ValueError for a port that is not a number)
    except ValueError as exc:
        return f"is not a URL ({exc})"
    if parts.scheme not in ("http", "https"):
        if "://" not in url:
            return f"has no scheme: say http://{url} or https://{url}"
        return f"is not an http:// or https:// URL (the scheme is {parts.scheme!r})"
    if not parts.hostname:
        return "has no host"
    return None


def connect(ctx: click.Context | None = None):
    """A punctual_client.Client for the running command, or a one-line error (exit 2)."""
    from punctual_client import Client

    given = typed(ctx)
    url = api_url(ctx)
    problem = url_problem(url)
    if problem is not None:
        source = "--url" if "url" in given else "PUNCTUAL_URL"
        click.echo(f"punctual: {source}={url!r} {problem}", err=True)
        sys.exit(2)
    api_key = given.get("api_key") or os.environ.get("PUNCTUAL_API_KEY")
    if not api_key:
        click.echo("punctual: no API key: set PUNCTUAL_API_KEY or pass --api-key", err=True)
        sys.exit(2)
    return Client(url, api_key)


def call(action: Callable[[], Any]) -> Any:
    """`action()`, with the SDK's errors printed as one line (or the problem's lines), exit 1."""
    from punctual_client import PunctualError, TransportError

    try:
        return action()
    except TransportError as exc:
        click.echo(
            f"punctual: no Punctual API answers at {api_url()}: {exc.reason} (is `punctual api` running?)",
            err=True,
        )
        sys.exit(1)
    except PunctualError as exc:
        click.echo(f"punctual: {exc}", err=True)
        sys.exit(1)
