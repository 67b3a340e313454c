"""/schedules/preview: the next fire instants of an expression, with DST flags.

The query is read and answered by app.services.previews, which `punctual preview`
also runs when it computes locally.
"""

from __future__ import annotations

from flask import Blueprint, request

from app.api.auth import protect
from app.api.serialize import preview_json
from app.api.wire import json_response
from app.services.previews import preview_items

bp = protect(Blueprint("schedules", __name__))


@bp.get("/schedules/preview")
def preview_schedule():
    return json_response(preview_json(preview_items(request.args)))
