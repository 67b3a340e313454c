"""The embedded Celery broker of `punctual dev`: kombu's filesystem transport, made atomic.

Why the filesystem transport: it needs no server; it routes direct exchanges (the
shard queues) and fanout, keeping bindings in files under a control folder that
every process reads; and any number of processes (beat, the worker, the relay's
publishes from the worker's threads) can publish into one folder at once, since
each message is its own file. The SQLAlchemy transport on a SQLite file was the
other candidate; it takes SQLite's single write lock (BEGIN IMMEDIATE) for every
poll of every queue, empty or not, so 16 shard queues polled ten times a second
would contend with the registry for that lock, and it never deletes a delivered
message.

Why a subclass: kombu's channel creates a message file and then writes into it,
so a consumer that lists the folder in between reads an empty file (a decode error
in the worker, and the message lost); and it takes a message by moving it to the
system temp dir, which is a copy, not an atomic rename, when /tmp is another
filesystem. Here a message is written under a hidden temporary name and renamed
into place, and a consumer takes it by renaming it into a hidden folder beside the
queue: a rename within one filesystem is atomic, so a message is seen whole or not
at all, and exactly one consumer gets it.

Folders (created on first use): `data_folder_in`/`data_folder_out` (one folder:
messages named `<ms>_<uuid>.<queue>.msg` as kombu names them, with the
milliseconds zero-padded so that they sort oldest first), its `.taken/`
subfolder, and `control_folder` (exchange bindings).
"""

from __future__ import annotations

import os
import uuid
from queue import Empty
from time import monotonic

from kombu.transport import filesystem, virtual
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

__all__ = ["Channel", "Transport", "TRANSPORT"]

# For Celery's `broker_transport` setting (a URL scheme cannot name a class).
TRANSPORT = "app.devserver.broker:Transport"

TAKEN = ".taken"  # hidden: kombu's name filter (`<stem>.<queue>.msg`) never matches it


class Channel(filesystem.Channel):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # kombu expects the folders to exist; `punctual dev` starts from an empty data dir.
        for folder in (
            self.data_folder_in,
            self.data_folder_out,
            self.control_folder,
            os.path.join(self.data_folder_in, TAKEN),
        ):
            os.makedirs(folder, exist_ok=True)

    # kombu's own filesystem.Channel names the argument `payload`, AbstractChannel `message`:
    # no name satisfies both, so keep the direct parent's.
    def _put(self, queue, payload, **kwargs):  # type: ignore[override]
        """Write the message whole under a temporary name, then rename it into the queue."""
        folder = self.data_folder_out
        # Zero-padded, unlike kombu's, so that names sort by time whatever the digit count.
        name = f"{int(round(monotonic() * 1000)):015d}_{uuid.uuid4()}.{queue}.msg"
        temporary = os.path.join(folder, f".{uuid.uuid4()}.part")
        try:
            with open(temporary, "wb") as f:
                f.write(str_to_bytes(dumps(payload)))
            os.replace(temporary, os.path.join(folder, name))
        except OSError as exc:
            raise filesystem.ChannelError(f"cannot add a message to {folder!r}: {exc}") from exc

    def _get(self, queue, timeout=None):  # kombu's signature; a file is there or not
        """Take the oldest message of `queue` by renaming it into `.taken/` (one taker wins)."""
        folder = self.data_folder_in
        taken = os.path.join(folder, TAKEN)
        wanted = f"{queue}.msg"
        for filename in sorted(os.listdir(folder)):
            if filename.partition(".")[2] != wanted:
                continue
            mine = os.path.join(taken, filename)
            try:
                os.rename(os.path.join(folder, filename), mine)
            except FileNotFoundError:
                continue  # another consumer took it first
            try:
                with open(mine, "rb") as f:
                    payload = f.read()
            finally:
                os.remove(mine)
            return loads(bytes_to_str(payload))
        raise Empty()


class Transport(filesystem.Transport):
    Channel = Channel
    driver_name = "punctual-filesystem"
    # No host to connect to: without this kombu warns on every connection that it
    # "reverts to localhost", which means nothing for a folder.
    default_connection_params = {"port": 0, "hostname": ""}

    _states: dict[str, virtual.BrokerState] = {}

    def __init__(self, client, **kwargs):
        super().__init__(client, **kwargs)
        # kombu caches which bindings exist once per process, but the bindings
        # themselves are files in a control folder: a second set of folders in
        # the same process (tests) would be told its bindings exist, and its
        # messages would be routed nowhere. One cache per control folder.
        folder = os.path.abspath(client.transport_options.get("control_folder", "control"))
        self.state = self._states.setdefault(folder, virtual.BrokerState())
