"""A TCP proxy in front of a real service that can lose answers: for the requests a test
picks, it forwards the request, lets the service answer (and commit), then closes the
client's connection without a byte; or it answers 503 itself without forwarding. Every
other request passes through. One request per connection (it asks the service for
``Connection: close``), so what it does to one request touches no other."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

UNAVAILABLE = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/problem+json\r\n"
    b"Retry-After: 1\r\nConnection: close\r\nContent-Length: 83\r\n\r\n"
    b'{"type":"https://accountant.invalid/problems/unavailable","status":503,'
    b'"title":"x"}'
)


@dataclass
class Proxy:
    base: str
    #: for each request line (b"POST /v1/charges HTTP/1.1"): "drop", "503" or None to pass;
    #: the test sets it, the proxy calls it once per request
    decide: Callable[[bytes], str | None] = lambda _line: None
    seen: list[tuple[bytes, str]] = field(default_factory=list)  # (request line, what it did)


def _read_request(client: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = client.recv(65536)
        if not chunk:
            return b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        body += client.recv(65536)
    lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"connection:")]
    return b"\r\n".join([*lines, b"Connection: close"]) + b"\r\n\r\n" + body


def _serve(proxy: Proxy, client: socket.socket, upstream: tuple[str, int]) -> None:
    with client:
        request = _read_request(client)
        if not request:
            return
        line = request.split(b"\r\n", 1)[0]
        action = proxy.decide(line)
        proxy.seen.append((line, action or "pass"))
        if action == "503":
            client.sendall(UNAVAILABLE)
            return
        with socket.create_connection(upstream, timeout=30) as server:
            server.sendall(request)
            answer = b""
            while chunk := server.recv(65536):
                answer += chunk
        if action == "drop":
            # the service answered and committed; the client's connection is reset unanswered
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return
        client.sendall(answer)


@contextmanager
def dropping_proxy(upstream_base: str) -> Iterator[Proxy]:
    host, port = upstream_base.removeprefix("http://").split(":")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    proxy = Proxy(f"http://127.0.0.1:{listener.getsockname()[1]}")
    stopping = threading.Event()

    def accept() -> None:
        while not stopping.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return
            threading.Thread(
                target=_serve, args=(proxy, client, (host, int(port))), daemon=True
            ).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        stopping.set()
        listener.close()
        thread.join(timeout=5)
