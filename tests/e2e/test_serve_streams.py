"""``mediator serve`` stops promptly on SIGTERM even while event streams are open (issue 11 §2).

uvicorn's graceful shutdown waits for every response to finish, and an SSE stream never does on
its own; the server ends open streams first, so SIGTERM stops it cleanly (exit 0) rather than
hanging until it is killed."""

from __future__ import annotations

import socket

import pytest

from tests.e2e.servers import start_server

pytestmark = [pytest.mark.e2e, pytest.mark.db]


def test_sigterm_ends_open_event_streams_and_the_server_exits_0(dsn, tmp_path):
    server = start_server(dsn, tmp_path)
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    try:
        sock.sendall(
            b"GET /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n"
        )
        data = b""
        while b": connected" not in data:
            data += sock.recv(4096)
        assert server.process.stop(timeout=15) == 0  # killed (-9) if it had to wait for us
        while chunk := sock.recv(4096):  # the server ended the stream and closed
            data += chunk
        assert data.endswith(b"0\r\n\r\n")  # the chunked body's last chunk: a clean end
    finally:
        sock.close()
        server.process.stop()
