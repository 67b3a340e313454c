"""The layout of the `punctual` help: command summaries are never cut.

click shortens a command's summary (its help's first sentence) to what fits beside
the name, cutting it mid-sentence with "..."; a SummaryGroup prints the whole
first sentence and lets the help formatter wrap it instead. Every group of the
`punctual` command is one (tests/unit/test_cli_help.py).
"""

from __future__ import annotations

import sys

import click


class SummaryGroup(click.Group):
    """A click group whose command list shows each command's first sentence whole."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit=sys.maxsize)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)
