"""A network namespace that a worker runs in, and that can be cut off: a partition.

The machine's Postgres, RabbitMQ and Redis listen on 127.0.0.1 only, and they are
shared, so they are not reconfigured. Instead a veth pair joins the namespace to
this host on a /30 of 198.18.0.0/15 (the benchmark range: it exists on this machine
only), and one `socat` per service listens on the host's end and forwards to
127.0.0.1. A worker in the namespace reaches every service (and the sink) at the
host end's address; `cut()` sets the host end of the link down (packets are dropped,
nothing is reset, as in a real partition) and `mend()` sets it up again.

`Partition.available()` says why it cannot be made here (no `ip netns`, no socat,
not allowed), so the test skips with that reason.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import time


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=20)


class Partition:
    def __init__(self, ports: list[int]):
        self.tag = f"{random.randrange(16**6):06x}"
        self.netns = f"pt-{self.tag}"
        self.host_if, self.ns_if = f"pth{self.tag}", f"ptn{self.tag}"
        block = random.randrange(1, 16000) * 4  # a /30 inside 198.18.0.0/15
        base = (198 << 24) | (18 << 16) | block
        self.host_ip = ".".join(str((base + 1) >> s & 255) for s in (24, 16, 8, 0))
        self.ns_ip = ".".join(str((base + 2) >> s & 255) for s in (24, 16, 8, 0))
        self.ports = ports
        self._forwarders: list[subprocess.Popen] = []

    @staticmethod
    def available() -> str | None:
        """None when a namespace can be made here, else why not."""
        for tool in ("ip", "socat"):
            if shutil.which(tool) is None:
                return f"`{tool}` is not installed"
        probe = f"pt-probe{random.randrange(10**6)}"
        made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
        if made.returncode != 0:
            return f"`ip netns add` failed: {made.stderr.strip()}"
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
        return None

    def __enter__(self) -> Partition:
        try:
            _ip("netns", "add", self.netns)
            _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
            _ip("link", "set", self.ns_if, "netns", self.netns)
            _ip("addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
            _ip("link", "set", self.host_if, "up")
            _ip("netns", "exec", self.netns, "ip", "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_if)
            _ip("netns", "exec", self.netns, "ip", "link", "set", self.ns_if, "up")
            _ip("netns", "exec", self.netns, "ip", "link", "set", "lo", "up")
            for port in self.ports:
                listen = f"TCP-LISTEN:{port},bind={self.host_ip},fork,reuseaddr"
                quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
                self._forwarders.append(subprocess.Popen(["socat", listen, f"TCP:127.0.0.1:{port}"], **quiet))
            time.sleep(0.3)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *_exc) -> None:
        for proc in self._forwarders:
            proc.kill()
            proc.wait(5)
        # Deleting the namespace deletes its end of the pair, and with it the host's end.
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True)

    @property
    def exec_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.netns]

    def cut(self) -> None:
        _ip("link", "set", self.host_if, "down")

    def mend(self) -> None:
        _ip("link", "set", self.host_if, "up")
        # The address is kept while the link is down; its route comes back with the link.
        time.sleep(0.2)
