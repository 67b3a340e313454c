"""`punctual --help` and every group's help: each default printed once, no summary cut.

click cuts a command's summary to fit beside its name ("graceful..."); every group
of `punctual` is a SummaryGroup, which prints the whole first sentence and wraps it.
"""

from __future__ import annotations

import re

import click
from click.testing import CliRunner

from app.cli import main
from app.cli.help import SummaryGroup
from app.settings import VARIABLES


def groups(command: click.Command, path: tuple[str, ...] = ()):
    if isinstance(command, click.Group):
        yield path, command
        for name, sub in command.commands.items():
            yield from groups(sub, path + (name,))


def test_every_group_prints_whole_summaries():
    found = list(groups(main))
    assert len(found) >= 6, "the walk found too few groups"
    for path, group in found:
        assert isinstance(group, SummaryGroup), path
        result = CliRunner().invoke(main, [*path, "--help"], terminal_width=80)
        assert result.exit_code == 0, result.output
        listing = result.output.split("Commands:\n", 1)[1].split("\n\n", 1)[0]
        assert "..." not in listing, f"punctual {' '.join(path)} --help cuts a summary:\n{listing}"
        for name, command in group.commands.items():
            first = command.get_short_help_str(limit=10_000)
            assert first and " ".join(first.split()) in " ".join(listing.split()), (path, name)


def test_the_root_summaries_fit_on_one_line():
    listing = CliRunner().invoke(main, ["--help"], terminal_width=80).output.split("Commands:\n", 1)[1]
    rows = listing.split("\n\n", 1)[0].splitlines()
    assert all(re.match(r"  \S", row) for row in rows), "a summary of `punctual --help` wraps:\n" + "\n".join(
        rows
    )


def test_each_variable_and_its_default_are_printed_once():
    text = CliRunner().invoke(main, ["--help"]).output
    for variable in VARIABLES:
        [line] = [line for line in text.splitlines() if line.strip().startswith(variable.name + " ")]
        assert len(re.findall(r"[\[(]default", line)) <= 1, line
        if variable.shown_default:
            assert line.endswith(f"[default: {variable.shown_default}]"), line
    assert "[default: -]" not in text and "(default:" not in text


def test_no_option_help_says_its_default_twice():
    def commands(command, path=()):
        yield path, command
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                yield from commands(sub, path + (name,))

    for path, _command in commands(main):
        text = CliRunner().invoke(main, [*path, "--help"], terminal_width=200).output
        for line in text.splitlines():
            assert len(re.findall(r"[\[(]default", line, re.I)) <= 1, (path, line)
