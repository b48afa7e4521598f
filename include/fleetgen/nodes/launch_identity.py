"""What a server launch is known by, from ``wait_ready``'s readback to each completion it writes.

A server is launched with ``--weight-version fleetgen/<run id>``: SGLang's own "version identifier for the
model weights" (``weight_version`` in sglang/srt/arg_groups/fields/serving.py), which it reports in
``/server_info`` (every server-args field, sglang/srt/utils/common.py ``build_server_info``), in ``/model_info``
and in the ``metadata`` of every chat completion (sglang/srt/entrypoints/openai/serving_chat.py,
``build_endpoint_weight_version_metadata``). It changes neither the weights nor the text. So each completion
says which launch wrote it, at no extra request: a shard accepts one only when it names the launch its
run's ``wait_ready`` read (docs/shards.md, "Which server wrote a completion"). A server restarted by hand
answers ``default`` (or whatever its launcher set); one relaunched by another run names that run.

A server kept running from an earlier run (``stop_servers`` found it on plan) keeps the identity it was
launched with: the runs that keep it read that identity back and accept it. The keep decision itself
compares tonight's plan without this flag (:func:`without_identity`), or no server would ever be kept.
"""

from __future__ import annotations

FLAG = "--weight-version"
FIELD = "weight_version"  # its /server_info field and its key in a completion's metadata
PREFIX = "fleetgen/"
SGLANG_DEFAULT = "default"  # what SGLang reports when no --weight-version was given


def launch_id(run_id: str) -> str:
    """The identity that the servers launched by run ``run_id`` carry."""
    if not run_id:
        raise ValueError("a launch identity needs the run id")
    return PREFIX + run_id


def launch_args(run_id: str) -> list[str]:
    """The launch's arguments that carry its identity."""
    return [FLAG, launch_id(run_id)]


def without_identity(args: list[str] | tuple[str, ...]) -> list[str]:
    """``args`` less the identity flag and its value: what keep-or-relaunch compares with a running server."""
    kept: list[str] = []
    skip = False
    for word in args:
        if skip:
            skip = False
        elif word == FLAG:
            skip = True
        elif not str(word).startswith(FLAG + "="):
            kept.append(word)
    return kept


def reported(info: dict) -> str | None:
    """The launch identity a ``/server_info`` body reports (None when the server reports none)."""
    value = info.get(FIELD) if isinstance(info, dict) else None
    return value if isinstance(value, str) else None


def describe(identity: str | None) -> str:
    """Words for an identity in an error: which run launched it, or that fleetgen did not."""
    if identity is None:
        return "no weight_version at all (not a server fleetgen launched, or an SGLang without it)"
    if identity.startswith(PREFIX) and len(identity) > len(PREFIX):
        return f"launched by run {identity[len(PREFIX):]!r}"
    if identity == SGLANG_DEFAULT:
        return "weight_version 'default': started without fleetgen's launch identity (by hand or another tool)"
    return f"weight_version {identity!r}: not a launch of fleetgen's"
