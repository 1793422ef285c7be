"""A PgBouncer of the tests' own, in transaction pooling mode, in front of the test server."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from tests.server import free_port

BINARY = shutil.which("pgbouncer") or (
    "/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None
)


@contextmanager
def pgbouncer(host: str, port: int) -> Iterator[int]:
    """PgBouncer on a free loopback port, pooling every database of ``host:port`` per
    transaction; its port. As root it runs as ``postgres`` (it refuses to run as root)."""
    assert BINARY is not None
    folder = Path(tempfile.mkdtemp(prefix="pgbouncer-"))
    listen = free_port()
    (folder / "users.txt").write_text('"postgres" ""\n')
    (folder / "pgbouncer.ini").write_text(f"""[databases]
* = host={host} port={port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {listen}
unix_socket_dir =
auth_type = trust
auth_file = {folder / "users.txt"}
pool_mode = transaction
max_client_conn = 500
default_pool_size = 40
server_reset_query =
logfile = {folder / "pgbouncer.log"}
pidfile = {folder / "pgbouncer.pid"}
""")
    command = [BINARY, "-d", str(folder / "pgbouncer.ini")]
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres")
        for path in folder.iterdir():
            shutil.chown(path, "postgres")
        command = ["runuser", "-u", "postgres", "--", *command]
    subprocess.run(command, check=True, capture_output=True)
    try:
        for _ in range(100):
            if (folder / "pgbouncer.pid").exists():
                break
            time.sleep(0.05)
        yield listen
    finally:
        with suppress(OSError, ValueError):
            os.kill(int((folder / "pgbouncer.pid").read_text()), signal.SIGTERM)
        time.sleep(0.2)
        shutil.rmtree(folder, ignore_errors=True)
