"""`python -m app.cli` is the `punctual` command."""

from app.cli import main

main(prog_name="punctual")
