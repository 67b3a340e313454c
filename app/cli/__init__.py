"""The `punctual` command: operators' and scripts' entry point.

Subcommands live in small modules (app.cli.ops, app.cli.keys, app.cli.jobs,
app.cli.apply, app.cli.runs, app.cli.dev, app.cli.serve, app.cli.queues) and are
attached here; each imports its heavy dependencies only when it runs, so `punctual
--help` stays quick. Each command's first help sentence is its summary in `punctual --help`,
kept short enough that click never cuts it (tests/unit/test_cli_help.py).
"""

from __future__ import annotations

import importlib

import click

from app.cli.help import SummaryGroup
from app.settings import VARIABLES

_SUBCOMMAND_MODULES = (
    "app.cli.ops",
    "app.cli.shards",
    "app.cli.keys",
    "app.cli.jobs",
    "app.cli.apply",
    "app.cli.runs",
    "app.cli.dev",
    "app.cli.serve",
    "app.cli.queues",
    "app.cli.targets",
)


def _variables_epilog() -> str:
    width = max(len(v.name) for v in VARIABLES)
    lines = ["Configuration (environment variables, read once at start-up):", ""]
    for v in VARIABLES:
        default = f" [default: {v.shown_default}]" if v.shown_default else ""
        lines.append(f"  {v.name.ljust(width)}  {v.help}{default}")
    lines += [
        "",
        "Client commands (jobs, apply, runs, dead-letters, preview) read PUNCTUAL_URL and PUNCTUAL_API_KEY.",
    ]
    return "\n".join(lines)


class _Group(SummaryGroup):
    def format_epilog(self, ctx, formatter):
        # Keep the table's own line breaks; click would re-wrap the epilog.
        formatter.write("\n" + _variables_epilog() + "\n")


@click.group(cls=_Group)
@click.version_option(package_name="punctual")
def main() -> None:
    """Punctual: a distributed job scheduler."""


for _module_name in _SUBCOMMAND_MODULES:
    for _command in importlib.import_module(_module_name).COMMANDS:
        main.add_command(_command)
