"""/jobs: create, list, get, patch, cancel, pause, resume, trigger, backfill, a job's runs, and
the label verbs (pause, resume, cancel every job a selector matches).

Thin views: parse the request, call one service function (app.services.jobs, app.services.runs),
serialize. Errors are exceptions that app.api.problems turns into problem+json.
"""

from __future__ import annotations

from flask import Blueprint, current_app, g, request

from app.api.auth import protect
from app.api.serialize import job_json, page_json, run_json
from app.api.wire import json_body, json_response
from app.core.labels import parse_selector
from app.core.timefmt import utcnow
from app.services import backfills, jobs, runs
from app.services.pagination import parse_flag, parse_limit
from app.services.validation import validate_selector

bp = protect(Blueprint("jobs", __name__))


def _registry():
    return current_app.extensions["punctual"].registry


@bp.post("/jobs")
def create_job():
    result = jobs.create_job(
        _registry(), g.owner, json_body(), request.headers.get("Idempotency-Key"), utcnow()
    )
    body = job_json(result.job)
    headers = {"Location": f"/jobs/{body['id']}"}
    if not result.created:
        headers["Idempotent-Replayed"] = "true"
    return json_response(body, 201 if result.created else 200, headers)


@bp.get("/jobs")
def list_jobs():
    args = request.args
    # An empty parameter (`?state=&name=`, as forms send them) means no filter.
    page = jobs.list_jobs(
        _registry(),
        g.owner,
        state=args.get("state") or None,
        name=args.get("name") or None,
        limit=parse_limit(args.get("limit")),
        cursor=args.get("cursor"),
        labels=parse_selector(text for text in args.getlist("label") if text),
        keyed=parse_flag("keyed", args.get("keyed")),
    )
    return json_response(page_json(page, job_json))


@bp.put("/jobs/by-key/<key>")
def put_job(key: str):
    dry_run = parse_flag("dry_run", request.args.get("dry_run")) or False
    put = jobs.put_job(_registry(), g.owner, key, json_body(), utcnow(), dry_run=dry_run)
    body = job_json(put.job)
    headers = {"Punctual-Change": put.change}
    if put.change == "created" and not dry_run:
        headers["Location"] = f"/jobs/{body['id']}"
        return json_response(body, 201, headers)
    return json_response(body, 200, headers)


@bp.get("/jobs/by-key/<key>")
def get_job_by_key(key: str):
    return json_response(job_json(jobs.get_job_by_key(_registry(), g.owner, key)))


# Static paths: werkzeug matches them before `/jobs/<job_id>/...`, whose ids are UUIDs.
@bp.post("/jobs/pause")
def pause_selected():
    selected = jobs.pause_selected(_registry(), g.owner, validate_selector(json_body()), utcnow())
    return json_response(selected.as_dict())


@bp.post("/jobs/resume")
def resume_selected():
    selected = jobs.resume_selected(_registry(), g.owner, validate_selector(json_body()), utcnow())
    return json_response(selected.as_dict())


@bp.post("/jobs/cancel")
def cancel_selected():
    selected = jobs.cancel_selected(_registry(), g.owner, validate_selector(json_body()), utcnow())
    return json_response(selected.as_dict())


@bp.get("/jobs/<job_id>")
def get_job(job_id: str):
    return json_response(job_json(jobs.get_job(_registry(), g.owner, job_id)))


@bp.patch("/jobs/<job_id>")
def patch_job(job_id: str):
    return json_response(job_json(jobs.patch_job(_registry(), g.owner, job_id, json_body(), utcnow())))


@bp.delete("/jobs/<job_id>")
def cancel_job(job_id: str):
    return json_response(job_json(jobs.cancel_job(_registry(), g.owner, job_id, utcnow())))


@bp.post("/jobs/<job_id>/pause")
def pause_job(job_id: str):
    return json_response(job_json(jobs.pause_job(_registry(), g.owner, job_id, utcnow())))


@bp.post("/jobs/<job_id>/resume")
def resume_job(job_id: str):
    return json_response(job_json(jobs.resume_job(_registry(), g.owner, job_id, utcnow())))


@bp.post("/jobs/<job_id>/trigger")
def trigger_job(job_id: str):
    run = jobs.trigger_job(_registry(), g.owner, job_id, utcnow())
    return json_response(run_json(run), 202)


@bp.post("/jobs/<job_id>/backfill")
def backfill_job(job_id: str):
    backfilled = backfills.backfill(_registry(), g.owner, job_id, json_body(), utcnow())
    return json_response(backfilled.as_dict(), 202)


@bp.get("/jobs/<job_id>/runs")
def list_runs(job_id: str):
    args = request.args
    page = runs.list_runs(
        _registry(),
        g.owner,
        job_id,
        limit=parse_limit(args.get("limit")),
        cursor=args.get("cursor"),
        origin=args.get("origin") or None,
    )
    return json_response(page_json(page, run_json))
