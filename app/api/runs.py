"""/dead-letters and /runs/{id}/replay. Thin views over app.services.runs."""

from __future__ import annotations

from flask import Blueprint, current_app, g, request

from app.api.auth import protect
from app.api.serialize import dead_letter_json, page_json, run_json
from app.api.wire import json_response
from app.core.timefmt import utcnow
from app.services import runs
from app.services.pagination import parse_limit

bp = protect(Blueprint("runs", __name__))


@bp.get("/dead-letters")
def list_dead_letters():
    registry = current_app.extensions["punctual"].registry
    page = runs.list_dead_letters(
        registry, g.owner, limit=parse_limit(request.args.get("limit")), cursor=request.args.get("cursor")
    )
    return json_response(page_json(page, dead_letter_json))


@bp.post("/runs/<run_id>/replay")
def replay_run(run_id: str):
    registry = current_app.extensions["punctual"].registry
    return json_response(run_json(runs.replay_run(registry, g.owner, run_id, utcnow())), 202)
