"""Running a real `accountant serve` for a test: a free port, readiness, a clean stop."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import requests

BIN = Path(sys.executable).parent / "accountant"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def children(pid: int) -> list[str]:
    """Process ids whose parent is ``pid`` (read from /proc, field 4 of stat)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[1] == str(pid):
            found.append(stat.parent.name)
    return found


def wait_ready(base: str, path: str = "/readyz", seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            if requests.get(base + path, timeout=5).status_code == 200:
                return
        except requests.RequestException:
            pass
        assert time.monotonic() < deadline, f"{base}{path} did not answer within {seconds} s"
        time.sleep(0.1)


@dataclass
class Server:
    base: str
    process: subprocess.Popen[bytes]

    def stop(self) -> int:
        """SIGTERM, as an orchestrator would; the exit status of the master."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=30)


@contextmanager
def running_service(
    env: dict[str, str], log: Path, *options: str, ready: str = "/readyz", cwd: Path | None = None
) -> Iterator[Server]:
    """`accountant serve` on a free port with ``options`` (in ``cwd``), ready when the block
    starts."""
    port = free_port()
    with log.open("w") as output:
        process = subprocess.Popen(
            [BIN, "serve", "--port", str(port), *options],
            cwd=cwd,
            env=env,
            stdout=output,
            stderr=output,
            start_new_session=True,
        )
        server = Server(f"http://127.0.0.1:{port}", process)
        try:
            wait_ready(server.base, ready)
            yield server
        finally:
            server.stop()


class SlowClients:
    """Clients that send a request's headers one line every 0.3 s and never finish them."""

    def __init__(self, base: str, count: int) -> None:
        host, port = base.removeprefix("http://").split(":")
        self.sockets = []
        for _ in range(count):
            connection = socket.create_connection((host, int(port)))
            connection.sendall(b"GET /v1/datasets HTTP/1.1\r\nHost: x\r\n")
            self.sockets.append(connection)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._drip, daemon=True)
        self.thread.start()
        time.sleep(1.0)  # every connection has reached the server and is being read

    def _drip(self) -> None:
        line = 0
        while not self.stop.wait(0.3):
            for connection in self.sockets:
                with contextlib.suppress(OSError):
                    connection.sendall(b"X-Slow-%d: 1\r\n" % line)
            line += 1

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        for connection in self.sockets:
            connection.close()
