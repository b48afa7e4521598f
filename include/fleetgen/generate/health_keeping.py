"""Keeping each server's health for a shard's dispatcher: marked down and up, shared with the run's other shards,
re-checked (``/health``, then the launch, then one trial request), probed when silent, and re-read to know it is
still the launch ``wait_ready`` read (``launch_check.py``). What a failure says about the server, and so which of
these it calls for, is in ``dispatch.py``'s docstring; sending the prompts is ``dispatch.py``'s too.
"""

from __future__ import annotations

import asyncio
import logging
import time

import httpx

from fleetgen.generate.chat import HEALTH_PATH
from fleetgen.generate.health import DOWN, UP, HealthEntry, SharedHealth
from fleetgen.generate.launch_check import REPLACED, SERVER_INFO_PATH, LaunchCheck, replaced
from fleetgen.generate.queue import WorkQueue
from fleetgen.generate.records import utc_now
from fleetgen.generate.server_state import ServerState
from fleetgen.generate.settings import GenerationSettings

STALLED = "fleetgen: server stalled"  # cancel message for requests abandoned on a hung server


class ServerHealthKeeping:
    """The health half of ``dispatch.Dispatcher``: it sets these attributes, and provides ``_stop``, ``_spawn``,
    ``_event``, ``_send`` and ``_attempt`` (a trial request is a real one)."""

    shard_id: int
    settings: GenerationSettings
    servers: list[ServerState]
    queue: WorkQueue
    health: SharedHealth | None
    log: logging.Logger
    headers: httpx.Headers
    launch_check: LaunchCheck
    fatal: BaseException | None
    _rechecks: list[asyncio.Task]
    _health_extensions: dict

    def _mark_down(self, server: ServerState, reason: str, *, shared: HealthEntry | None = None,
                   hung: bool = False) -> None:
        """Stop sending to ``server`` and re-check it; tell the other shards unless they told us. A ``hung``
        server (or one another shard found hung) also has the requests this shard holds there abandoned."""
        if shared is not None:
            reason = f"marked down by {shared.by}: {shared.reason}"
            server.health.shared_at = shared.at
            hung = shared.hung
        elif self.health is not None:
            server.health.shared_at = self.health.publish(server.name, DOWN, reason, hung=hung)
        at = utc_now()
        server.health.mark_down(reason, now=time.monotonic(), at=at)
        self._event("down", server, reason=reason[:500])
        self.log.warning("shard %d: server %s marked down at %s (%s); its prompts go to the other servers; "
                         "re-checking %s%s", self.shard_id, server.name, at, reason,
                         server.endpoint.url, HEALTH_PATH)
        server.recheck = self._spawn(self._recheck(server))
        self._rechecks.append(server.recheck)
        if hung:  # what this shard holds there never returns: send it elsewhere now
            server.load.abandon(STALLED)

    def _mark_up(self, server: ServerState, *, by: str | None = None) -> None:
        at = utc_now()
        down_s = server.health.mark_up(now=time.monotonic(), at=at)
        self._event("recovered", server, down_s=round(down_s, 1), **({"by": by} if by else {}))
        self.log.warning("shard %d: server %s is back up at %s after %.1f s down%s", self.shard_id,
                         server.name, at, down_s, f" (re-checked by {by})" if by else "")

    def _sync_health(self) -> None:
        """Apply what other shards found since the last look at the shared health file."""
        entries = self.health.changed_entries() if self.health is not None else None
        for server in self.servers if entries else ():
            entry = entries.get(server.name)
            if entry is None or entry.at <= server.health.shared_at:
                continue
            server.health.shared_at = entry.at
            if entry.state == DOWN and not server.health.is_down:
                self._mark_down(server, entry.reason, shared=entry)
            elif entry.state == UP and server.health.is_down:
                self._mark_up(server, by=entry.by)  # this shard's re-check ends when it next wakes

    async def _recheck(self, server: ServerState) -> None:
        # A server that keeps coming back and failing again is checked less and less often.
        downs = server.health.downs
        delay = min(self.settings.recheck_initial_s * 2 ** (downs - 1), self.settings.recheck_max_s)

        def superseded() -> bool:  # back up (another shard re-checked it), or down again with a new re-check
            return not server.health.is_down or server.health.downs != downs

        while True:
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.settings.recheck_max_s)
            if superseded():
                return
            why = await self._health(server)
            if superseded():
                return
            if why is None:
                why = await self._launch_changed(server)  # a server that came back may be another launch
                if self.fatal is not None:
                    return
            if why is None:
                why = await self._trial(server)
                if why is None:
                    break
                why = f"trial request failed: {why}"
            self.log.info("shard %d: server %s still down (%s); next check in %.1f s", self.shard_id,
                          server.name, why, delay)
        if superseded():
            return
        if self.health is not None:
            server.health.shared_at = self.health.publish(server.name, UP, "health and a trial request succeeded")
        self._mark_up(server)

    async def _health(self, server: ServerState) -> str | None:
        request = httpx.Request("GET", server.health_url, headers=self.headers,
                                extensions=self._health_extensions)
        try:
            response = await self._send(request)
        except httpx.TransportError as exc:
            return f"{HEALTH_PATH}: {type(exc).__name__}: {exc}"
        return None if response.status_code == 200 else f"{HEALTH_PATH}: HTTP {response.status_code}"

    async def _launch_changed(self, server: ServerState) -> str | None:
        """Re-read the server's /server_info: None when it is still the launch wait_ready read, else why not (it
        could not be read, or it is another launch, which stops the shard)."""
        changes, info, unreadable = await self.launch_check.changes(server.endpoint)
        if not changes:
            return unreadable
        self._stop_replaced(server, changes, info, seen_in=f"its {SERVER_INFO_PATH}")
        return f"another launch: {'; '.join(changes)}"

    def _stop_replaced(self, server: ServerState, changes: list[str], found: dict, *, seen_in: str) -> None:
        """Stop the shard: ``server`` is not the launch wait_ready read (``changes``, seen in ``seen_in``); what is
        in flight there is abandoned, never written (docs/shards.md, "Which server wrote a completion")."""
        if self.fatal is not None:
            return
        abandoned = server.load.in_flight
        self._event("replaced", server, changes=changes, seen_in=seen_in, abandoned=abandoned)
        self._stop(replaced(server.endpoint, changes, found, seen_in=seen_in, shard=self.shard_id,
                            abandoned=abandoned))
        server.load.abandon(REPLACED)

    async def _check_launches(self) -> None:
        """Every server not down, re-read at once; one that cannot be read is left to its answers and its health."""
        servers = [server for server in self.servers if not server.health.is_down]
        for server, why in zip(servers, await asyncio.gather(*(self._launch_changed(s) for s in servers))):
            if why is not None and self.fatal is None:
                self.log.warning("shard %d: could not re-read the launch of %s (%s)", self.shard_id, server.name, why)

    async def _watch_launches(self) -> None:
        while self.fatal is None:
            await asyncio.sleep(self.settings.launch_check_s)
            await self._check_launches()

    async def _trial(self, server: ServerState) -> str | None:
        """One real request before the server's workers resume; None when it did not fail."""
        item = self.queue.take()
        return None if item is None else await self._attempt(server, item)

    async def _probe_stalled(self, server: ServerState) -> None:
        """A silent server: busy (its /health answers) or hung (it does not, so abandon its requests)."""
        try:
            silent_s = time.monotonic() - server.load.last_answer
            why = await self._health(server)
            if why is None or server.health.is_down:
                return
            self._mark_down(server, f"stalled: no answer for {silent_s:.0f} s with {server.load.in_flight} "
                                    f"request(s) in flight, and {why}", hung=True)
        finally:
            server.load.last_answer = time.monotonic()  # next probe, if any, after another quiet period
            server.load.stall_probe = None

    def _probe_silent_servers(self, now: float) -> None:
        """Probe each up server that answered nothing for ``stall_check_s`` with requests in flight."""
        for server in self.servers:
            load = server.load
            if (not server.health.is_down and load.in_flight and load.stall_probe is None
                    and now - load.last_answer >= self.settings.stall_check_s):
                load.stall_probe = self._spawn(self._probe_stalled(server))
