"""A pod entry point as a hostile tenant might write it, on 127.0.0.1: what it answers (status,
payload) and how slowly (``delay`` seconds per 64 bytes) is set per test."""
from __future__ import annotations

import http.server
import threading
import time
from contextlib import contextmanager


class _Pod(http.server.BaseHTTPRequestHandler):
    """A pod entry point as a hostile tenant might write it: what it answers is set per test."""

    answer: tuple[int, bytes] = (200, b"")
    delay = 0.0
    seen: list = []

    def do_GET(self):  # noqa: N802
        self._reply()

    def do_POST(self):  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        type(self).seen.append((self.path, self.headers.get("Authorization"), self.rfile.read(length)))
        self._reply()

    def _reply(self):
        status, payload = self.answer
        self.send_response(status)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        for i in range(0, len(payload), 64):
            self.wfile.write(payload[i:i + 64])
            self.wfile.flush()
            time.sleep(self.delay)

    def log_message(self, *_):
        pass


@contextmanager
def fake_pod(status: int, payload: bytes, delay: float = 0.0):
    handler = type("Pod", (_Pod,), {"answer": (status, payload), "delay": delay, "seen": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1], handler
    finally:
        server.shutdown()
        server.server_close()
