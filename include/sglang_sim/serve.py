"""Serving: uvicorn on the configured host:port, then SGLang's warm-up (docs/sglang-memory-model.md §5.3).

The warm-up polls ``GET /model_info`` and posts ``/generate`` ("The capital city of France is",
8 tokens, temperature 0) to itself over HTTP; only then does ``/health`` answer 200 and the log say
``The server is fired up and ready to roll!``. ``--skip-server-warmup`` skips the request.

SIGTERM drains as SGLang does (``sglang/srt/managers/tokenizer_manager.py`` ``SignalHandler.sigterm_handler``,
``sigterm_watchdog``): the server logs it, ``/health`` answers 503, the requests in flight finish (new ones are
still served) with a ``Gracefully exiting...`` line on the way, then it exits 0. A hung server exits at once, as
SGLang does once its health check has failed.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal

import uvicorn

from sglang_sim.gpu_load import WRITE_INTERVAL_S, current_load, write_load
from sglang_sim.http_app import build_app
from sglang_sim.service import Service
from sglang_sim.simlog import log

# SGLang's watchdog looks every 5 s and logs each time; the simulator looks more often, so that a stop is quick,
# and logs on SGLang's period and once more when the last request is done.
DRAIN_POLL_S = 0.05
DRAIN_LOG_INTERVAL_S = 5.0
WARMUP_BODY = {"text": "The capital city of France is", "sampling_params": {"temperature": 0, "max_new_tokens": 8}}


async def _http(host: str, port: int, method: str, path: str, body: dict | None, api_key: str | None) -> int:
    reader, writer = await asyncio.open_connection(host, port)
    payload = json.dumps(body).encode() if body is not None else b""
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    headers = [f"{method} {path} HTTP/1.1", f"Host: {authority}", "Connection: close",
               f"Content-Length: {len(payload)}", "Content-Type: application/json"]
    if api_key:
        headers.append(f"Authorization: Bearer {api_key}")
    writer.write(("\r\n".join(headers) + "\r\n\r\n").encode() + payload)
    await writer.drain()
    status_line = await reader.readline()
    await reader.read()
    writer.close()
    return int(status_line.split()[1])


def internal_host(bind_host: str) -> str:
    """Where the server's own requests (the warm-up) go: ``ServerArgs.url``'s loopback of the family bound
    to ("::" serves IPv6 only under uvloop)."""
    return {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(bind_host, bind_host)


async def _warmup(server: uvicorn.Server, service: Service) -> None:
    args = service.args
    host = internal_host(args.host)
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        if not args.skip_server_warmup:
            for _ in range(120):
                if await _http(host, args.port, "GET", "/model_info", None, args.api_key) == 200:
                    break
                await asyncio.sleep(1)
            status = await _http(host, args.port, "POST", "/generate", WARMUP_BODY, args.api_key)
            if status != 200:
                raise RuntimeError(f"warmup /generate returned HTTP {status}")
    except Exception as exc:  # SGLang kills its process tree when the warm-up fails
        log(f"Initialization failed. warmup error: {exc!r}")
        server.should_exit = True
        service.warmup_failed = True
        return
    service.ready = True
    log("The server is fired up and ready to roll!")


class _Server(uvicorn.Server):
    """uvicorn's server with SGLang's SIGTERM: drain first (other signals as uvicorn handles them)."""

    def __init__(self, config: uvicorn.Config, service: Service) -> None:
        super().__init__(config)
        self.service = service

    def handle_exit(self, sig, frame) -> None:
        if sig != signal.SIGTERM:
            return super().handle_exit(sig, frame)
        # SGLang's handler runs from the event loop, which passes it no arguments
        log("SIGTERM received. signum=None frame=None. Draining requests and shutting down...")
        self.service.draining = True


async def _drain(server: uvicorn.Server, service: Service) -> None:
    """Once SIGTERM arrived: wait for the requests in flight, then stop serving."""
    while not service.draining:
        await asyncio.sleep(DRAIN_POLL_S)
    if service.hung:
        log("Signal SIGTERM received while health check failed. Force exiting.")
        server.should_exit = True
        return
    loop = asyncio.get_running_loop()
    logged_at = None
    while True:
        remaining = sorted(service.in_flight)
        if logged_at is None or not remaining or loop.time() - logged_at >= DRAIN_LOG_INTERVAL_S:
            log(f"Gracefully exiting... Remaining number of requests {len(remaining)}. "
                f"Remaining requests remaining_rids={remaining!r}.")
            logged_at = loop.time()
        if not remaining:
            break
        await asyncio.sleep(DRAIN_POLL_S)
    server.should_exit = True


async def _report_load(service: Service) -> None:
    """Keep the node's view of this server's GPU load fresh, for the fake nvidia-smi."""
    node, gpus = service.gpu_load_target
    while True:
        utilization, power_share = current_load(service)
        write_load(node, os.getpid(), gpus, utilization, power_share)
        await asyncio.sleep(WRITE_INTERVAL_S)


async def _serve(service: Service) -> int:
    args = service.args
    service.start_engines(asyncio.get_running_loop())
    reporter = asyncio.create_task(_report_load(service)) if service.gpu_load_target else None
    config = uvicorn.Config(build_app(service), host=args.host, port=args.port, log_level="warning",
                            access_log=False, lifespan="off", http="httptools", timeout_graceful_shutdown=1)
    server = _Server(config, service)
    warmup = asyncio.create_task(_warmup(server, service))
    drain = asyncio.create_task(_drain(server, service))
    await server.serve()
    warmup.cancel()
    drain.cancel()
    if reporter is not None:
        reporter.cancel()
    return 1 if service.warmup_failed or not server.started else 0


def serve(service: Service) -> int:
    try:
        import uvloop
        factory = uvloop.new_event_loop
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(_serve(service))
