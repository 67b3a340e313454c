"""Client commands for runs: `punctual dead-letters` and `punctual runs replay RUN`.

Like `punctual jobs`, they call a running API at PUNCTUAL_URL with PUNCTUAL_API_KEY
(or --url and --api-key), print a table (or the API's JSON with --json), and print
an API error's problem to stderr with exit status 1.
"""

from __future__ import annotations

import json

import click

from app.cli.jobs import _call, _connect, _json_option, _key_option, _run_rows, _show_page, _url_option


@click.command("dead-letters")
@click.option("--limit", type=int, help="Page size (1-500, default 100).")
@click.option("--cursor", help="Continue after a previous page.")
@click.option("--all", "every", is_flag=True, help="Follow cursors to the last page.")
@_url_option
@_key_option
@_json_option
def dead_letters(limit, cursor, every, url, api_key, as_json) -> None:
    """Runs that spent every attempt (or failed for good), newest first; replay them with `runs replay`."""
    client = _connect(url, api_key)
    if every:
        items = _call(lambda: list(client.iter_dead_letters(page_size=limit or 500)))
        click.echo(json.dumps([run.raw for run in items], indent=2) if as_json else _run_rows(items))
        return
    _show_page(_call(lambda: client.list_dead_letters(limit=limit, cursor=cursor)), as_json, _run_rows)


@click.group("runs")
@_url_option
@_key_option
@click.pass_context
def runs(ctx: click.Context, url: str, api_key: str) -> None:
    """Act on single runs through the API."""
    ctx.obj = {"url": url, "api_key": api_key}


@runs.command("replay")
@click.argument("run_id")
@_json_option
@click.pass_context
def replay(ctx: click.Context, run_id: str, as_json: bool) -> None:
    """Fire the dead run RUN_ID again (same Idempotency-Key, a fresh retry budget).

    Prints the run, now `replayed`.
    """
    client = _connect(ctx.obj["url"], ctx.obj["api_key"])
    run = _call(lambda: client.replay_run(run_id))
    click.echo(json.dumps(run.raw, indent=2) if as_json else _run_rows([run]))


COMMANDS = [dead_letters, runs]
