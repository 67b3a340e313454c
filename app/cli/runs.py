"""Client commands for runs: `punctual dead-letters` and `punctual runs replay RUN`.

Like `punctual jobs`, they call a running API at PUNCTUAL_URL with PUNCTUAL_API_KEY
(or --url and --api-key, after the group or the command: app.cli.connection), print
a table (or the API's JSON with --json), and print an API error's problem to stderr
with exit status 1.
"""

from __future__ import annotations

import json
import time

import click

from app.cli.connection import ClientCommand, ClientGroup, call, connect
from app.cli.jobs import _json_option, _run_rows, _show_job, _show_page, _table

# How long `runs replay` looks for the new attempt of a dead one-off: its job is due
# again at once and the next poll (every PUNCTUAL_POLL_INTERVAL_S) claims it.
REPLAY_LOOK_S = 5.0


def _dead_letter_rows(runs) -> str:
    return _table(
        (
            [
                r.id,
                r.job_id,
                r.job_name or "-",
                r.raw["scheduled_for"],
                r.attempt,
                r.status_code or "-",
                r.error or "",
            ]
            for r in runs
        ),
        ["ID", "JOB", "JOB NAME", "SCHEDULED FOR", "ATTEMPT", "STATUS", "ERROR"],
    )


@click.command("dead-letters", cls=ClientCommand)
@click.option("--limit", type=int, help="Page size (1-500, default 100).")
@click.option("--cursor", help="Continue after a previous page.")
@click.option("--all", "every", is_flag=True, help="Follow cursors to the last page.")
@_json_option
def dead_letters(limit, cursor, every, as_json) -> None:
    """The runs that failed for good, newest first, with their job.

    Replay one with `punctual runs replay RUN_ID`.
    """
    client = connect()
    if every:
        items = call(lambda: list(client.iter_dead_letters(page_size=limit or 500)))
        click.echo(json.dumps([run.raw for run in items], indent=2) if as_json else _dead_letter_rows(items))
        return
    _show_page(call(lambda: client.list_dead_letters(limit=limit, cursor=cursor)), as_json, _dead_letter_rows)


@click.group("runs", cls=ClientGroup)
def runs() -> None:
    """Act on single runs through the API."""


@runs.command("replay")
@click.argument("run_id")
@_json_option
def replay(run_id: str, as_json: bool) -> None:
    """Fire the dead run RUN_ID again; prints the new attempt, the run that will fire.

    The new attempt has the same scheduled_for (so the same Idempotency-Key) and a
    fresh retry budget. A dead one-off job is due again at once and its next claim
    makes the run (within a poll interval); if none shows within a few seconds,
    the job is printed instead.
    """
    client = connect()
    replayed = call(lambda: client.replay_run(run_id))
    deadline = time.monotonic() + REPLAY_LOOK_S
    while True:
        attempt = call(lambda: _new_attempt(client, replayed))
        if attempt is not None:
            click.echo(json.dumps(attempt.raw, indent=2) if as_json else _run_rows([attempt]))
            return
        if time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    job = call(lambda: client.get_job(replayed.job_id))
    click.echo(
        f"punctual: run {replayed.id} replayed; job {job.id} is {job.state}, due again now: "
        f"its new attempt shows in `punctual jobs runs {job.id}` once claimed",
        err=True,
    )
    _show_job(job, as_json)


def _new_attempt(client, replayed):
    """The run the replay made: the job's newest run of the same occurrence, newer than
    the replayed one (a job's history is listed newest first), or None yet."""
    for run in client.list_runs(replayed.job_id, limit=100).items:
        if run.id == replayed.id:
            return None
        if run.scheduled_for == replayed.scheduled_for:
            return run
    return None


COMMANDS = [dead_letters, runs]
