"""A private single-member etcd for tests and development: free ports, a temp data dir.

Tests start their own etcd this way (as they create their own databases) rather
than relying on a system service; ``etcd`` comes from Debian's ``etcd-server``
(``scripts/install-system-deps.sh``).

Invariants: the process is a child of the caller, listens on 127.0.0.1 only,
and :meth:`LocalEtcd.stop` ends it (SIGTERM, then SIGKILL) and removes nothing
it did not create (the data dir is the caller's).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

from shardgate.errors import FailedPrecondition, Unavailable

#: seconds a fresh member may take to elect itself and answer
START_TIMEOUT_S = 30.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


class LocalEtcd:
    """One ``etcd`` process serving ``url`` (``etcd://127.0.0.1:PORT``)."""

    def __init__(self, data_dir: Path, port: int, peer_port: int) -> None:
        self.data_dir = data_dir
        self.port = port
        self.peer_port = peer_port
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The store URL without a prefix; add ``/prefix`` per test or cluster."""
        return f"etcd://127.0.0.1:{self.port}"

    @classmethod
    def start(cls, data_dir: Path) -> LocalEtcd:
        """Start etcd with its data in ``data_dir``; return once it serves requests."""
        data_dir.mkdir(parents=True, exist_ok=True)
        etcd = cls(data_dir, _free_port(), _free_port())
        etcd.restart()
        return etcd

    def restart(self) -> None:
        """(Re)start the process on the same ports and data; return once it serves."""
        binary = shutil.which("etcd")
        if binary is None:
            raise FailedPrecondition(
                "etcd is not installed; run scripts/install-system-deps.sh as root "
                "(Debian package etcd-server)")
        self.stop()
        client, peer = self.port, self.peer_port
        log_path = self.data_dir / "etcd.log"
        log_path.write_bytes(b"")
        with log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [binary, "--name", "sg", "--data-dir", str(self.data_dir / "data"),
                 "--listen-client-urls", f"http://127.0.0.1:{client}",
                 "--advertise-client-urls", f"http://127.0.0.1:{client}",
                 "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                 "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                 "--initial-cluster", f"sg=http://127.0.0.1:{peer}",
                 # a lone member: a short election
                 "--heartbeat-interval", "50", "--election-timeout", "500"],
                stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = log_path.read_text(errors="replace")[-2000:]
                raise Unavailable(f"etcd did not start (port {client}): {tail}")
            time.sleep(0.05)

    def _ready(self) -> bool:
        # etcd logs this once the member has a leader and serves its client port
        log = (self.data_dir / "etcd.log").read_bytes()
        return b"ready to serve client requests" in log and _answers(self.port)

    def stop(self) -> None:
        """End the process (SIGTERM, SIGKILL after 5 s)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def kill(self) -> None:
        """SIGKILL the process (as a crash or a lost host would end it)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
