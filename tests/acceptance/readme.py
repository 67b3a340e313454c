"""The README's tested blocks: fenced code blocks marked with `<!-- tested: NAME -->`.

A marker is an HTML comment (invisible on GitHub) on the line right before the
opening fence; `blocks()` returns each marked block's text by name, exactly as
written. Tests run these texts as they are, so the README cannot drift from what
works.
"""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"

_BLOCK = re.compile(
    r"^<!-- tested: (?P<name>[\w.-]+) -->\n```[^\n]*\n(?P<text>.*?)^```$", re.MULTILINE | re.DOTALL
)


def blocks(text: str | None = None) -> dict[str, str]:
    text = README.read_text(encoding="utf-8") if text is None else text
    found: dict[str, str] = {}
    for match in _BLOCK.finditer(text):
        name = match["name"]
        if name in found:
            raise ValueError(f"README.md: two blocks are marked {name!r}")
        found[name] = match["text"].rstrip("\n")
    return found


def run_block() -> tuple[str, str]:
    """The set-up command, split into (install, serve): `pip install -e ./client -e . && punctual dev`."""
    install, _, serve = blocks()["run"].partition(" && ")
    return install.strip(), serve.strip()


def dev_command() -> str:
    """How the README starts Punctual: the part of the run block after the install."""
    return run_block()[1]
