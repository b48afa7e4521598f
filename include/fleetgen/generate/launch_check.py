"""Is the server behind each of a shard's URLs still the launch ``wait_ready`` read? A fresh ``/server_info`` says.

Each completion names the launch that wrote it (nodes/launch_identity.py), but a server restarted by hand from our
own command line (``ps`` shows it, ``--weight-version`` included) with another checkpoint or another
``--max-running-requests`` answers under the same identity. So the shard also re-reads ``/server_info`` and
compares what identified the launch when ``wait_ready`` read it (nodes/readiness.py ``launch_fields``: model path,
launch identity, the field of every planned flag; SGLang reports each server-args field there,
sglang/srt/utils/common.py ``build_server_info``): before it sends anything, so that a shard of an old run refuses
servers another run relaunched at once; before the trial request of a server coming back up; and every
``launch_check_s``. Another launch stops the shard (docs/shards.md, "Which server wrote a completion").
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import httpx

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


def replaced_message(endpoint: ServerEndpoint, changes: list[str], found: dict, *, abandoned: int) -> str:
    """Both launches: the one ``wait_ready`` read and the one answering now, with each field that differs."""
    expected = endpoint.launch_fields
    read = f"{expected.get('model_path')!r}, {launch_identity.describe(launch_identity.reported(expected))}"
    now = f"{found.get('model_path')!r}, {launch_identity.describe(launch_identity.reported(found))}"
    return (f"{endpoint.name} ({endpoint.url}) is not the launch wait_ready read: wait_ready read {read}; it now "
            f"runs {now} ({'; '.join(changes)}); {abandoned} request(s) in flight there abandoned, none of its "
            f"completions written from now on")


def replaced_hint(expected: str | None, found: str | None) -> str:
    """What to do about a server that is not the launch read: another run's launch (another identity of ours), or a
    server restarted by some other hand (another identity, or ours copied from its command line)."""
    if found != expected and found is not None and found.startswith(launch_identity.PREFIX):
        return ("another run relaunched the servers after this run's wait_ready read them, so this run's shards "
                "cannot use them: a shard of an old run is re-run by a new run (trigger the DAG again); the "
                "completions this run wrote stay in its folder")
    return ("the server was restarted outside fleetgen: stop it, then trigger a new run (stop_servers, launch_servers "
            "and wait_ready launch and read tonight's servers again); the completions written before stay")
