"""Client commands: `punctual jobs ...` and `punctual preview`, thin over the SDK.

They talk to a running API at PUNCTUAL_URL with PUNCTUAL_API_KEY (or --url and
--api-key, after the group or the command: app.cli.connection). Output is a human
table by default, the API's JSON with --json, and only the id with `create -q`, for
scripts. An API error prints its problem (every invalid field) to stderr, exit 1.
`punctual preview` computes locally unless a server is named.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable
from typing import Any

import click

from app.cli.connection import ClientCommand, ClientGroup, call, connect, server_named

_json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print the API's JSON instead of a table."
)
_id_only_option = click.option(
    "-q", "--id-only", "id_only", is_flag=True, help="Print only the job's id (for scripts)."
)


def _client(ctx: click.Context | None = None):
    return connect(ctx)


_call = call


def _table(rows: Iterable[list[str]], header: list[str]) -> str:
    rows = [header] + [[("" if cell is None else str(cell)) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows)


def _schedule_text(schedule: dict) -> str:
    if "cron" in schedule:
        return f"cron {schedule['cron']} {schedule.get('timezone', 'UTC')}"
    if "interval_s" in schedule:
        return f"every {schedule['interval_s']}s"
    return f"once {schedule.get('run_at')}"


def _target_text(target: dict) -> str:
    if target.get("type") == "queue":
        return f"queue {target.get('topic')}"
    if target.get("type") == "postgres":
        return f"postgres {target.get('database')}"
    return f"{target.get('method', 'POST')} {target.get('url')}"


def _job_rows(jobs) -> str:
    return _table(
        (
            [
                j.id,
                j.name,
                j.state,
                j.raw["next_run_at"] or "-",
                _schedule_text(j.schedule),
                _target_text(j.target),
            ]
            for j in jobs
        ),
        ["ID", "NAME", "STATE", "NEXT RUN", "SCHEDULE", "TARGET"],
    )


def _run_rows(runs) -> str:
    return _table(
        (
            [
                r.id,
                r.raw["scheduled_for"],
                r.attempt,
                r.state,
                r.origin,
                r.status_code or "-",
                "-" if r.lateness_ms is None else f"{r.lateness_ms}ms",
                r.error or "",
            ]
            for r in runs
        ),
        ["ID", "SCHEDULED FOR", "ATTEMPT", "STATE", "ORIGIN", "STATUS", "LATENESS", "ERROR"],
    )


def _show_job(job, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(job.raw, indent=2))
    else:
        click.echo(_job_rows([job]))


def _show_page(page, as_json: bool, rows: Callable) -> None:
    if as_json:
        click.echo(
            json.dumps(
                {"items": [item.raw for item in page.items], "next_cursor": page.next_cursor}, indent=2
            )
        )
        return
    click.echo(rows(page.items))
    if page.next_cursor:
        click.echo(f"more: --cursor {page.next_cursor}", err=True)


@click.group(cls=ClientGroup)
def jobs() -> None:
    """Create, inspect and control jobs through the API."""


def _json_value(text: str | None, option: str) -> Any:
    if text is None:
        return None
    if text.startswith("@"):
        text = sys.stdin.read() if text == "@-" else open(text[1:], encoding="utf-8").read()
    try:
        return json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint=option) from None


@jobs.command("create")
@click.option(
    "--from-file",
    "from_file",
    metavar="FILE.jsonl",
    help="Create many jobs: one job body per line (- for stdin), sent 1,000 per POST /jobs/batch;"
    " an `idempotency_key` field per line makes a rerun safe. Prints one result per line.",
)
@click.option("--body", help="The whole job as JSON (or @file, @- for stdin); the options below override it.")
@click.option("--name")
@click.option("--cron", help="5 fields, or 6 with seconds first.")
@click.option("--timezone", help="IANA zone of --cron (default UTC).")
@click.option("--interval-s", type=int)
@click.option("--run-at", help="A one-off instant, RFC 3339 with an offset.")
@click.option("--start-at")
@click.option("--end-at")
@click.option("--target-url", "target_url", help="Webhook URL (http or https).")
@click.option("--method", type=click.Choice(["POST", "PUT", "GET", "DELETE", "PATCH"]))
@click.option("--header", "headers", multiple=True, help="'Name: value', repeatable.")
@click.option("--timeout-s", type=float)
@click.option("--topic", help="Queue target: the routing key on the punctual.jobs exchange.")
@click.option("--payload", help="JSON (or @file).")
@click.option("--max-attempts", type=int)
@click.option("--backoff-s", type=float)
@click.option("--max-backoff-s", type=float)
@click.option("--misfire", type=click.Choice(["run_once", "run_all", "skip"]))
@click.option("--gap", type=click.Choice(["shift", "skip"]))
@click.option("--overlap", type=click.Choice(["once", "twice"]))
@click.option("--jitter-s", type=int)
@click.option("--label", "labels", multiple=True, help="'key:value', repeatable: the job's labels.")
@click.option(
    "--overlap-policy",
    type=click.Choice(["buffer_one", "skip", "allow"]),
    help="An occurrence due while a run is in flight: waits for it (buffer_one, the default),"
    " is skipped, or runs too (allow).",
)
@click.option("--idempotency-key", help="Repeat the command with the same key to get the same job.")
@_json_option
@_id_only_option
@click.pass_context
def create(
    ctx: click.Context,
    from_file,
    body,
    name,
    cron,
    timezone,
    interval_s,
    run_at,
    start_at,
    end_at,
    target_url,
    method,
    headers,
    timeout_s,
    topic,
    payload,
    max_attempts,
    backoff_s,
    max_backoff_s,
    misfire,
    gap,
    overlap,
    jitter_s,
    labels,
    overlap_policy,
    idempotency_key,
    as_json,
    id_only,
) -> None:
    """Create a job; prints it (-q: its id only). With --from-file, every job of a JSON Lines file."""
    if as_json and id_only:
        raise click.UsageError("give --json or --id-only, not both")
    if from_file is not None:
        given = [
            name
            for name, value in ctx.params.items()
            if name not in ("from_file", "as_json", "id_only") and value not in (None, (), False)
        ]
        if given:
            option = "--" + given[0].replace("_", "-")
            raise click.UsageError(f"--from-file takes the jobs from the file; drop {option}")
        _create_from_file(_client(ctx), from_file, as_json, id_only)
        return
    job = _json_value(body, "--body") or {}
    if not isinstance(job, dict):
        raise click.BadParameter("must be a JSON object", param_hint="--body")
    if name is not None:
        job["name"] = name
    schedule = {
        "cron": cron,
        "timezone": timezone,
        "interval_s": interval_s,
        "run_at": run_at,
        "start_at": start_at,
        "end_at": end_at,
    }
    if any(value is not None for value in schedule.values()):
        job["schedule"] = {k: v for k, v in schedule.items() if v is not None}
    if target_url is not None or topic is not None:
        job["target"] = (
            {"type": "queue", "topic": topic} if topic is not None else {"type": "webhook", "url": target_url}
        )
    target = job.get("target") if isinstance(job.get("target"), dict) else None
    for key, value in (("method", method), ("timeout_s", timeout_s)):
        if value is not None and target is not None:
            target[key] = value
    if headers and target is not None:
        target["headers"] = dict(_header(h) for h in headers)
    if payload is not None:
        job["payload"] = _json_value(payload, "--payload")
    retry = {
        k: v
        for k, v in (
            ("max_attempts", max_attempts),
            ("backoff_s", backoff_s),
            ("max_backoff_s", max_backoff_s),
        )
        if v is not None
    }
    if retry:
        job["retry"] = retry
    dst = {k: v for k, v in (("gap", gap), ("overlap", overlap)) if v is not None}
    if dst:
        job["dst"] = dst
    if misfire is not None:
        job["misfire"] = misfire
    if jitter_s is not None:
        job["jitter_s"] = jitter_s
    if labels:
        job["labels"] = _labels(labels)
    if overlap_policy is not None:
        job["overlap"] = overlap_policy
    client = _client(ctx)
    created = _call(lambda: client.create_job_from(job, idempotency_key=idempotency_key))
    if id_only:
        click.echo(created.id)
    else:
        _show_job(created, as_json)


BATCH_SIZE = 1000  # the most POST /jobs/batch takes


def _create_from_file(client, source: str, as_json: bool, id_only: bool = False) -> None:
    """One job per line (blank lines skipped), sent 1,000 at a time; one answer line per job
    (with `id_only`, the id of each job that exists, and the failures on stderr).

    A line that is not JSON stops the command (exit 2) before its batch is sent;
    batches before it were sent, so give each job an `idempotency_key` to rerun the
    file safely. Exit 1 when any job failed.
    """
    counts = {"created": 0, "existing": 0, "failed": 0}
    pending: list[tuple[int, Any]] = []

    def send() -> None:
        results = _call(lambda: client.create_jobs([job for _, job in pending]))
        for (line, _), result in zip(pending, results, strict=True):
            counts["created" if result.created else "existing" if result.ok else "failed"] += 1
            if id_only and result.job is not None:
                click.echo(result.job.id)
            else:
                _show_line(line, result, as_json, err=id_only)
        pending.clear()

    with click.open_file(source, encoding="utf-8") as stream:
        for line, text in enumerate(stream, 1):
            if not text.strip():
                continue
            try:
                pending.append((line, json.loads(text)))
            except ValueError as exc:
                click.echo(f"punctual: {source} line {line} is not JSON: {exc}", err=True)
                sys.exit(2)
            if len(pending) == BATCH_SIZE:
                send()
    if pending:
        send()
    click.echo(
        f"created {counts['created']}, existing {counts['existing']}, failed {counts['failed']}", err=True
    )
    if counts["failed"]:
        sys.exit(1)


def _show_line(line: int, result, as_json: bool, err: bool = False) -> None:
    if as_json:
        answer = {"line": line, "status": result.status}
        if result.job is not None:
            answer["job"] = result.job.raw
        else:
            answer["problem"] = result.raw.get("problem")
        click.echo(json.dumps(answer))
    elif result.job is not None:
        click.echo(f"line {line}: {result.status} {result.job.id} {result.job.name}")
    else:
        error = result.error
        fields = "; ".join(f"{e.field}: {e.message}" for e in error.errors)
        why = f"{error.title}: {error.detail}" + (f" ({fields})" if fields else "")
        click.echo(f"line {line}: {result.status} {why}", err=err)


def _labels(texts: Iterable[str], option: str = "--label") -> dict[str, str]:
    """Repeated `--label key:value` options as a labels object."""
    labels: dict[str, str] = {}
    for text in texts:
        key, sep, value = text.partition(":")
        if not sep or not key:
            raise click.BadParameter(f"{text!r} is not key:value", param_hint=option)
        labels[key] = value
    return labels


def _header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise click.BadParameter(f"{text!r} is not 'Name: value'", param_hint="--header")
    return name.strip(), value.strip()


@jobs.command("list")
@click.option(
    "--state", type=click.Choice(["scheduled", "running", "paused", "completed", "cancelled", "dead"])
)
@click.option("--name", help="Exact name.")
@click.option("--label", "labels", multiple=True, help="'key:value', repeatable: jobs carrying all of them.")
@click.option("--limit", type=int, help="Page size (1-500, default 100).")
@click.option("--cursor", help="Continue after a previous page.")
@click.option("--all", "every", is_flag=True, help="Follow cursors to the last page.")
@_json_option
@click.pass_context
def list_(ctx: click.Context, state, name, labels, limit, cursor, every, as_json) -> None:
    """List jobs, newest first."""
    client = _client(ctx)
    selector = _labels(labels)
    if every:
        items = _call(
            lambda: list(client.iter_jobs(state=state, name=name, labels=selector, page_size=limit or 500))
        )
        if as_json:
            click.echo(json.dumps([j.raw for j in items], indent=2))
        else:
            click.echo(_job_rows(items))
        return
    _show_page(
        _call(lambda: client.list_jobs(state=state, name=name, labels=selector, limit=limit, cursor=cursor)),
        as_json,
        _job_rows,
    )


_SCHEDULE_KINDS = ("cron", "interval_s", "run_at")


def _merged(current: dict, given: dict) -> dict:
    """`given` over `current`: PATCH replaces a field whole, so options that set part of
    one (--max-attempts of retry) keep the rest as the job has it."""
    return {**current, **{k: v for k, v in given.items() if v is not None}}


# The schedule fields each kind takes besides its own (docs/api.md "Create: `POST /jobs`"),
# and the defaults the API writes out, which carry nothing worth keeping.
_KIND_TAKES = {"cron": ("timezone", "start_at", "end_at"), "interval_s": ("start_at", "end_at"), "run_at": ()}
_KIND_NAMES = {"cron": "a cron", "interval_s": "an interval", "run_at": "a one-off"}
_SCHEDULE_DEFAULTS = {"timezone": "UTC"}


def _new_schedule(current: dict, kind: dict, bounds: dict) -> dict:
    """The whole schedule `jobs update` sends for a new --cron, --interval-s or --run-at.

    PATCH replaces `schedule` whole, so the job's timezone, start_at and end_at are
    carried into the new schedule where its kind takes them (the options given win).
    One the new kind cannot take would be lost silently: that ends the command with
    one line naming it (exit 2); --body with a whole schedule replaces it on purpose.
    """
    [(name, value)] = kind.items()
    schedule = {name: value}
    lost = []
    for field in ("timezone", "start_at", "end_at"):
        if bounds[field] is not None:
            schedule[field] = bounds[field]  # the API says if the kind does not take it
        elif current.get(field) not in (None, _SCHEDULE_DEFAULTS.get(field)):
            if field in _KIND_TAKES[name]:
                schedule[field] = current[field]
            else:
                lost.append(f"{field} {current[field]}")
    if lost:
        option = "--" + name.replace("_", "-")
        click.echo(
            f"punctual: {option} makes {_KIND_NAMES[name]} schedule, which would lose the job's "
            f"{' and '.join(lost)}; to replace the schedule whole, give it with --body "
            """'{"schedule": {...}}'""",
            err=True,
        )
        sys.exit(2)
    return schedule


@jobs.command("update")
@click.argument("job_id")
@click.option("--body", help="PATCH fields as JSON (or @file, @- for stdin); the options below override.")
@click.option("--name")
@click.option("--cron", help="A new cron schedule (5 fields, or 6 with seconds first).")
@click.option("--interval-s", type=int, help="A new interval schedule.")
@click.option("--run-at", help="A new one-off instant, RFC 3339 with an offset.")
@click.option("--timezone", help="IANA zone of the cron schedule.")
@click.option("--start-at")
@click.option("--end-at")
@click.option("--target-url", "target_url", help="A new webhook URL (http or https).")
@click.option("--topic", help="A new queue target (routing key on the punctual.jobs exchange).")
@click.option("--method", type=click.Choice(["POST", "PUT", "GET", "DELETE", "PATCH"]))
@click.option(
    "--header", "headers", multiple=True, help="'Name: value', repeatable; replaces the job's headers."
)
@click.option("--timeout-s", type=float)
@click.option("--payload", help="JSON (or @file).")
@click.option("--retry-max-attempts", "--max-attempts", "max_attempts", type=int)
@click.option("--retry-backoff-s", "--backoff-s", "backoff_s", type=float)
@click.option("--retry-max-backoff-s", "--max-backoff-s", "max_backoff_s", type=float)
@click.option("--misfire", type=click.Choice(["run_once", "run_all", "skip"]))
@click.option("--gap", type=click.Choice(["shift", "skip"]))
@click.option("--overlap", type=click.Choice(["once", "twice"]))
@click.option("--jitter-s", type=int)
@click.option("--label", "labels", multiple=True, help="'key:value', repeatable; replaces the job's labels.")
@click.option("--overlap-policy", type=click.Choice(["buffer_one", "skip", "allow"]))
@_json_option
@click.pass_context
def update(
    ctx: click.Context,
    job_id,
    body,
    name,
    cron,
    interval_s,
    run_at,
    timezone,
    start_at,
    end_at,
    target_url,
    topic,
    method,
    headers,
    timeout_s,
    payload,
    max_attempts,
    backoff_s,
    max_backoff_s,
    misfire,
    gap,
    overlap,
    jitter_s,
    labels,
    overlap_policy,
    as_json,
) -> None:
    """Change a job (PATCH): only the fields given change; prints the job.

    Options that set part of a field (--timezone, --max-attempts, --method, --gap,
    ...) keep the rest of that field as the job has it: a new --cron, --interval-s or
    --run-at keeps the job's timezone, start_at and end_at where the new kind takes
    them, and refuses (one line) to drop one it cannot take.
    """
    changes = _json_value(body, "--body") or {}
    if not isinstance(changes, dict):
        raise click.BadParameter("must be a JSON object", param_hint="--body")
    client = _client(ctx)
    current: dict | None = None

    def job() -> dict:
        nonlocal current
        if current is None:
            current = _call(lambda: client.get_job(job_id)).raw
        return current

    if name is not None:
        changes["name"] = name
    bounds = {"timezone": timezone, "start_at": start_at, "end_at": end_at}
    kind = {
        k: v for k, v in {"cron": cron, "interval_s": interval_s, "run_at": run_at}.items() if v is not None
    }
    if len(kind) > 1:
        raise click.UsageError("give one of --cron, --interval-s, --run-at")
    if kind or any(value is not None for value in bounds.values()):
        # --body's schedule, when it gives one, stands for the job's: it is the whole schedule.
        given = changes.get("schedule")
        base = given if isinstance(given, dict) else job()["schedule"]
        changes["schedule"] = _new_schedule(base, kind, bounds) if kind else _merged(base, bounds)
    if target_url is not None and topic is not None:
        raise click.UsageError("give --target-url or --topic, not both")
    target_parts = {
        "method": method,
        "timeout_s": timeout_s,
        "headers": dict(_header(h) for h in headers) if headers else None,
    }
    if topic is not None:
        changes["target"] = {"type": "queue", "topic": topic, "limits": job()["target"].get("limits")}
    elif target_url is not None or any(v is not None for v in target_parts.values()):
        base = job()["target"]
        if target_url is not None:
            base = {
                **(base if base.get("type") == "webhook" else {"limits": base.get("limits")}),
                "type": "webhook",
                "url": target_url,
            }
        changes["target"] = _merged(base, target_parts)
    if "target" in changes and isinstance(changes["target"], dict):
        changes["target"] = {k: v for k, v in changes["target"].items() if v is not None}
    if payload is not None:
        changes["payload"] = _json_value(payload, "--payload")
    retry = {"max_attempts": max_attempts, "backoff_s": backoff_s, "max_backoff_s": max_backoff_s}
    if any(v is not None for v in retry.values()):
        changes["retry"] = _merged(job()["retry"], retry)
    if gap is not None or overlap is not None:
        changes["dst"] = _merged(job()["dst"], {"gap": gap, "overlap": overlap})
    if misfire is not None:
        changes["misfire"] = misfire
    if jitter_s is not None:
        changes["jitter_s"] = jitter_s
    if labels:
        changes["labels"] = _labels(labels)
    if overlap_policy is not None:
        changes["overlap"] = overlap_policy
    if not changes:
        raise click.UsageError("nothing to change: give --body or an option (see --help)")
    _show_job(_call(lambda: client.update_job(job_id, **changes)), as_json)


def _verb(command: str, method: str, doc: str):
    @jobs.command(command, help=doc)
    @click.argument("job_id")
    @_json_option
    @click.pass_context
    def verb(ctx: click.Context, job_id: str, as_json: bool) -> None:
        client = _client(ctx)
        _show_job(_call(lambda: getattr(client, method)(job_id)), as_json)

    return verb


def _label_verb(command: str, one: str, many: str, done: str, doc: str):
    """A verb on one job (JOB_ID) or on every job carrying the --label pairs."""

    @jobs.command(command, help=doc)
    @click.argument("job_id", required=False)
    @click.option(
        "--label",
        "labels",
        multiple=True,
        help="'key:value', repeatable: every job of yours carrying all of them, instead of JOB_ID.",
    )
    @_json_option
    @click.pass_context
    def verb(ctx: click.Context, job_id: str | None, labels: tuple[str, ...], as_json: bool) -> None:
        if (job_id is None) == (not labels):
            raise click.UsageError("give JOB_ID or --label key:value, not both")
        client = _client(ctx)
        if job_id is not None:
            _show_job(_call(lambda: getattr(client, one)(job_id)), as_json)
            return
        selector = _labels(labels)
        selected = _call(lambda: getattr(client, many)(selector))
        if as_json:
            click.echo(json.dumps({"matched": selected.matched, "changed": selected.changed}))
        else:
            click.echo(f"{done} {selected.changed} of {selected.matched} matching jobs")

    return verb


get = _verb("get", "get_job", "Show one job.")
cancel = _label_verb(
    "cancel",
    "cancel_job",
    "cancel_jobs",
    "cancelled",
    "Cancel a job (or every job --label picks): no new run starts.",
)
pause = _label_verb(
    "pause",
    "pause_job",
    "pause_jobs",
    "paused",
    "Pause a job (or every job --label picks); a run in flight finishes.",
)
resume = _label_verb(
    "resume",
    "resume_job",
    "resume_jobs",
    "resumed",
    "Resume a paused job (or every job --label picks); missed occurrences follow the misfire policy.",
)


@jobs.command("trigger")
@click.argument("job_id")
@_json_option
@click.pass_context
def trigger(ctx: click.Context, job_id: str, as_json: bool) -> None:
    """Run a job once now, off-schedule; prints the new run."""
    client = _client(ctx)
    run = _call(lambda: client.trigger_job(job_id))
    click.echo(json.dumps(run.raw, indent=2) if as_json else _run_rows([run]))


@jobs.command("backfill")
@click.argument("job_id")
@click.option("--start", required=True, help="The range's first instant (RFC 3339 with an offset).")
@click.option("--end", required=True, help="The range's last instant, not after now.")
@_json_option
@click.pass_context
def backfill(ctx: click.Context, job_id: str, start: str, end: str, as_json: bool) -> None:
    """Run every occurrence of a job's schedule in a past range now, as backfill runs."""
    client = _client(ctx)
    done = _call(lambda: client.backfill_job(job_id, start, end))
    if as_json:
        first, last = (
            None if t is None else t.isoformat().replace("+00:00", "Z") for t in (done.first, done.last)
        )
        click.echo(json.dumps({"job_id": done.job_id, "count": done.count, "first": first, "last": last}))
    elif done.count:
        click.echo(
            f"backfilled {done.count} occurrences, {done.first.isoformat()} to {done.last.isoformat()}"
        )
    else:
        click.echo("backfilled 0 occurrences: the schedule has none in that range")


@jobs.command("runs")
@click.argument("job_id")
@click.option("--origin", type=click.Choice(["schedule", "trigger", "replay", "backfill"]))
@click.option("--limit", type=int)
@click.option("--cursor")
@_json_option
@click.pass_context
def runs(ctx: click.Context, job_id: str, origin, limit, cursor, as_json: bool) -> None:
    """A job's run history, newest first."""
    client = _client(ctx)
    _show_page(
        _call(lambda: client.list_runs(job_id, origin=origin, limit=limit, cursor=cursor)), as_json, _run_rows
    )


@click.command(cls=ClientCommand)
@click.argument("cron")
@click.option("--timezone", default="UTC", show_default=True, help="IANA zone the expression runs in.")
@click.option("--count", default=10, show_default=True, type=int, help="How many instants (1-100).")
@click.option("--after", help="Start after this instant (RFC 3339; default now).")
@click.option("--gap", type=click.Choice(["shift", "skip"]))
@click.option("--overlap", type=click.Choice(["once", "twice"]))
@_json_option
@click.pass_context
def preview(ctx: click.Context, cron, timezone, count, after, gap, overlap, as_json) -> None:
    """The next fire instants of a cron expression.

    In UTC and local time, with DST flags. Computed here, by the code the API
    runs, unless a server is named (--url, or PUNCTUAL_URL set): then the API
    answers, with its own time-zone data. The output is the same either way.
    """
    query = {
        "cron": cron,
        "timezone": timezone,
        "count": count,
        "after": after,
        "gap": gap,
        "overlap": overlap,
    }
    query = {k: v for k, v in query.items() if v is not None}
    if server_named(ctx):
        client = _client(ctx)
        items = _call(lambda: client.preview_schedule(**query))
    else:
        items = _local_preview(query)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "items": [
                        {
                            "at": i.at.isoformat().replace("+00:00", "Z"),
                            "local": i.local.isoformat(),
                            "dst": i.dst,
                        }
                        for i in items
                    ]
                },
                indent=2,
            )
        )
        return
    click.echo(
        _table(
            ([i.at.isoformat().replace("+00:00", "Z"), i.local.isoformat(), i.dst or ""] for i in items),
            ["UTC", "LOCAL", "DST"],
        )
    )


def _local_preview(query: dict[str, Any]) -> list:
    """GET /schedules/preview's answer, computed in this process: the same parsing, the
    same core and the same JSON, read back through the SDK's model as an answer is."""
    from app.api.problems import problem_for
    from app.api.serialize import preview_json
    from app.core.errors import ValidationError
    from app.services.previews import preview_items
    from punctual_client import PreviewItem
    from punctual_client.errors import error_for

    try:
        answer = preview_json(preview_items({k: str(v) for k, v in query.items()}))
    except ValidationError as exc:
        click.echo(f"punctual: {error_for(422, problem_for(exc))}", err=True)
        sys.exit(1)
    return [PreviewItem.from_json(item) for item in answer["items"]]


COMMANDS = [jobs, preview]
