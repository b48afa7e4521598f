"""A lean HTTP/1.1 keep-alive transport (httpx's transport API) carrying all of a shard's requests.

httpx's default pool scans every pooled connection (with a poll() on each idle one) whenever a
request starts or ends, so its CPU cost per request grows with the number of connections: several
hundred in flight over a fleet cost milliseconds of CPU per request. Generation requests are plain
JSON POSTs to a handful of origins, so this transport keeps one stack of idle connections per
origin on asyncio protocols and parses responses itself; the cost per request is flat.

Errors are httpx's own exception types, so callers handle this transport and httpx's alike.
Timeouts: ``connect`` bounds opening a connection; ``read`` bounds the wait for the whole response
(a non-streaming completion sends nothing until it is done).
"""

from __future__ import annotations

import asyncio
import ssl
from collections import defaultdict

import httpx

_NO_BODY_STATUS = (204, 304)


class _Connection(asyncio.Protocol):
    """One TCP connection; parses one response at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.buffer = bytearray()
        self.waiter: asyncio.Future | None = None
        self.head: tuple[int, list[tuple[bytes, bytes]], bool] | None = None
        self.body_start = 0
        self.content_length = -1  # -1: until EOF; -2: chunked
        self.reused = False
        self.eof = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.waiter is None:  # bytes nobody asked for: the connection is not reusable
            self.close()
            return
        self.buffer += data
        self._try_finish()

    def eof_received(self) -> bool:
        self.eof = True
        if self.waiter is not None:
            self._try_finish()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.eof = True
        if self.waiter is not None and not self.waiter.done():
            self._try_finish()
            if not self.waiter.done():
                if self.buffer:
                    self.waiter.set_exception(httpx.ReadError(f"connection lost mid-response: {exc or 'EOF'}"))
                else:
                    self.waiter.set_exception(
                        httpx.RemoteProtocolError("Server disconnected without sending a response."))

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def start(self, loop: asyncio.AbstractEventLoop, payload: bytes) -> asyncio.Future:
        self.buffer.clear()
        self.head = None
        self.waiter = loop.create_future()
        if self.closed or self.eof:
            self.waiter.set_exception(httpx.RemoteProtocolError("Server disconnected without sending a response."))
        else:
            self.transport.write(payload)
        return self.waiter

    def _try_finish(self) -> None:
        if self.waiter.done():  # timed out: the connection is being dropped
            return
        try:
            result = self._parse()
        except httpx.RemoteProtocolError as exc:
            self.waiter.set_exception(exc)
            self.close()
            return
        if result is not None:
            self.waiter.set_result(result)

    def _parse(self) -> tuple[int, list, bytes, bool] | None:
        if self.head is None:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                if self.eof and self.buffer:
                    raise httpx.RemoteProtocolError("connection closed inside the response headers")
                return None
            self.head = self._parse_head(bytes(self.buffer[:end]))
            self.body_start = end + 4
        status, headers, keep_alive = self.head
        if self.content_length >= 0:
            end = self.body_start + self.content_length
            if len(self.buffer) < end:
                if self.eof:
                    raise httpx.RemoteProtocolError("connection closed before the response body was complete")
                return None
            return status, headers, bytes(self.buffer[self.body_start:end]), keep_alive and len(self.buffer) == end
        if self.content_length == -2:
            body = _dechunk(self.buffer, self.body_start)
            if body is None:
                if self.eof:
                    raise httpx.RemoteProtocolError("connection closed inside a chunked response")
                return None
            return status, headers, body, keep_alive
        if not self.eof:
            return None
        return status, headers, bytes(self.buffer[self.body_start:]), False

    def _parse_head(self, head: bytes) -> tuple[int, list[tuple[bytes, bytes]], bool]:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise httpx.RemoteProtocolError(f"malformed status line {lines[0][:80]!r}")
        status = int(parts[1])
        keep_alive = parts[0] == b"HTTP/1.1"
        headers = []
        self.content_length = -1
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                raise httpx.RemoteProtocolError(f"malformed header line {line[:80]!r}")
            name, value = name.strip(), value.strip()
            lowered = name.lower()
            if lowered == b"content-length":
                self.content_length = int(value)
            elif lowered == b"transfer-encoding" and b"chunked" in value.lower():
                self.content_length = -2
            elif lowered == b"connection":
                keep_alive = b"close" not in value.lower() and (keep_alive or b"keep-alive" in value.lower())
            headers.append((name, value))
        if status in _NO_BODY_STATUS or 100 <= status < 200:
            self.content_length = 0
        return status, headers, keep_alive


def _dechunk(buffer: bytearray, position: int) -> bytes | None:
    """The body of a complete chunked message starting at ``position``, or None if incomplete."""
    parts = []
    while True:
        line_end = buffer.find(b"\r\n", position)
        if line_end < 0:
            return None
        try:
            size = int(bytes(buffer[position:line_end]).split(b";")[0], 16)
        except ValueError:
            raise httpx.RemoteProtocolError("malformed chunk size") from None
        position = line_end + 2
        if size == 0:
            return b"".join(parts) if buffer.find(b"\r\n\r\n", line_end) >= 0 else None
        if len(buffer) < position + size + 2:
            return None
        parts.append(bytes(buffer[position:position + size]))
        position += size + 2


def _expire(waiter: asyncio.Future, seconds: float) -> None:
    if not waiter.done():
        waiter.set_exception(httpx.ReadTimeout(f"no complete response within {seconds} s"))


class PooledTransport(httpx.AsyncBaseTransport):
    """Keep-alive HTTP/1.1 connections, one idle stack per origin; no limit of its own.

    The dispatcher bounds in-flight requests per server, so the pool never needs to queue.
    """

    def __init__(self, *, ssl_context: ssl.SSLContext | None = None) -> None:
        self._idle: dict[tuple[bytes, str, int], list[_Connection]] = defaultdict(list)
        self._open: set[_Connection] = set()
        self._ssl_context = ssl_context

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        origin = (url.raw_scheme, url.host, url.port or (443 if url.raw_scheme == b"https" else 80))
        timeouts = request.extensions.get("timeout", {})
        try:
            body = request.content
        except httpx.RequestNotRead:
            body = await request.aread()
        payload = b"".join((request.method.encode(), b" ", url.raw_path, b" HTTP/1.1\r\n",
                            *(name + b": " + value + b"\r\n" for name, value in request.headers.raw),
                            b"\r\n", body))
        while True:
            connection = await self._checkout(origin, request, timeouts.get("connect"))
            try:
                status, headers, content, reusable = await self._exchange(connection, payload, request,
                                                                          timeouts.get("read"))
            except httpx.RemoteProtocolError:
                self._forget(connection)
                # A reused connection the server had just closed: the request never reached it.
                if connection.reused and not connection.buffer:
                    continue
                raise
            except BaseException:
                self._forget(connection)
                raise
            break
        if reusable and not connection.closed:
            connection.reused = True
            connection.waiter = None
            self._idle[origin].append(connection)
        else:
            self._forget(connection)
        return httpx.Response(status, headers=headers, content=content,
                              extensions={"http_version": b"HTTP/1.1"}, request=request)

    async def _checkout(self, origin: tuple[bytes, str, int], request: httpx.Request,
                        connect_timeout: float | None) -> _Connection:
        idle = self._idle[origin]
        while idle:
            connection = idle.pop()
            if not (connection.closed or connection.eof):
                return connection
            self._open.discard(connection)
        scheme, host, port = origin
        tls = None
        if scheme == b"https":
            tls = self._ssl_context or ssl.create_default_context()
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(connect_timeout):
                _, connection = await loop.create_connection(_Connection, host, port, ssl=tls)
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connecting to {host}:{port} timed out", request=request) from None
        except OSError as exc:
            raise httpx.ConnectError(f"cannot connect to {host}:{port}: {exc.strerror or exc}",
                                     request=request) from None
        self._open.add(connection)
        return connection

    async def _exchange(self, connection: _Connection, payload: bytes, request: httpx.Request,
                        read_timeout: float | None) -> tuple[int, list, bytes, bool]:
        loop = asyncio.get_running_loop()
        waiter = connection.start(loop, payload)
        # A plain timer costs less than an asyncio.timeout() scope on every request.
        timer = loop.call_later(read_timeout, _expire, waiter, read_timeout) if read_timeout is not None else None
        try:
            return await waiter
        except httpx.TransportError as exc:
            exc.request = request
            raise
        finally:
            if timer is not None:
                timer.cancel()

    def _forget(self, connection: _Connection) -> None:
        connection.close()
        self._open.discard(connection)

    async def aclose(self) -> None:
        for connection in list(self._open):
            connection.close()
        self._open.clear()
        self._idle.clear()
