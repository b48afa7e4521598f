import asyncio
import socket

import httpx
import pytest

from fleetgen.generate.transport import PooledTransport

pytestmark = pytest.mark.anyio


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
