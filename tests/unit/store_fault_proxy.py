"""A loopback HTTP proxy in front of the test store that answers what a failing S3 answers (503 SlowDown, 500) on
command, and forwards everything else unchanged (the Host header too, which the request's signature covers)."""

from __future__ import annotations

import http.server
import threading

import httpx

SLOW_DOWN = (503, b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
                  b'<Message>Please reduce your request rate.</Message></Error>')
INTERNAL = (500, b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>InternalError</Code>'
                 b'<Message>We encountered an internal error.</Message></Error>')


class FaultProxy:
    """``fail(answer, times, methods)`` makes the next ``times`` requests with one of ``methods`` get ``answer``."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request seen
        self._faults: list[tuple[tuple[int, bytes], set[str]]] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _handle(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                proxy.requests.append((self.command, self.path))
                fault = proxy._take(self.command)
                if fault is not None:
                    status, payload = fault
                    self.send_response(status)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                headers = [(name, value) for name, value in self.headers.items()
                           if name.lower() not in ("connection", "transfer-encoding")]
                answer = httpx.request(self.command, proxy.upstream + self.path, headers=headers, content=body,
                                       timeout=30)
                self.send_response(answer.status_code)
                for name, value in answer.headers.items():
                    if name.lower() not in ("connection", "transfer-encoding", "content-length",
                                            "content-encoding"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(answer.content)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def fail(self, answer: tuple[int, bytes], times: int, methods: set[str] | None = None) -> None:
        with self._lock:
            self._faults.extend([(answer, methods or {"GET", "PUT", "HEAD", "DELETE", "POST"})] * times)

    def _take(self, method: str) -> tuple[int, bytes] | None:
        with self._lock:
            for index, (answer, methods) in enumerate(self._faults):
                if method in methods:
                    del self._faults[index]
                    return answer
        return None

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
