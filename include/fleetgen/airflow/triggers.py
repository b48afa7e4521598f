"""Deferrable readiness: a trigger that watches one server's log and HTTP endpoints.

The triggerer (not a worker slot) holds the wait during a model load that can take many minutes.
Each poll reads the tail of the server log over SSH (asyncssh, via the SSH provider's async hook)
and checks the process is alive; a fatal SGLang line ends the wait at once. Otherwise it polls
``/health`` and ``/model_info``; when both answer it reads ``/server_info`` and reports the
effective limits. Every kwarg is JSON-safe so the trigger serialises.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from fleetgen.nodes import remote
from fleetgen.errors import FailureKind
from fleetgen.nodes import readiness

LOG_TAIL_LINES = 50
_ALIVE_MARK = "@@fleetgen:alive="


class ReadinessTrigger(BaseTrigger):
    def __init__(self, *, server: dict, ssh_conn_id: str, log_path: str, pid: int, timeout_s: float,
                 poll_s: float = 1.0, api_key_conn_id: str | None = None, started_at: float | None = None,
                 context: dict | None = None) -> None:
        super().__init__()
        self.server = server
        self.ssh_conn_id = ssh_conn_id
        self.log_path = log_path
        self.pid = int(pid)
        self.timeout_s = float(timeout_s)
        self.poll_s = float(poll_s)
        self.api_key_conn_id = api_key_conn_id
        self.started_at = float(started_at if started_at is not None else time.time())
        self.context = context or {}  # opaque JSON state handed back in the event (plan, attempt)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{self.__class__.__module__}.{self.__class__.__qualname__}", {
            "server": self.server, "ssh_conn_id": self.ssh_conn_id, "log_path": self.log_path, "pid": self.pid,
            "timeout_s": self.timeout_s, "poll_s": self.poll_s, "api_key_conn_id": self.api_key_conn_id,
            "started_at": self.started_at, "context": self.context,
        })

    async def _api_headers(self) -> dict[str, str]:
        if not self.api_key_conn_id:
            return {}
        from airflow.sdk import BaseHook

        connection = await asyncio.to_thread(BaseHook.get_connection, self.api_key_conn_id)
        return {"Authorization": f"Bearer {connection.password}"}

    def _event(self, status: str, **payload) -> TriggerEvent:
        return TriggerEvent({"status": status, "server": self.server, "log_path": self.log_path, "pid": self.pid,
                             "waited_s": round(time.time() - self.started_at, 1), "context": self.context,
                             **payload})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        import httpx
        from airflow.providers.ssh.hooks.ssh import SSHHookAsync

        headers = await self._api_headers()
        command = (remote.tail_command(self.log_path, LOG_TAIL_LINES) +
                   f"; echo {_ALIVE_MARK}$(kill -0 {self.pid} 2>/dev/null && echo 1 || echo 0)")
        log_lines: list[str] = []
        ssh = None
        try:
            ssh = await SSHHookAsync(ssh_conn_id=self.ssh_conn_id).get_conn()
        except Exception as exc:  # noqa: BLE001 - reported as an event, the operator raises with context
            yield self._event("unreachable", error=f"{exc.__class__.__name__}: {exc}")
            return
        async with httpx.AsyncClient(base_url=self.server["url"], timeout=5.0, headers=headers) as http:
            try:
                while True:
                    result = await ssh.run(command, check=False)
                    output = result.stdout or ""
                    alive = f"{_ALIVE_MARK}1" in output
                    log_lines = [line for line in output.splitlines() if not line.startswith(_ALIVE_MARK)]
                    fatal = readiness.find_fatal(log_lines)
                    if fatal is not None:
                        yield self._event("fatal", kind=fatal.kind.value, fatal_line=fatal.line, log_tail=log_lines)
                        return
                    if not alive:
                        yield self._event("fatal", kind=FailureKind.EXITED.value, fatal_line="the server process exited without "
                                          "a recognised error line", log_tail=log_lines)
                        return
                    info = await self._probe_http(http)
                    if info is not None:
                        yield self._event("ready", server_info=info, log_tail=log_lines[-5:])
                        return
                    if time.time() - self.started_at > self.timeout_s:
                        yield self._event("timeout", log_tail=log_lines)
                        return
                    await asyncio.sleep(self.poll_s)
            finally:
                ssh.close()

    async def _probe_http(self, http) -> dict | None:
        """``/server_info`` once ``/health`` is 200 and ``/model_info`` answers; else None."""
        import httpx

        try:
            health = await http.get("/health")
            if health.status_code != 200:
                return None
            model_info = await http.get("/model_info")
            if model_info.status_code != 200:
                return None
            server_info = await http.get("/server_info")
            if server_info.status_code == 404:  # older servers: the deprecated alias
                server_info = await http.get("/get_server_info")
            server_info.raise_for_status()
            info = server_info.json()
            info["_model_info"] = model_info.json()
            return info
        except (httpx.TransportError, httpx.HTTPStatusError, ValueError):
            return None
