"""Is the server behind each of a shard's URLs still the launch ``wait_ready`` read? A fresh ``/server_info`` says.

Each completion names the launch that wrote it (nodes/launch_identity.py), but a server restarted by hand from our
own command line (``ps`` shows it, ``--weight-version`` included) with another checkpoint or another
``--max-running-requests`` answers under the same identity. So the shard also re-reads ``/server_info`` and
compares what identified the launch when ``wait_ready`` read it (nodes/readiness.py ``launch_fields``: model path,
launch identity, the field of every planned flag; SGLang reports each server-args field there,
sglang/srt/utils/common.py ``build_server_info``): before it sends anything, so that a shard of an old run refuses
servers another run relaunched at once; before the trial request of a server coming back up; and every
``launch_check_s``. Another launch, told by either, stops the shard with the error ``replaced`` builds
(docs/shards.md, "Which server wrote a completion").
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import httpx

from fleetgen.errors import ServerReplaced
from fleetgen.generate import jsonio
from fleetgen.generate.settings import ServerEndpoint
from fleetgen.nodes import launch_identity, readiness

SERVER_INFO_PATH = "/server_info"
REPLACED = "fleetgen: server replaced"  # cancel message for the requests abandoned on a replaced server


class LaunchCheck:
    """Reads a server's ``/server_info`` and says how its launch differs from the one ``wait_ready`` read."""

    def __init__(self, *, send: Callable[[httpx.Request], Awaitable[httpx.Response]], headers: httpx.Headers,
                 extensions: dict) -> None:
        self.send = send
        self.headers = headers
        self.extensions = extensions  # the /health timeouts: /server_info is as cheap an answer

    async def changes(self, endpoint: ServerEndpoint) -> tuple[list[str], dict | None, str | None]:
        """``(changes, info, unreadable)``: the changed fields (empty: the same launch) and the body read, or why
        ``/server_info`` could not be read (the server may be down or busy: no sign of another launch)."""
        if not endpoint.launch_fields:
            return [], None, None  # nothing was read at wait_ready (an endpoint built by hand): nothing to compare
        request = httpx.Request("GET", endpoint.url + SERVER_INFO_PATH, headers=self.headers,
                                extensions=self.extensions)
        try:
            response = await self.send(request)
        except httpx.TransportError as exc:
            return [], None, f"{SERVER_INFO_PATH}: {type(exc).__name__}: {exc}"
        if response.status_code != 200:
            return [], None, f"{SERVER_INFO_PATH}: HTTP {response.status_code}"
        try:
            info = jsonio.loads(response.content)
        except jsonio.JSONDecodeError as exc:
            return [], None, f"{SERVER_INFO_PATH}: not JSON ({exc})"
        if not isinstance(info, dict):
            return [], None, f"{SERVER_INFO_PATH}: not a JSON object"
        return readiness.launch_changes(endpoint.launch_fields, info), info, None


def answered_by_another_launch(endpoint: ServerEndpoint, weight_version: str | None) -> tuple[list[str], dict]:
    """``(changes, found)`` for a completion whose ``weight_version`` is not the identity ``wait_ready`` read."""
    found = {launch_identity.FIELD: weight_version}
    return readiness.launch_changes({launch_identity.FIELD: endpoint.launch_id}, found), found


def replaced(endpoint: ServerEndpoint, changes: list[str], found: dict, *, seen_in: str, shard: int,
             abandoned: int) -> ServerReplaced:
    """The error that stops a shard whose server is not the launch ``wait_ready`` read, told by a fresh
    ``/server_info`` or by a completion's ``weight_version``: each field that differs and where it was seen, both
    launches (the one read and the one answering now, as far as ``found`` tells), the requests abandoned there,
    and what to do about it."""
    read = endpoint.launch_fields or {launch_identity.FIELD: endpoint.launch_id}
    message = (f"{endpoint.name} ({endpoint.url}) is not the launch wait_ready read: {'; '.join(changes)} "
               f"({seen_in}). wait_ready read: {_launch_words(read)}; now: {_launch_words(found)}. {abandoned} "
               f"request(s) in flight there abandoned, none of its completions written from now on")
    return ServerReplaced(message, shard=shard, server=endpoint.name,
                          hint=_replaced_hint(launch_identity.reported(read), launch_identity.reported(found)))


def _launch_words(fields: dict) -> str:
    """A launch as far as ``fields`` tell: its model path when known, and who launched it."""
    identity = launch_identity.describe(launch_identity.reported(fields))
    return f"{fields['model_path']!r}, {identity}" if "model_path" in fields else identity


def _replaced_hint(expected: str | None, found: str | None) -> str:
    """What to do about a server that is not the launch read: another run's launch (another identity of ours), or a
    server restarted by some other hand (another identity, or ours copied from its command line)."""
    if found != expected and found is not None and found.startswith(launch_identity.PREFIX):
        return ("another run relaunched the servers after this run's wait_ready read them, so this run's shards "
                "cannot use them: a shard of an old run is re-run by a new run (trigger the DAG again); the "
                "completions this run wrote stay in its folder")
    return ("the server was restarted outside fleetgen: stop it, then trigger a new run (stop_servers, launch_servers "
            "and wait_ready launch and read tonight's servers again); the completions written before stay")
