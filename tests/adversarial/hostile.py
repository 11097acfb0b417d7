"""A hostile HTTP server for the clients' tests (issue 25 §8–9): a real ``http.server`` on a
loopback port, in a thread, answering each path with whatever the test says — HTML, a malformed
body, a field of the wrong type, a body that never ends or arrives a byte at a time."""

from __future__ import annotations

import http.server
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

# An answer: (status, headers, body) — body bytes, or an iterator of chunks sent chunked.
Answer = tuple[int, dict[str, str], bytes | Iterator[bytes]]


@dataclass
class Hostile:
    """Routes by ``METHOD path`` (query cut off) or by path alone; ``seen`` counts requests."""

    routes: dict[str, Callable[[], Answer]] = field(default_factory=dict)
    seen: Counter[str] = field(default_factory=Counter)
    sent: int = 0  # body bytes written in all
    url: str = ""
    bodies: list[bytes] = field(default_factory=list)  # request bodies, in arrival order

    def answer(self, method: str, path: str) -> Answer:
        path = path.partition("?")[0]
        self.seen[f"{method} {path}"] += 1
        for key in (f"{method} {path}", path, "*"):
            if key in self.routes:
                return self.routes[key]()
        return 404, {"Content-Type": "application/json"}, b'{"error": {"code": "nope"}}'


def serve(hostile: Hostile) -> tuple[http.server.ThreadingHTTPServer, threading.Thread]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _any(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            hostile.bodies.append(self.rfile.read(length) if length else b"")
            status, headers, body = hostile.answer(self.command, self.path)
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            try:
                if isinstance(body, bytes):
                    if "Content-Length" not in headers:
                        self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    hostile.sent += len(body)
                    return
                chunked = "Content-Length" not in headers
                if chunked:
                    self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for chunk in body:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
                    self.wfile.flush()
                    hostile.sent += len(chunk)
                if chunked:
                    self.wfile.write(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client gave up: what it should do

        do_GET = do_POST = _any

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    hostile.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, thread


def json_answer(text: str | bytes, status: int = 200) -> Callable[[], Answer]:
    data = text.encode() if isinstance(text, str) else text
    return lambda: (status, {"Content-Type": "application/json"}, data)


def html_answer(status: int = 200) -> Callable[[], Answer]:
    page = b"<html><body><h1>502 Bad Gateway</h1>" + b"<p>nginx</p>" * 50 + b"</body></html>"
    return lambda: (status, {"Content-Type": "text/html"}, page)


def endless(chunk: bytes = b"[" * 65536, *, every: float = 0.0) -> Callable[[], Answer]:
    """A chunked body that never ends (or ends when the client hangs up)."""

    def body() -> Iterator[bytes]:
        while True:
            if every:
                time.sleep(every)  # the trickle itself, not a wait for anything
            yield chunk

    return lambda: (200, {"Content-Type": "application/json"}, body())


def declared_huge() -> Answer:
    """Says 400 MB and starts sending them."""
    huge = 400 * 1024 * 1024

    def body() -> Iterator[bytes]:
        for _ in range(huge // 65536):
            yield b" " * 65536

    return 200, {"Content-Type": "application/json", "Content-Length": str(huge)}, body()


def chunked_huge() -> Answer:
    """400 MB without saying so: chunked, 64 KiB at a time."""
    return 200, {"Content-Type": "application/json"}, declared_huge()[2]


def serve_trickled_headers(
    every: float = 0.05, limit: int = 1200
) -> tuple[str, Callable[[], None]]:
    """A raw TCP server on loopback that reads a request and then sends its status line and
    headers one byte every ``every`` seconds, never reaching the blank line that ends them —
    below ``http.server``, which writes its headers whole. It gives up after ``limit`` bytes (a
    minute at the defaults) or when the client hangs up. Returns its URL and a stop function."""
    import socket

    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()
    headers = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + b"X-Slow: " + b"a" * limit

    def trickle(conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)  # the request; what it says does not matter
            for i in range(limit):
                if stop.is_set():
                    return
                try:
                    conn.sendall(headers[i : i + 1])
                except OSError:
                    return  # the client hung up: what it should do
                time.sleep(every)  # the trickle itself, not a wait for anything

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=trickle, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()

    def close() -> None:
        stop.set()
        thread.join(10)
        listener.close()

    return f"http://127.0.0.1:{listener.getsockname()[1]}", close
