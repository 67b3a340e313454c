"""gunicorn's gthread worker, writing the answers gunicorn makes itself as problem+json.

Named by `punctual api` in gunicorn's `worker_class` setting; kept out of
app.cli.serve so that `punctual --help` does not import gunicorn. gunicorn refuses
some requests before the API sees them: a request line over limit_request_line
(414), a header line over limit_request_field_size or more headers than
limit_request_fields (431), a request it cannot parse (400), and writes an HTML page
for each. This worker writes the same answer as every other error of the API
(docs/api.md "Errors"): application/problem+json, its detail naming the limit.
"""

from __future__ import annotations

import json
import socket
from functools import partial
from typing import Any

from gunicorn import util
from gunicorn.workers.gthread import ThreadWorker

from app.api.problems import PROBLEM_TYPE, problem_json


class ProblemWorker(ThreadWorker):
    def init_process(self) -> None:
        # gunicorn's handle_error writes every page it makes through util.write_error,
        # looked up at each call: replaced here, in each worker process, before it serves.
        util.write_error = partial(write_problem, limits=self.cfg)
        super().init_process()


def write_problem(sock: socket.socket, status_int: int, reason: str, mesg: str, limits: Any) -> None:
    """gunicorn's util.write_error(sock, status_int, reason, mesg), as problem+json."""
    if status_int == 414:
        detail = f"the request line (method, path and query) is over {limits.limit_request_line:,} bytes"
    elif status_int == 431:
        detail = (
            f"a header line is over {limits.limit_request_field_size:,} bytes,"
            f" or there are more than {limits.limit_request_fields} headers"
        )
    else:
        detail = mesg[:500] or reason
    body = json.dumps(problem_json(status_int, reason, detail)).encode("ascii")
    head = (
        f"HTTP/1.1 {status_int} {reason}\r\nConnection: close\r\nContent-Type: {PROBLEM_TYPE}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    util.write_nonblock(sock, head.encode("latin-1") + body)
