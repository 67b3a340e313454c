"""`python -m tests.snapshots --update`: rewrite the SQL snapshots (tests/snapshots)."""

from __future__ import annotations

import sys

from tests.snapshots import update


def main(argv: list[str]) -> int:
    if argv != ["--update"]:
        print("usage: python -m tests.snapshots --update", file=sys.stderr)
        return 2
    for path in update():
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
