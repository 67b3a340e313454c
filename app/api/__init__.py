"""The HTTP API: `create_app(settings)` builds the Flask application.

One blueprint per resource (jobs, batch creates, runs, schedules, ops); each view parses the
request, calls one service function and serializes the answer. Every error is
application/problem+json (app.api.problems). Per-app state lives in
`app.extensions["punctual"]`: the registry (engines per physical DSN, created
lazily so a forking server never shares a connection), the cached owner
directory and the cached registry gauges.
"""

from __future__ import annotations

from dataclasses import dataclass

from flask import Flask

from app.api import access_log, batch, jobs, ops, problems, runs, schedules
from app.api.ops import RegistryGauges
from app.api.wire import MAX_BODY_BYTES
from app.registry.engines import Registry, registry_for
from app.services.owners import OwnerDirectory
from app.settings import Settings, get_settings


@dataclass(frozen=True)
class Services:
    settings: Settings
    registry: Registry
    owners: OwnerDirectory
    gauges: RegistryGauges


def create_app(settings: Settings | None = None) -> Flask:
    """The API for `settings` (default: the process's, read from PUNCTUAL_*)."""
    settings = settings or get_settings()
    registry = registry_for(settings)
    flask_app = Flask("punctual", static_folder=None)
    flask_app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    flask_app.extensions["punctual"] = Services(
        settings, registry, OwnerDirectory(registry), RegistryGauges(registry)
    )
    access_log.install(flask_app)  # first, so its clock starts before authentication
    for blueprint in (batch.bp, jobs.bp, runs.bp, schedules.bp, ops.bp):
        flask_app.register_blueprint(blueprint)
    if settings.dev_mode:  # `punctual dev` only: the /dev/echo target
        from app.api import dev

        flask_app.register_blueprint(dev.bp)
    problems.install(flask_app)
    return flask_app
