"""`punctual apply FILE`: make the owner's keyed jobs match a file, over the SDK.

The file (YAML, or JSON, which YAML reads too) lists jobs, each a `POST /jobs` body
with a `key`:

    jobs:
      - key: nightly-report
        name: nightly report
        target: {type: webhook, url: "https://reports.example/run"}
        schedule: {cron: "0 2 * * *", timezone: Europe/Berlin}

Every entry is first sent as a dry run (`PUT /jobs/by-key/{key}?dry_run=true`): the
API validates it and says whether it would create, update or leave the job, so a file
with one bad entry changes nothing and the plan lists what would differ. Then each
entry that differs is PUT for real, and with --prune every live keyed job of the
owner that the file no longer lists is cancelled. Timestamps are read as the text
written (YAML would make them datetimes, and a naive one would be sent as another
instant): the API checks them.
"""

from __future__ import annotations

import functools
import json
import sys
from typing import Any, NoReturn

import click

from app.cli.connection import ClientCommand, call, connect

# The fields of a job that a file sets, compared to say what an update changes.
FIELDS = ("name", "target", "payload", "schedule", "retry", "misfire", "dst", "jitter_s", "labels", "overlap")
LIVE_STATES = ("scheduled", "running", "paused")


def _loader():
    import yaml

    class TextTimestamps(yaml.SafeLoader):
        """SafeLoader without the timestamp type: instants stay the strings written."""

    TextTimestamps.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    return TextTimestamps


def _bad_file(source: str, why: str) -> NoReturn:
    click.echo(f"punctual: {source}: {why}", err=True)
    sys.exit(2)


def read_entries(source: str) -> list[dict[str, Any]]:
    """The file's jobs, each a dict with a string `key`, keys unique; otherwise one
    line naming the file and the entry, exit status 2, before anything is sent."""
    import yaml

    with click.open_file(source, encoding="utf-8") as stream:
        text = stream.read()
    try:
        document = yaml.load(text, Loader=_loader())  # a SafeLoader: plain data only
    except yaml.YAMLError as exc:
        _bad_file(source, f"not YAML or JSON: {' '.join(str(exc).split())}")
    if isinstance(document, dict):
        unknown = sorted(str(key) for key in document if key != "jobs")
        if unknown:
            _bad_file(source, f"unknown top-level field {unknown[0]!r}: the file holds `jobs`")
        document = document.get("jobs")
    if not isinstance(document, list):
        _bad_file(source, "must be a list of jobs, or an object with a `jobs` list")
    seen: set[str] = set()
    for index, entry in enumerate(document, 1):
        if not isinstance(entry, dict):
            _bad_file(source, f"job {index} is not an object")
        key = entry.get("key")
        if not isinstance(key, str) or not key:
            _bad_file(source, f"job {index} has no `key`: every job of the file needs one")
        if key in seen:
            _bad_file(source, f"job {index}: the key {key!r} is given twice")
        seen.add(key)
    return document


def _dry_run(client, key: str, body: dict[str, Any]):
    """What the API would do with one entry, and its problem (an APIError) if invalid."""
    from punctual_client import APIError

    try:
        return client.put_job(key, body, dry_run=True), None
    except APIError as exc:
        return None, exc


def _differs(current: dict[str, Any], planned: dict[str, Any]) -> list[str]:
    fields = [field for field in FIELDS if current.get(field) != planned.get(field)]
    if current.get("state") != planned.get("state"):
        fields.append("state")
    return fields


@click.command("apply", cls=ClientCommand)
@click.argument("file", metavar="FILE", type=click.Path(exists=True, dir_okay=False, allow_dash=True))
@click.option("--prune", is_flag=True, help="Cancel the keyed jobs of yours the file no longer lists.")
@click.option("--dry-run", is_flag=True, help="Print the plan; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per job instead of a line.")
def apply(file: str, prune: bool, dry_run: bool, as_json: bool) -> None:
    """Make your keyed jobs match a file. FILE is YAML or JSON (- for stdin): create the
    jobs it adds, update the ones that differ, and with --prune cancel those it no
    longer lists."""
    entries = read_entries(file)
    client = connect()
    current = {job.key: job for job in call(lambda: list(client.iter_jobs(keyed=True, page_size=500)))}
    plans, failed = [], False
    for entry in entries:
        key = entry["key"]
        body = {field: value for field, value in entry.items() if field != "key"}
        planned, problem = call(functools.partial(_dry_run, client, key, body))
        if problem is not None:
            failed = True
            _report(key, "invalid", [], None, as_json, problem=problem)
            continue
        fields = _differs(current[key].raw, planned.job.raw) if key in current else []
        plans.append((key, body, planned.change, fields))
    listed = {entry["key"] for entry in entries}
    stale = [job for key, job in sorted(current.items()) if key not in listed and job.state in LIVE_STATES]
    if failed:
        click.echo("punctual: the file has invalid jobs; nothing was changed", err=True)
        sys.exit(1)
    counts = {"created": 0, "updated": 0, "unchanged": 0, "cancelled": 0, "kept": 0}
    for key, body, change, fields in plans:
        job = None
        if change != "unchanged" and not dry_run:
            put = call(functools.partial(client.put_job, key, body))
            change, job = put.change, put.job
        counts[change] += 1
        _report(key, change, fields, job, as_json, dry_run=dry_run)
    for job in stale:
        if not prune:
            counts["kept"] += 1
            continue
        done = None if dry_run else call(functools.partial(client.cancel_job, job.id))
        counts["cancelled"] += 1
        _report(job.key, "cancelled", [], done, as_json, dry_run=dry_run)
    summary = ", ".join(f"{count} {change}" for change, count in counts.items() if change != "kept")
    if counts["kept"]:
        summary += f"; {counts['kept']} keyed jobs not in the file left alone (--prune cancels them)"
    click.echo(f"dry run: {summary}; nothing was changed" if dry_run else summary, err=True)


_VERBS = {"created": "create", "updated": "update", "unchanged": "same", "cancelled": "cancel"}


def _report(key, change, fields, job, as_json, dry_run=False, problem=None) -> None:
    if as_json:
        line: dict[str, Any] = {"key": key, "change": change, "fields": fields, "dry_run": dry_run}
        if job is not None:
            line["job"] = job.raw
        if problem is not None:
            line["problem"] = {
                "status": problem.status,
                "title": problem.title,
                "detail": problem.detail,
                "errors": [{"field": e.field, "message": e.message} for e in problem.errors],
            }
        click.echo(json.dumps(line))
        return
    if problem is not None:
        click.echo(f"invalid  {key}: {problem}", err=True)
        return
    detail = f"  ({', '.join(fields)})" if fields else ""
    click.echo(f"{_VERBS[change]:<8} {key}{detail}")


COMMANDS = [apply]
