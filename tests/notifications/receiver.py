"""A real HTTP server on 127.0.0.1, in a thread, that records what it is
sent and answers with the status codes a test lines up."""

from __future__ import annotations

import ssl
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    # Answers in order; the last one repeats.
    codes: list[int] = field(default_factory=lambda: [200])
    # Seconds to wait before answering (a slow receiver).
    delay_s: float = 0.0
    # Sent as Location with a 3xx answer.
    location: str = ""
    # Serve HTTPS with this context (its certificate and key loaded).
    tls: ssl.SSLContext | None = None
    received: list[Received] = field(default_factory=list)

    def __post_init__(self):
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802  (http.server's spelling)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                owner.received.append(Received(self.path, dict(self.headers.items()), body))
                code = owner.codes[min(len(owner.received), len(owner.codes)) - 1]
                if owner.delay_s:  # a slow receiver on purpose, not a wait
                    time.sleep(owner.delay_s)
                self.send_response(code)
                if owner.location:
                    self.send_header("Location", owner.location)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        if self.tls is not None:
            self.server.socket = self.tls.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
