import asyncio
import re
import socket
import ssl

import httpx
import pytest

from fleetgen.generate.transport import PooledTransport

# A transport that stops answering fails its test within a minute instead of hanging the run (a test takes ms;
# the cap is generous for a busy machine).
pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


class LoopbackServer:
    """A raw HTTP/1.1 server on 127.0.0.1 whose answer depends on the request path."""

    def __init__(self):
        self.connections = 0
        self.server = None

    async def __aenter__(self):
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc):
        self.server.close()

    async def handle(self, reader, writer):
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                body = await reader.readexactly(length)
                path = head.split(b" ")[1].decode()
                if path == "/hang":
                    await asyncio.sleep(30)
                if path == "/drop":
                    break
                if path == "/chunked":
                    writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                                 b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\n\r\n")
                elif path == "/eof":
                    writer.write(b"HTTP/1.0 200 OK\r\ncontent-type: text/plain\r\n\r\nuntil close")
                    await writer.drain()
                    break
                else:
                    extra = b"connection: close\r\n" if path == "/close" else b""
                    writer.write(b"HTTP/1.1 201 Created\r\ncontent-length: %d\r\nx-path: %s\r\n%s\r\n%s"
                                 % (len(body), path.encode(), extra, body))
                    if path in ("/close", "/once"):  # /once: closes without saying so
                        await writer.drain()
                        break
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def post(client, url, body=b"payload"):
    return await client.post(url, content=body)


async def test_keep_alive_reuses_one_connection():
    async with LoopbackServer() as server:
        async with httpx.AsyncClient(transport=PooledTransport()) as client:
            for number in range(5):
                response = await post(client, server.url + "/echo", b"body %d" % number)
                assert (response.status_code, response.content) == (201, b"body %d" % number)
                assert response.headers["x-path"] == "/echo"
        assert server.connections == 1


async def test_chunked_and_close_delimited_bodies():
    async with LoopbackServer() as server:
        async with httpx.AsyncClient(transport=PooledTransport()) as client:
            assert (await post(client, server.url + "/chunked")).content == b"hello, world"
            assert (await post(client, server.url + "/chunked")).content == b"hello, world"
            assert (await post(client, server.url + "/eof")).content == b"until close"
            assert server.connections == 1
            assert (await post(client, server.url + "/echo", b"next")).content == b"next"
        assert server.connections == 2


async def test_connection_close_and_silent_close_open_new_connections():
    async with LoopbackServer() as server:
        async with httpx.AsyncClient(transport=PooledTransport()) as client:
            assert (await post(client, server.url + "/close")).status_code == 201
            # The server closed the kept-alive connection without a word: the request is resent
            # on a fresh connection instead of failing.
            assert (await post(client, server.url + "/once")).status_code == 201
            await asyncio.sleep(0.05)
            assert (await post(client, server.url + "/once", b"again")).content == b"again"
        assert server.connections == 3


async def test_many_concurrent_requests_get_their_own_answers():
    async with LoopbackServer() as server:
        async with httpx.AsyncClient(transport=PooledTransport()) as client:
            bodies = [b"request %d" % n for n in range(60)]
            responses = await asyncio.gather(*(post(client, server.url + "/echo", body) for body in bodies))
            assert [r.content for r in responses] == bodies
            responses = await asyncio.gather(*(post(client, server.url + "/echo", body) for body in bodies))
            assert [r.content for r in responses] == bodies
        assert server.connections == 60


async def test_failures_raise_httpx_errors():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free_port = probe.getsockname()[1]
    async with LoopbackServer() as server:
        async with httpx.AsyncClient(transport=PooledTransport(), timeout=httpx.Timeout(5, read=0.2)) as client:
            with pytest.raises(httpx.ConnectError, match=f"127.0.0.1:{free_port}"):
                await post(client, f"http://127.0.0.1:{free_port}/echo")
            with pytest.raises(httpx.ReadTimeout):
                await post(client, server.url + "/hang")
            with pytest.raises(httpx.RemoteProtocolError, match="without sending a response"):
                await post(client, server.url + "/drop")
            assert (await post(client, server.url + "/echo", b"still fine")).content == b"still fine"


# --- one connection's response parsing, fed byte by byte -----------------------------------------------------

from fleetgen.generate.transport import _Connection, _dechunk, _expire  # noqa: E402


class FakeWire:
    """The asyncio transport under a connection: records what is written and whether it was closed."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def close(self) -> None:
        self.closed = True


def connected() -> tuple[_Connection, FakeWire]:
    connection, wire = _Connection(), FakeWire()
    connection.connection_made(wire)
    return connection, wire


def exchange(*pieces: bytes, eof: bool = False):
    """Start a request on a fresh connection, feed the response in pieces; the waiter and the connection."""
    connection, wire = connected()
    waiter = connection.start(asyncio.get_running_loop(), b"GET / HTTP/1.1\r\n\r\n")
    for piece in pieces:
        connection.data_received(piece)
    if eof:
        connection.eof_received()
    return waiter, connection, wire


async def test_a_response_with_a_content_length_is_complete_at_its_last_byte():
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\nX-A:  b \r\n\r\n"
    waiter, connection, wire = exchange(head, b"01234")
    assert not waiter.done() and wire.written == [b"GET / HTTP/1.1\r\n\r\n"]
    connection.data_received(b"5678")
    assert not waiter.done()
    connection.data_received(b"9")
    assert waiter.result() == (200, [(b"Content-Length", b"10"), (b"X-A", b"b")], b"0123456789", True)


async def test_headers_split_across_reads_are_joined():
    waiter, _, _ = exchange(b"HTTP/1.1 201 Created\r\ncontent-len", b"gth: 2\r\n\r", b"\nok")
    assert waiter.result() == (201, [(b"content-len" b"gth", b"2")], b"ok", True)


async def test_an_empty_body_with_content_length_zero_is_complete_at_once():
    waiter, _, _ = exchange(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
    assert waiter.result() == (200, [(b"content-length", b"0")], b"", True)


async def test_bytes_after_the_body_make_the_connection_unreusable():
    waiter, _, _ = exchange(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokEXTRA")
    assert waiter.result() == (200, [(b"content-length", b"2")], b"ok", False)


@pytest.mark.parametrize("version, connection_header, reusable", [
    (b"HTTP/1.1", None, True),
    (b"HTTP/1.1", b"close", False),
    (b"HTTP/1.1", b"Close", False),
    (b"HTTP/1.1", b"keep-alive", True),
    (b"HTTP/1.1", b"upgrade", True),
    (b"HTTP/1.0", None, False),
    (b"HTTP/1.0", b"keep-alive", True),
    (b"HTTP/1.0", b"Keep-Alive", True),
    (b"HTTP/1.0", b"keep-alive, close", False),
])
async def test_keep_alive_follows_the_version_and_the_connection_header(version, connection_header, reusable):
    extra = b"" if connection_header is None else b"Connection: " + connection_header + b"\r\n"
    waiter, _, _ = exchange(version + b" 200 OK\r\ncontent-length: 1\r\n" + extra + b"\r\nx")
    assert waiter.result()[3] is reusable


@pytest.mark.parametrize("status", [100, 101, 199, 204, 304])
async def test_statuses_without_a_body_are_complete_after_their_headers(status):
    waiter, _, _ = exchange(b"HTTP/1.1 %d X\r\ncontent-length: 5\r\n\r\n" % status)
    assert waiter.result() == (status, [(b"content-length", b"5")], b"", True)


@pytest.mark.parametrize("status", [200, 205, 303])
async def test_other_statuses_wait_for_their_body(status):
    waiter, connection, _ = exchange(b"HTTP/1.1 %d X\r\ncontent-length: 2\r\n\r\n" % status)
    assert not waiter.done()
    connection.data_received(b"ab")
    assert waiter.result()[2] == b"ab"


async def test_a_status_line_without_a_reason_is_read():
    waiter, _, _ = exchange(b"HTTP/1.1 503\r\ncontent-length: 0\r\n\r\n")
    assert waiter.result()[0] == 503


async def test_a_chunked_body_split_anywhere_is_joined_when_the_last_chunk_and_its_blank_line_arrive():
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n"
    waiter, connection, _ = exchange(head, b"5\r\nhel", b"lo\r\n", b"A;name=v\r\n0123456789\r\n")
    assert not waiter.done()
    connection.data_received(b"0\r\n")
    assert not waiter.done()  # the blank line after the last chunk is still to come
    connection.data_received(b"\r\n")
    assert waiter.result() == (200, [(b"Transfer-Encoding", b"Chunked")], b"hello0123456789", True)


async def test_a_chunked_body_with_trailers_ends_at_the_blank_line():
    waiter, connection, _ = exchange(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nx-t: 1\r\n")
    assert not waiter.done()
    connection.data_received(b"\r\n")
    assert waiter.result()[2] == b"ok"


async def test_an_empty_chunked_body():
    waiter, _, _ = exchange(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n")
    assert waiter.result()[2] == b""


async def test_a_bad_chunk_size_fails_the_request_and_drops_the_connection():
    waiter, connection, wire = exchange(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nok\r\n")
    with pytest.raises(httpx.RemoteProtocolError) as caught:
        waiter.result()
    assert str(caught.value) == "malformed chunk size"
    assert connection.closed and wire.closed


@pytest.mark.parametrize("buffer, expected", [
    (b"3\r\nabc\r\n0\r\n\r\n", b"abc"),
    (b"3\r\nabc\r\n", None),
    (b"3\r\nab", None),
    (b"3\r\nabc\r", None),
    (b"3\r\nabc\r\n0\r\n", None),
    (b"3\r\nabc\r\n0", None),
    (b"1\r\na\r\n1\r\nb\r\n0\r\n\r\n", b"ab"),
    (b"10\r\n" + b"x" * 16 + b"\r\n0\r\n\r\n", b"x" * 16),
])
def test_dechunk_returns_the_body_only_once_complete(buffer, expected):
    assert _dechunk(bytearray(b"HEAD" + buffer), 4) == expected


async def test_a_body_until_close_is_complete_at_eof_and_the_connection_not_reused():
    waiter, connection, _ = exchange(b"HTTP/1.0 200 OK\r\n\r\nuntil ", b"close")
    assert not waiter.done()
    assert connection.eof_received() is False
    assert waiter.result() == (200, [], b"until close", False)


async def test_eof_inside_the_headers_is_a_protocol_error():
    waiter, connection, wire = exchange(b"HTTP/1.1 200 OK\r\ncontent-le", eof=True)
    with pytest.raises(httpx.RemoteProtocolError) as caught:
        waiter.result()
    assert str(caught.value) == "connection closed inside the response headers"
    assert connection.closed and wire.closed


async def test_eof_before_the_whole_body_is_a_protocol_error():
    waiter, _, _ = exchange(b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nshort", eof=True)
    with pytest.raises(httpx.RemoteProtocolError) as caught:
        waiter.result()
    assert str(caught.value) == "connection closed before the response body was complete"


async def test_eof_inside_a_chunked_body_is_a_protocol_error():
    waiter, _, _ = exchange(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhel", eof=True)
    with pytest.raises(httpx.RemoteProtocolError) as caught:
        waiter.result()
    assert str(caught.value) == "connection closed inside a chunked response"


async def test_eof_before_any_byte_waits_for_the_connection_to_be_lost():
    waiter, connection, _ = exchange(eof=True)
    assert not waiter.done()
    connection.connection_lost(None)
    with pytest.raises(httpx.RemoteProtocolError) as caught:
        waiter.result()
    assert str(caught.value) == "Server disconnected without sending a response."
    assert connection.closed


@pytest.mark.parametrize("reason", [None, ConnectionResetError("reset by peer")])
async def test_a_connection_lost_mid_body_is_a_protocol_error(reason):
    waiter, connection, _ = exchange(b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nsho")
    connection.connection_lost(reason)
    with pytest.raises(httpx.RemoteProtocolError, match="connection closed before the response body was complete"):
        waiter.result()
    assert connection.closed and connection.eof


async def test_a_connection_lost_after_a_complete_until_close_body_delivers_it():
    waiter, connection, _ = exchange(b"HTTP/1.0 200 OK\r\n\r\nall of it")
    connection.connection_lost(None)
    assert waiter.result() == (200, [], b"all of it", False)


async def test_a_connection_lost_while_idle_only_marks_it_closed():
    connection, _ = connected()
    connection.connection_lost(None)
    assert connection.closed and connection.eof


@pytest.mark.parametrize("status_line", [b"HTTX/1.1 200 OK", b"HTTP/2 200 OK", b"HTTP/1.1 2OO OK", b"HTTP/1.1",
                                         b"garbage"])
async def test_a_malformed_status_line_is_a_protocol_error_quoting_it(status_line):
    waiter, connection, _ = exchange(status_line + b"\r\ncontent-length: 0\r\n\r\n")
    with pytest.raises(httpx.RemoteProtocolError, match=re.escape(f"malformed status line {status_line!r}")):
        waiter.result()
    assert connection.closed


async def test_a_long_malformed_status_line_is_quoted_to_80_bytes():
    status_line = b"X" * 100
    waiter, _, _ = exchange(status_line + b"\r\n\r\n")
    with pytest.raises(httpx.RemoteProtocolError) as caught:
        waiter.result()
    assert str(caught.value) == f"malformed status line {status_line[:80]!r}"


async def test_a_header_line_without_a_colon_is_a_protocol_error_quoting_it():
    line = b"no colon here" + b"y" * 100
    waiter, _, _ = exchange(b"HTTP/1.1 200 OK\r\n" + line + b"\r\n\r\n")
    with pytest.raises(httpx.RemoteProtocolError) as caught:
        waiter.result()
    assert str(caught.value) == f"malformed header line {line[:80]!r}"


async def test_bytes_nobody_asked_for_close_an_idle_connection():
    connection, wire = connected()
    connection.data_received(b"HTTP/1.1 200 OK\r\n\r\n")
    assert connection.closed and wire.closed and connection.buffer == bytearray()


async def test_a_second_response_on_the_same_connection_starts_afresh():
    waiter, connection, wire = exchange(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\none")
    assert waiter.result()[2] == b"one"
    second = connection.start(asyncio.get_running_loop(), b"next")
    assert wire.written[-1] == b"next" and not second.done()
    connection.data_received(b"HTTP/1.0 202 OK\r\n\r\ntwo")  # no length this time: until close
    assert not second.done()
    connection.eof_received()
    assert second.result() == (202, [], b"two", False)


@pytest.mark.parametrize("mark", ["closed", "eof"])
async def test_a_request_on_a_closed_connection_fails_at_once_without_writing(mark):
    connection, wire = connected()
    setattr(connection, mark, True)
    waiter = connection.start(asyncio.get_running_loop(), b"GET / HTTP/1.1\r\n\r\n")
    with pytest.raises(httpx.RemoteProtocolError) as caught:
        waiter.result()
    assert str(caught.value) == "Server disconnected without sending a response."
    assert wire.written == []


async def test_a_response_arriving_after_its_timeout_is_ignored():
    waiter, connection, _ = exchange(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    _expire(waiter, 0.5)
    connection.data_received(b"ok")
    connection.connection_lost(None)
    with pytest.raises(httpx.ReadTimeout, match=re.escape("no complete response within 0.5 s")):
        waiter.result()


async def test_expiring_a_finished_request_changes_nothing():
    waiter, _, _ = exchange(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
    _expire(waiter, 1.0)
    assert waiter.result()[0] == 200


# --- the pool, over an in-memory network ----------------------------------------------------------------------

class ScriptedNetwork:
    """Stands in for ``loop.create_connection``: each connection answers each request it is written with the
    next canned response of its origin (bytes, or None to close without a word)."""

    def __init__(self, loop, responses: dict[tuple[str, int], list]) -> None:
        self.loop = loop
        self.responses = responses
        self.opened: list[tuple[str, int, object]] = []
        self.wires: list = []
        self.refuse: OSError | None = None
        self.stall = False

    async def create_connection(self, factory, host, port, ssl=None):
        if self.stall:
            await asyncio.sleep(10)
        if self.refuse is not None:
            raise self.refuse
        self.opened.append((host, port, ssl))
        protocol = factory()
        network = self

        class Wire(FakeWire):
            def write(self, data):
                super().write(data)
                answer = network.responses[(host, port)].pop(0)
                if answer is None:
                    network.loop.call_soon(protocol.connection_lost, None)
                elif answer != b"":
                    network.loop.call_soon(protocol.data_received, answer)

            def close(self):
                if not self.closed:
                    super().close()
                    network.loop.call_soon(protocol.connection_lost, None)

        wire = Wire()
        self.wires.append(wire)
        protocol.connection_made(wire)
        return wire, protocol


OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


async def written(network, wires: int) -> None:
    """Until ``wires`` connections are open and each has its request written (none is answered: the state
    lasts); a loaded machine can take several loop turns past a fixed sleep to get there."""
    deadline = network.loop.time() + 30
    while not (len(network.wires) >= wires and all(wire.written for wire in network.wires)):
        assert network.loop.time() < deadline, f"{len(network.wires)} of {wires} connections written"
        await asyncio.sleep(0)


@pytest.fixture
async def network(monkeypatch):
    loop = asyncio.get_running_loop()
    scripted = ScriptedNetwork(loop, {})
    monkeypatch.setattr(loop, "create_connection", scripted.create_connection)
    return scripted


@pytest.fixture
def anyio_backend():
    return "asyncio"  # the in-memory network patches asyncio's loop


async def send(transport: PooledTransport, url: str, *, method: str = "GET", content=b"", headers=None,
               connect: float | None = 5.0, read: float | None = 5.0, extensions: dict | None = None):
    """One request straight on the transport, as the dispatcher sends it (no httpx client around it)."""
    if extensions is None:
        extensions = {"timeout": {"connect": connect, "read": read, "write": 5.0, "pool": 5.0}}
    request = httpx.Request(method, url, content=content, headers=headers, extensions=extensions)
    response = await transport.handle_async_request(request)
    await response.aread()
    return request, response


async def test_the_request_is_written_as_http_1_1_with_its_path_query_headers_and_body(network):
    network.responses[("h", 8000)] = [OK]
    request, response = await send(PooledTransport(), "http://h:8000/v1/chat?x=1&y=%20", method="POST",
                                   content=b'{"a":1}', headers={"authorization": "Bearer k"})
    assert response.status_code == 200 and response.content == b"ok"
    assert response.extensions["http_version"] == b"HTTP/1.1" and response.request is request
    assert response.headers["content-length"] == "2"
    written = network.wires[0].written[0]
    assert written.startswith(b"POST /v1/chat?x=1&y=%20 HTTP/1.1\r\nHost: h:8000\r\n")
    assert b"\r\nauthorization: Bearer k\r\n" in written and b"\r\nContent-Length: 7\r\n" in written
    assert written.endswith(b"\r\n\r\n{\"a\":1}")


async def test_a_request_without_timeouts_is_sent(network):
    network.responses[("h", 1)] = [OK]
    _, response = await send(PooledTransport(), "http://h:1/", extensions={})
    assert response.content == b"ok"


async def test_a_streamed_request_body_is_read_before_sending(network):
    network.responses[("h", 8000)] = [OK]

    async def parts():
        yield b"one,"
        yield b"two"

    _, response = await send(PooledTransport(), "http://h:8000/x", method="POST", content=parts())
    assert response.content == b"ok" and network.wires[0].written[0].endswith(b"\r\n\r\none,two")


@pytest.mark.parametrize("url, origin", [("http://h/x", ("h", 80)), ("https://h/x", ("h", 443)),
                                         ("http://h:81/x", ("h", 81)), ("https://h:8443/x", ("h", 8443))])
async def test_the_default_port_follows_the_scheme(network, url, origin):
    network.responses[origin] = [OK]
    context = ssl.create_default_context()
    await send(PooledTransport(ssl_context=context), url)
    host, port, tls = network.opened[0]
    assert (host, port) == origin
    assert tls is (context if url.startswith("https") else None)


async def test_https_without_a_context_uses_the_default_one(network):
    network.responses[("h", 443)] = [OK]
    await send(PooledTransport(), "https://h/x")
    assert isinstance(network.opened[0][2], ssl.SSLContext)


async def test_each_origin_keeps_its_own_connections(network):
    network.responses[("a", 1)] = [OK, OK]
    network.responses[("b", 1)] = [OK, OK]
    transport = PooledTransport()
    for url in ("http://a:1/", "http://b:1/", "http://a:1/", "http://b:1/"):
        assert (await send(transport, url))[1].content == b"ok"
    assert [(host, port) for host, port, _ in network.opened] == [("a", 1), ("b", 1)]
    assert len(transport._open) == 2


async def test_a_connection_the_server_closes_is_not_reused_nor_kept(network):
    closing = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok"
    network.responses[("h", 1)] = [closing, OK]
    transport = PooledTransport()
    await send(transport, "http://h:1/")
    assert network.wires[0].closed and transport._open == set()
    await send(transport, "http://h:1/")
    assert len(network.opened) == 2 and len(transport._open) == 1


@pytest.mark.parametrize("how", ["lost", "half-closed"])
async def test_an_idle_connection_found_closed_is_replaced_before_sending(network, how):
    network.responses[("h", 1)] = [OK, OK]
    transport = PooledTransport()
    await send(transport, "http://h:1/")
    (connection,) = transport._open
    if how == "lost":
        network.wires[0].close()
        await asyncio.sleep(0)  # the loss reaches the connection
    else:
        connection.eof_received()  # the server shut its side down; the socket is still open
    await send(transport, "http://h:1/")
    assert len(network.opened) == 2 and len(network.wires[0].written) == 1
    assert connection not in transport._open and len(transport._open) == 1


async def test_a_kept_alive_connection_dropped_silently_is_retried_once_on_a_fresh_one(network):
    network.responses[("h", 1)] = [OK, None, OK]
    transport = PooledTransport()
    await send(transport, "http://h:1/")
    _, response = await send(transport, "http://h:1/")
    assert response.content == b"ok" and len(network.opened) == 2
    assert len(transport._open) == 1 and network.wires[0].closed


async def test_a_fresh_connection_dropped_silently_fails_the_request(network):
    network.responses[("h", 1)] = [None, OK]
    transport = PooledTransport()
    request = httpx.Request("GET", "http://h:1/")
    with pytest.raises(httpx.RemoteProtocolError) as caught:
        await transport.handle_async_request(request)
    assert str(caught.value) == "Server disconnected without sending a response."
    assert len(network.opened) == 1 and caught.value.request is request and transport._open == set()


async def test_a_kept_alive_connection_dropped_mid_response_is_not_retried(network):
    network.responses[("h", 1)] = [OK, b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nsh", OK]
    transport = PooledTransport()
    await send(transport, "http://h:1/")
    task = asyncio.ensure_future(send(transport, "http://h:1/"))
    for _ in range(5):
        await asyncio.sleep(0)
    network.wires[0].close()
    with pytest.raises(httpx.RemoteProtocolError, match="before the response body was complete"):
        await task
    assert len(network.opened) == 1


async def test_a_kept_alive_connection_with_a_malformed_answer_is_not_retried(network):
    network.responses[("h", 1)] = [OK, b"HTTP/9 oops\r\n\r\n", OK]
    transport = PooledTransport()
    await send(transport, "http://h:1/")
    with pytest.raises(httpx.RemoteProtocolError, match="malformed status line"):
        await send(transport, "http://h:1/")
    assert len(network.opened) == 1 and network.wires[0].closed


async def test_a_refused_connection_is_a_connect_error_naming_the_origin(network):
    network.refuse = ConnectionRefusedError(111, "Connection refused")
    request = httpx.Request("GET", "http://h:7/")
    with pytest.raises(httpx.ConnectError) as caught:
        await PooledTransport().handle_async_request(request)
    assert str(caught.value) == "cannot connect to h:7: Connection refused" and caught.value.request is request
    network.refuse = OSError("no route")
    with pytest.raises(httpx.ConnectError, match="cannot connect to h:7: no route"):
        await send(PooledTransport(), "http://h:7/")


async def test_a_connection_that_takes_too_long_is_a_connect_timeout(network):
    network.stall = True
    request = httpx.Request("GET", "http://h:7/", extensions={"timeout": {"connect": 0.01}})
    with pytest.raises(httpx.ConnectTimeout) as caught:
        await PooledTransport().handle_async_request(request)
    assert str(caught.value) == "connecting to h:7 timed out" and caught.value.request is request


async def test_no_answer_within_the_read_timeout_is_a_read_timeout_and_the_connection_is_dropped(network):
    network.responses[("h", 1)] = [b"", OK]
    transport = PooledTransport()
    request = httpx.Request("GET", "http://h:1/", extensions={"timeout": {"read": 0.02}})
    with pytest.raises(httpx.ReadTimeout) as caught:
        await transport.handle_async_request(request)
    assert str(caught.value) == "no complete response within 0.02 s" and caught.value.request is request
    assert network.wires[0].closed and transport._open == set()
    assert (await send(transport, "http://h:1/"))[1].content == b"ok"
    assert len(network.opened) == 2


async def test_without_a_read_timeout_a_slow_answer_is_waited_for(network):
    network.responses[("h", 1)] = [b""]
    transport = PooledTransport()
    task = asyncio.ensure_future(send(transport, "http://h:1/", read=None))
    await asyncio.sleep(0.02)
    assert not task.done()
    network.loop.call_soon(next(iter(transport._open)).data_received, OK)
    assert (await task)[1].content == b"ok"


async def test_an_answer_in_time_is_not_expired_later(network):
    network.responses[("h", 1)] = [OK, b""]
    transport = PooledTransport()
    await send(transport, "http://h:1/", read=0.02)
    (connection,) = transport._open
    await asyncio.sleep(0.04)  # past the first request's timer
    assert not connection.closed


async def test_a_cancelled_request_drops_its_connection(network):
    network.responses[("h", 1)] = [b"", OK]
    transport = PooledTransport()
    task = asyncio.ensure_future(send(transport, "http://h:1/"))
    await written(network, 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert network.wires[0].closed and transport._open == set()
    assert (await send(transport, "http://h:1/"))[1].content == b"ok"
    assert len(network.opened) == 2


async def test_closing_the_pool_closes_idle_and_busy_connections(network):
    network.responses[("h", 1)] = [OK]
    network.responses[("g", 1)] = [b""]
    transport = PooledTransport()
    await send(transport, "http://h:1/")
    busy = asyncio.ensure_future(send(transport, "http://g:1/"))
    await written(network, 2)
    assert len(network.wires) == 2
    await transport.aclose()
    assert all(wire.closed for wire in network.wires)
    assert transport._open == set() and not transport._idle
    with pytest.raises(httpx.RemoteProtocolError):
        await busy


# --- more of the wire format ---------------------------------------------------------------------------------

async def test_a_reason_phrase_of_several_words_is_read():
    waiter, _, _ = exchange(b"HTTP/1.1 404 Not Found Here\r\ncontent-length: 0\r\n\r\n")
    assert waiter.result()[0] == 404


async def test_a_status_line_separated_by_tabs_is_malformed():
    waiter, _, _ = exchange(b"HTTP/1.1\t200\tOK\r\ncontent-length: 0\r\n\r\n")
    with pytest.raises(httpx.RemoteProtocolError, match="malformed status line"):
        waiter.result()


async def test_a_header_value_may_hold_colons():
    waiter, _, _ = exchange(b"HTTP/1.1 200 OK\r\nLocation: http://h:1/x\r\ncontent-length: 0\r\n\r\n")
    assert waiter.result()[1][0] == (b"Location", b"http://h:1/x")


async def test_only_a_chunked_transfer_encoding_makes_a_body_chunked():
    waiter, _, _ = exchange(b"HTTP/1.1 200 OK\r\nx-note: chunked\r\ntransfer-encoding: identity\r\n"
                            b"content-length: 2\r\n\r\nok")
    assert waiter.result()[2] == b"ok"


async def test_a_response_starting_with_a_blank_line_has_an_empty_malformed_status_line():
    waiter, connection, _ = exchange(b"\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
    with pytest.raises(httpx.RemoteProtocolError) as caught:
        waiter.result()
    assert str(caught.value) == "malformed status line b''"
    assert connection.closed


@pytest.mark.parametrize("later_header", [b"x-note: chunked", b"transfer-encoding: identity"])
async def test_a_header_after_the_content_length_that_is_not_a_chunked_transfer_encoding_keeps_it(later_header):
    waiter, _, _ = exchange(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n" + later_header + b"\r\n\r\nok")
    assert waiter.result()[2:] == (b"ok", True)


async def test_closing_a_connection_before_it_is_connected_only_marks_it_closed():
    connection = _Connection()
    connection.close()
    assert connection.closed
