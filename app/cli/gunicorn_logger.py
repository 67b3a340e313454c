"""gunicorn's logger, writing its lines (start, workers, errors) in PUNCTUAL_LOG_FORMAT.

Named by `punctual api` in gunicorn's `logger_class` setting; kept out of
app.cli.serve so that `punctual --help` does not import gunicorn.
"""

from __future__ import annotations

from gunicorn.glogging import Logger

from app.logs import ContextFilter, formatter
from app.settings import get_settings


class GunicornLogger(Logger):
    def setup(self, cfg) -> None:
        super().setup(cfg)
        for handler in self.error_log.handlers:
            handler.setFormatter(formatter(get_settings().log_format, "api"))
            handler.addFilter(ContextFilter())
