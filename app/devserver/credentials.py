"""The dev owner of `punctual dev`: created on first start, the same key after.

The registry stores only a hash of an API key, so the key itself is kept in
`<data dir>/dev-key.json` (`{"owner", "api_key", "signing_secret"}`, mode 0600):
a restart prints the same key and secret, and scripts written against them keep
working. A key file whose key the registry does not know (the registry file was
deleted, or the key file copied from elsewhere) is replaced by a new key.

`<data dir>/dev.env` (mode 0600) sets PUNCTUAL_URL and PUNCTUAL_API_KEY for the
client commands and the SDK examples, and WEBHOOK_SIGNING_SECRET (the dev owner's
signing secret, which the README's receiver reads; not a PUNCTUAL_* name, which
the settings would refuse as unknown): `. .punctual/dev.env` in another shell.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

from app.registry.engines import Registry
from app.services.owners import NewKey, OwnerDirectory, create_key

DEV_OWNER = "dev"
KEY_FILE = "dev-key.json"
ENV_FILE = "dev.env"


def dev_key(registry: Registry, data_dir: Path) -> NewKey:
    """The dev owner's key: the stored one if the registry still accepts it, else a new one."""
    path = data_dir / KEY_FILE
    stored = _read(path)
    if stored is not None and OwnerDirectory(registry).authenticate(stored.api_key) == stored.owner:
        return stored
    new = create_key(registry, DEV_OWNER)
    write_private(path, json.dumps(new.as_dict(), indent=2) + "\n")
    return new


def write_env_file(data_dir: Path, url: str, key: NewKey) -> Path:
    """Write `dev.env` for this start (the port may differ from the last one)."""
    path = data_dir / ENV_FILE
    write_private(
        path,
        "".join(
            [
                "# Written by `punctual dev`; source it: . " + shlex.quote(str(path)) + "\n",
                f"export PUNCTUAL_URL={shlex.quote(url)}\n",
                f"export PUNCTUAL_API_KEY={shlex.quote(key.api_key)}\n",
                f"# the signing secret of owner {key.owner!r}, for a receiver's verify_signature\n",
                f"export WEBHOOK_SIGNING_SECRET={shlex.quote(key.signing_secret)}\n",
            ]
        ),
    )
    return path


def write_private(path: Path, text: str) -> None:
    """Replace `path` with `text`, readable by its owner only (0600) from the first byte."""
    temporary = path.with_name(path.name + ".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        os.fchmod(f.fileno(), 0o600)  # a leftover temporary file keeps its old mode through O_CREAT
        f.write(text)
    os.replace(temporary, path)


def _read(path: Path) -> NewKey | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return NewKey(data["owner"], data["api_key"], data["signing_secret"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
