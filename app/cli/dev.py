"""`punctual dev`: the API, beat and a worker in one command, with no external service.

Everything lives in the data dir (default ./.punctual): the SQLite registry, the
broker's folders, the dev owner's key. app.devserver does the work; see
app.devserver.supervisor for what happens on start and on Ctrl-C.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click


@click.command("dev")
@click.option(
    "--port", default=8000, show_default=True, type=click.IntRange(1, 65535), help="The API's port."
)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address the API listens on (dev mode allows private targets: keep it local).",
)
@click.option(
    "--data-dir",
    default=".punctual",
    show_default=True,
    envvar="PUNCTUAL_DATA_DIR",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where the registry, the broker folders and the dev key live [env PUNCTUAL_DATA_DIR].",
)
def dev(port: int, host: str, data_dir: Path) -> None:
    """Run the API, beat and a worker here, with no external service.

    Everything runs on the embedded registry, broker and limiter, kept in the data
    dir; Ctrl-C stops all.
    """
    from app.devserver.supervisor import run

    sys.exit(run(host, port, data_dir))


COMMANDS = [dev]
