"""PostgreSQL servers of a test's own: a primary, a streaming standby, freezing and killing.

Debian's PostgreSQL binaries are used as installed (``/usr/lib/postgresql/N/bin``). As root
they run as the ``postgres`` user, as PostgreSQL requires.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from tests.server import children, free_port


def postgres_bin() -> Path | None:
    """The newest installed PostgreSQL's bin folder, if any (and a user to run it as)."""
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda path: int(path.parent.name) if path.parent.name.isdigit() else 0,
    )
    if not found:
        return None
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return None
    return found[-1]


def _run(*command: str | Path) -> None:
    argv = [str(part) for part in command]
    if os.geteuid() == 0:
        argv = ["runuser", "-u", "postgres", "--", *argv]
    subprocess.run(argv, check=True, capture_output=True, text=True)


@dataclass
class Cluster:
    """One PostgreSQL server: its data folder, port and postmaster."""

    bin: Path
    data: Path
    port: int

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        _run(
            self.bin / "pg_ctl",
            "-D",
            self.data,
            "-w",
            "-l",
            self.data / "server.log",
            "start",
            "-o",
            f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1",
        )

    def postmaster(self) -> int:
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def processes(self) -> list[int]:
        """The postmaster and every server process it started."""
        master = self.postmaster()
        return [master, *(int(pid) for pid in children(master))]

    def signal_all(self, number: int) -> None:
        for pid in self.processes():
            with suppress(ProcessLookupError):
                os.kill(pid, number)

    def kill(self) -> None:
        """SIGKILL every server process, as a machine that loses power would stop them."""
        self.signal_all(signal.SIGKILL)

    def promote(self) -> None:
        _run(self.bin / "pg_ctl", "-D", self.data, "-w", "promote")

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self.signal_all(signal.SIGCONT)  # a frozen server cannot stop
            subprocess.run(
                ["runuser", "-u", "postgres", "--"] * (os.geteuid() == 0)
                + [str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"],
                capture_output=True,
            )


@contextmanager
def clusters(standby: bool = False) -> Iterator[list[Cluster]]:
    """A primary (and, with ``standby``, a synchronous streaming standby), stopped at the end."""
    binary = postgres_bin()
    assert binary is not None
    root = Path(tempfile.mkdtemp(prefix="pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
    started: list[Cluster] = []
    try:
        primary = Cluster(binary, root / "primary", free_port())
        _run(binary / "initdb", "-D", primary.data, "-A", "trust", "-U", "postgres")
        with (primary.data / "postgresql.conf").open("a") as conf:
            conf.write(
                "max_connections = 100\nwal_level = replica\nmax_wal_senders = 4\n"
                "synchronous_commit = on\nfsync = on\n"
            )
            if standby:
                conf.write("synchronous_standby_names = 'standby'\n")
        primary.start()
        started.append(primary)
        if standby:
            replica = Cluster(binary, root / "standby", free_port())
            _run(
                binary / "pg_basebackup",
                "-h",
                "127.0.0.1",
                "-p",
                str(primary.port),
                "-U",
                "postgres",
                "-D",
                replica.data,
                "-R",
                "-X",
                "stream",
            )
            with (replica.data / "postgresql.auto.conf").open("a") as conf:
                conf.write(
                    f"primary_conninfo = 'host=127.0.0.1 port={primary.port} "
                    f"user=postgres application_name=standby'\n"
                    # promoted, it has no standby of its own to wait for
                    "synchronous_standby_names = ''\n"
                )
            replica.start()
            started.append(replica)
        yield started
    finally:
        for cluster in started:
            cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
