"""The event a readiness trigger hands back to its task: one typed record, checked when it arrives.

The trigger (``ReadinessTrigger``, in the triggerer) builds it and Airflow carries it as JSON; the operator
(``WaitReadyOperator.execute_complete``, on a worker, possibly after an upgrade of either side) reads it
back with ``ReadinessEvent.from_payload``, which refuses a status it does not know or a payload missing what
that status needs, naming the server, instead of failing later on a KeyError.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any

from fleetgen.errors import FailureKind, ServerError


class ReadinessStatus(str, Enum):
    READY = "ready"                          # /health 200, /model_info and /server_info read
    FATAL = "fatal"                          # SGLang's fatal line, or the process gone
    TIMEOUT = "timeout"                      # not ready within ready_timeout_s
    UNREACHABLE = "unreachable"              # the node's SSH could not be (re)gained within the budget
    HOST_KEY_MISMATCH = "host_key_mismatch"  # the node presented another host key (never retried)
    SSH_CREDENTIALS = "ssh_credentials"      # the key file cannot be read, or the node refused the login (never retried)


# What the operator reads of the launch it deferred with, whatever the status.
_LAUNCHED_KEYS = ("name", "node", "gpu_ids", "pid", "log_path")
_SAME_VERSION = "the triggerer and the workers must run the same fleetgen version"
# What each status must carry beside the common fields.
_REQUIRED = {
    ReadinessStatus.READY: ("server_info",),
    ReadinessStatus.FATAL: ("kind", "fatal_line"),
    ReadinessStatus.TIMEOUT: (),
    ReadinessStatus.UNREACHABLE: ("error",),
    ReadinessStatus.HOST_KEY_MISMATCH: ("error", "address", "expected", "received"),
    ReadinessStatus.SSH_CREDENTIALS: ("error",),  # with key_file when that file is what cannot be read
}


@dataclass(frozen=True)
class ReadinessEvent:
    status: ReadinessStatus
    server: dict
    log_path: str
    pid: int
    waited_s: float
    context: dict                    # what the operator deferred with: {"launched": ..., "attempt": ...}
    log_tail: list[str] = field(default_factory=list)
    server_info: dict | None = None
    kind: FailureKind | None = None
    fatal_line: str | None = None
    error: str | None = None
    address: str | None = None
    expected: str | None = None
    received: str | None = None
    budget: dict | None = None       # the reconnect budget spent, on unreachable
    key_file: str | None = None      # the connection's key file that cannot be read, on ssh_credentials

    def __post_init__(self) -> None:
        self._require([name for name in _REQUIRED[self.status] if getattr(self, name) is None])

    def _require(self, missing: list[str]) -> None:
        if missing:
            raise ServerError(f"the readiness event ({self.status.value}) lacks {', '.join(missing)}",
                              server=str((self.server or {}).get("name", "?")), hint=_SAME_VERSION)

    @property
    def launched(self) -> dict:
        return self.context["launched"]

    @property
    def attempt(self) -> int:
        return self.context["attempt"]

    def payload(self) -> dict[str, Any]:
        """The JSON-safe dict Airflow carries (``None`` fields left out)."""
        out: dict[str, Any] = {}
        for item in fields(self):
            value = getattr(self, item.name)
            if value is not None:
                out[item.name] = value.value if isinstance(value, Enum) else value
        return out

    @classmethod
    def from_payload(cls, payload: dict) -> ReadinessEvent:
        server = str((payload.get("server") or {}).get("name", "?")) if isinstance(payload, dict) else "?"
        try:
            status = ReadinessStatus(payload["status"])
            kind = FailureKind(payload["kind"]) if payload.get("kind") is not None else None
            known = {item.name for item in fields(cls)}
            values = {key: value for key, value in payload.items() if key in known}
            event = cls(**{**values, "status": status, "kind": kind})
        except (KeyError, TypeError, ValueError) as exc:
            raise ServerError(f"wait_ready got a readiness event it cannot read ({exc.__class__.__name__}: {exc})",
                              server=server, hint=_SAME_VERSION) from None
        context = event.context if isinstance(event.context, dict) else {}
        launched = context.get("launched")
        if not isinstance(launched, dict) or not all(key in launched for key in _LAUNCHED_KEYS) \
                or type(context.get("attempt")) is not int:
            event._require(["context.launched", "context.attempt"])
        return event
