"""Deferrable readiness: a trigger that watches one server's log and HTTP endpoints.

The triggerer (not a worker slot) holds the wait during a model load that can take many minutes.
Each poll reads the tail of the server log over SSH (asyncssh, via the SSH provider's async hook)
and checks the process is alive; a fatal SGLang line ends the wait at once. Otherwise it polls
``/health`` and ``/model_info``; when both answer it reads ``/server_info`` and reports the
effective limits. Every kwarg is JSON-safe so the trigger serialises.

One SSH connection serves the whole wait. When it drops (an sshd restart, a network blip) the
trigger reconnects within a budget (:mod:`fleetgen.nodes.reconnect`: attempts and seconds, each
reconnect logged) and keeps polling HTTP meanwhile, so a server that becomes ready while its node's
SSH is away is still seen ready. Each remote command has a timeout. Only a server that is really
dead (its fatal line, its process gone) or a spent budget fails the wait. A host key mismatch, a key
file that cannot be read and a login the node refuses are never retried (docs/security-and-ssh.md §3, §4).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from fleetgen.airflow.readiness_event import ReadinessEvent, ReadinessStatus
from fleetgen.errors import FailureKind
from fleetgen.json_types import is_json_number
from fleetgen.nodes import readiness, remote
from fleetgen.nodes.host_keys import describe, describe_public_line
from fleetgen.nodes.reconnect import (DEFAULT_COMMAND_TIMEOUT_S, DEFAULT_RECONNECT_ATTEMPTS,
                                      DEFAULT_RECONNECT_BUDGET_S, ReconnectBudget)

LOG_TAIL_LINES = 50
# Airflow 3.3 can fail a deferred task whose trigger fires within seconds of the defer: the worker's
# "success" for the defer exit, drained by the scheduler after the task has resumed, reads as a task
# killed externally (apache/airflow#72716). Holding the first event this long after the trigger starts
# keeps the resume behind that stale event; a model load takes minutes, so only an already-ready
# (kept) server waits for it.
DEFAULT_RESUME_SETTLE_S = 15.0


class ConnectionSetupError(Exception):
    """The SSH connection cannot even be attempted (no such Airflow connection, a malformed host key):
    reconnecting cannot help."""


def _connection_errors() -> tuple[type[BaseException], ...]:
    """What means the SSH connection itself broke: the trigger reconnects on these.

    ``asyncssh.Error`` covers handshake, protocol, disconnect and channel-open failures, ``OSError``
    refused or reset sockets, ``TimeoutError`` a wedged connect or command (as the SSH provider's
    remote-job trigger does).
    """
    import asyncssh

    return (OSError, asyncssh.Error, TimeoutError)


def _credentials_problem(exc: BaseException) -> tuple[str | None, str] | None:
    """``(key file or None, reason)`` when ``exc`` says the connection's credentials failed, not the network:
    the key file cannot be read (the same on every try) or the node refused the login."""
    import asyncssh

    from fleetgen.airflow.node_shell import file_error

    if isinstance(exc, asyncssh.PermissionDenied):
        return None, f"{exc}"
    if isinstance(exc, OSError) and file_error(exc):
        return file_error(exc), exc.strerror or f"{exc}"
    return None


@dataclass(frozen=True)
class WatchSettings:
    """How long and how often the trigger watches one server, and how it rides out SSH drops. Travels as
    JSON in the trigger's kwargs (``to_json``/``from_json``).

    ``timeout_s`` has no default: it is the run's ``ready_timeout_s`` (``fleetgen.airflow.run_config``),
    passed by the operator."""

    timeout_s: float  # the whole wait, from the launch
    poll_s: float = 1.0
    reconnect_attempts: int = DEFAULT_RECONNECT_ATTEMPTS
    reconnect_budget_s: float = DEFAULT_RECONNECT_BUDGET_S
    command_timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S
    resume_settle_s: float = DEFAULT_RESUME_SETTLE_S

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "WatchSettings":
        """Checked settings from JSON or rendered template values: numbers, or strings of numbers (a
        templated field or an environment variable renders as text); never ``true``, never negative."""
        known = {item.name: item.type for item in fields(cls)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ValueError(f"unknown watch settings {unknown}; known: {sorted(known)}")
        if "timeout_s" not in data:
            raise ValueError("watch settings need timeout_s (the run's ready_timeout_s)")
        return cls(**{name: _watch_number(name, value, integer=known[name] == "int")
                      for name, value in data.items()})

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _watch_number(name: str, value: Any, *, integer: bool) -> int | float:
    if not (isinstance(value, str) or is_json_number(value)):
        raise ValueError(f"watch setting {name}={value!r} is not a number")
    try:
        number = float(value)
    except ValueError:  # text that is not a number
        raise ValueError(f"watch setting {name}={value!r} is not a number") from None
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"watch setting {name}={value!r} must be a finite number >= 0")
    if integer:
        if not number.is_integer():
            raise ValueError(f"watch setting {name}={value!r} must be a whole number")
        return int(number)
    return number


class ReadinessTrigger(BaseTrigger):
    """Watch the server launched as process ``pid`` on the node behind ``ssh_conn_id`` until it is ready, its
    log shows a fatal line, its process is gone or ``watch.timeout_s`` has passed since ``started_at``."""

    def __init__(self, *, server: dict, ssh_conn_id: str, log_path: str, pid: int,
                 watch: Mapping[str, Any], api_key_conn_id: str | None = None,
                 started_at: float | None = None, context: dict | None = None) -> None:
        super().__init__()
        self.server = server
        self.ssh_conn_id = ssh_conn_id
        self.log_path = log_path
        self.pid = int(pid)
        self.watch = WatchSettings.from_json(watch)
        self.api_key_conn_id = api_key_conn_id
        self.started_at = float(started_at if started_at is not None else time.time())
        self.context = context or {}  # opaque JSON state handed back in the event (plan, attempt)
        self._log_lines: list[str] = []
        # The pre-load memory line, kept once seen: a real server logs dozens of lines (and one per health
        # check) between it and readiness, so the last tail may no longer hold it.
        self._startup_lines: list[str] = []
        self._foreign_seen = False  # another server answered on the port (warned once)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{self.__class__.__module__}.{self.__class__.__qualname__}", {
            "server": self.server, "ssh_conn_id": self.ssh_conn_id, "log_path": self.log_path, "pid": self.pid,
            "watch": self.watch.to_json(), "api_key_conn_id": self.api_key_conn_id, "started_at": self.started_at,
            "context": self.context,
        })

    async def _api_headers(self) -> dict[str, str]:
        if not self.api_key_conn_id:
            return {}
        from airflow.sdk import BaseHook

        connection = await asyncio.to_thread(BaseHook.get_connection, self.api_key_conn_id)
        return {"Authorization": f"Bearer {connection.password}"}

    def _event(self, status: ReadinessStatus, **payload) -> TriggerEvent:
        return TriggerEvent(ReadinessEvent(status=status, server=self.server, log_path=self.log_path, pid=self.pid,
                                           waited_s=round(time.time() - self.started_at, 1), context=self.context,
                                           **payload).payload())

    async def _connect(self):
        """One asyncssh connection (a seam for tests), within the command timeout."""
        from airflow.providers.ssh.hooks.ssh import SSHHookAsync

        try:
            return await asyncio.wait_for(SSHHookAsync(ssh_conn_id=self.ssh_conn_id).get_conn(),
                                          self.watch.command_timeout_s)
        except Exception as exc:
            if isinstance(exc, _connection_errors()):
                raise
            raise ConnectionSetupError(f"cannot open SSH connection '{self.ssh_conn_id}': "
                                       f"{exc.__class__.__name__}: {exc}") from exc

    async def run(self) -> AsyncIterator[TriggerEvent]:
        import asyncssh
        import httpx

        run_started = time.monotonic()
        headers = await self._api_headers()
        budget = ReconnectBudget(attempts=self.watch.reconnect_attempts, seconds=self.watch.reconnect_budget_s)
        ssh = None
        async with httpx.AsyncClient(base_url=self.server["url"], timeout=5.0, headers=headers) as http:
            try:
                while True:
                    pause = self.watch.poll_s
                    try:
                        if ssh is None:
                            ssh = await self._connect()
                        event = await self._poll(ssh, http)
                        budget.reset()
                    except asyncssh.HostKeyNotVerifiable as exc:  # never retried
                        event = await self._host_key_event(exc)
                    except ConnectionSetupError as exc:  # reconnecting cannot help
                        event = self._event(ReadinessStatus.UNREACHABLE, error=str(exc), log_tail=self._log_lines)
                    except _connection_errors() as exc:
                        ssh = self._drop(ssh)
                        if (credentials := _credentials_problem(exc)) is not None:  # reconnecting cannot help
                            event = self._event(ReadinessStatus.SSH_CREDENTIALS, key_file=credentials[0],
                                                error=credentials[1], log_tail=self._log_lines)
                        else:
                            event, pause = await self._after_ssh_failure(exc, budget, http)
                    if event is None and time.time() - self.started_at > self.watch.timeout_s:
                        event = self._event(ReadinessStatus.TIMEOUT, log_tail=self._log_lines)
                    if event is not None:
                        await self._settle(run_started)
                        yield event
                        return
                    await asyncio.sleep(pause)
            finally:
                self._drop(ssh)

    async def _settle(self, run_started: float) -> None:
        """Hold an event that came sooner than ``resume_settle_s`` after the trigger started (see
        DEFAULT_RESUME_SETTLE_S)."""
        remaining = self.watch.resume_settle_s - (time.monotonic() - run_started)
        if remaining > 0:
            self.log.info("%s: holding the event %.1f s so the task resumes after Airflow has seen it defer",
                          self.server.get("name"), remaining)
            await asyncio.sleep(remaining)

    def _ready_event(self, info: dict) -> TriggerEvent:
        # the pre-load memory line feeds the calibration (tuning/calibration.py)
        self._remember_startup()
        return self._event(ReadinessStatus.READY, server_info=info,
                           log_tail=self._startup_lines + self._log_lines[-5:])

    def _remember_startup(self) -> None:
        from fleetgen.tuning.calibration import LOAD_BEGIN_MARK

        self._startup_lines = [line for line in self._log_lines if LOAD_BEGIN_MARK in line][-1:] or self._startup_lines

    async def _poll(self, ssh, http) -> TriggerEvent | None:
        """One look over SSH (log tail, process alive) and HTTP; an event when the wait is over."""
        command = remote.watch_command(self.log_path, self.pid, LOG_TAIL_LINES)
        # asyncssh's own timeout starts once the channel is open; a wedged node can hang the opening too.
        result = await asyncio.wait_for(ssh.run(command, check=False), self.watch.command_timeout_s)
        output = result.stdout or ""
        if isinstance(output, bytes):
            output = output.decode("utf-8", "replace")
        alive, log_lines = remote.parse_watch(output)
        if alive is None:  # the command did not run to its end: not a verdict on the server, nor its log's tail
            raise ConnectionError(f"the log/alive check printed no verdict (exit {result.exit_status})")
        self._log_lines = log_lines
        self._remember_startup()
        fatal = readiness.find_fatal(self._log_lines)
        if fatal is not None:
            return self._event(ReadinessStatus.FATAL, kind=fatal.kind, fatal_line=fatal.line,
                               log_tail=self._log_lines)
        if not alive:
            return self._event(ReadinessStatus.FATAL, kind=FailureKind.EXITED,
                               fatal_line="the server process exited without a recognised error line",
                               log_tail=self._log_lines)
        info = await self._probe_http(http)
        if info is not None:
            return self._ready_event(info)
        return None

    async def _after_ssh_failure(self, exc: BaseException, budget: ReconnectBudget,
                                 http) -> tuple[TriggerEvent | None, float]:
        """Count the failure; end the wait when the budget is spent, else say when to reconnect.

        The server may finish loading while SSH is away: HTTP is still asked, and answers for it.
        """
        now = time.monotonic()
        budget.record_failure(now)
        host, name = self.server.get("node"), self.server.get("name")
        reason = f"{exc.__class__.__name__}: {exc}".strip().rstrip(":")
        if budget.spent(now):
            return self._event(ReadinessStatus.UNREACHABLE, error=(
                f"lost SSH to {host} while waiting for {name} and could not reconnect: {budget.describe(now)}; "
                f"last error: {reason}"), budget={"attempts": budget.attempts, "seconds": budget.seconds,
                                                  "failures": budget.failures,
                                                  "spent_s": round(budget.elapsed(now), 1)},
                log_tail=self._log_lines), 0.0
        delay = budget.delay(now)
        self.log.warning("SSH to %s lost while waiting for %s (%s): reconnect %d of %d in %.1f s, %.0f of %.0f s "
                         "of the reconnect budget spent", host, name, reason, budget.failures, budget.attempts,
                         delay, budget.elapsed(now), budget.seconds)
        info = await self._probe_http(http)
        if info is not None:
            return self._ready_event(info), 0.0
        return None, delay

    @staticmethod
    def _drop(ssh) -> None:
        if ssh is not None:
            try:
                ssh.close()
            except Exception:  # noqa: BLE001 - closing a connection that already broke
                pass
        return None

    async def _host_key_event(self, exc: BaseException) -> TriggerEvent:
        """Both fingerprints: the connection's host_key and what the node presented."""
        import asyncssh
        from airflow.sdk import BaseHook

        connection = await asyncio.to_thread(BaseHook.get_connection, self.ssh_conn_id)
        configured = (connection.extra_dejson or {}).get("host_key")
        expected = describe_public_line(configured) if configured else "a key from ~/.ssh/known_hosts"
        try:
            key = await asyncio.wait_for(asyncssh.get_server_host_key(connection.host, connection.port or 22),
                                         self.watch.command_timeout_s)
            received = describe(key.get_algorithm(), key.public_data) if key is not None else "(no host key)"
        except (OSError, asyncssh.Error, TimeoutError) as error:
            received = f"(could not be read again: {error})"
        return self._event(ReadinessStatus.HOST_KEY_MISMATCH, error=f"{exc}", address=connection.host,
                           expected=expected, received=received)

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
        except (httpx.TransportError, httpx.HTTPStatusError, ValueError):
            return None
        return info if self._is_this_launch(info) else None

    def _is_this_launch(self, info: dict) -> bool:
        """Whether the server answering on the port runs this launch's arguments. SGLang binds its port only
        after loading the model (and then logs "address already in use" without exiting): until then another
        process on the port may answer, and its limits must not be taken for this server's."""
        args = (self.context.get("launched") or {}).get("args")
        if not args:
            return True
        differences = readiness.launch_differences(info, readiness.args_as_flags(args), expected_version=None)
        if differences and not self._foreign_seen:
            self._foreign_seen = True
            self.log.warning("%s: the server answering on %s does not run this launch (%s); waiting for ours",
                             self.server.get("name"), self.server.get("url"), "; ".join(differences[:3]))
        return not differences
