"""One exception tree for the whole project.

Every error names what it concerns (host, server, shard, file and line) so that a task log
read by an on-call engineer says where to look without a stack trace.
"""

from __future__ import annotations


class FleetgenError(Exception):
    """Base of every error fleetgen raises on purpose.

    ``hint`` is what to check or do next; it is printed after the message.
    """

    def __init__(
        self,
        message: str,
        *,
        host: str | None = None,
        server: str | None = None,
        shard: int | None = None,
        path: str | None = None,
        line: int | None = None,
        hint: str | None = None,
    ) -> None:
        self.message = message
        self.host = host
        self.server = server
        self.shard = shard
        self.path = path
        self.line = line
        self.hint = hint
        super().__init__(self._render())

    def context(self) -> str:
        parts = []
        if self.host is not None:
            parts.append(f"host {self.host}")
        if self.server is not None:
            parts.append(f"server {self.server}")
        if self.shard is not None:
            parts.append(f"shard {self.shard}")
        if self.path is not None:
            parts.append(f"{self.path}:{self.line}" if self.line is not None else str(self.path))
        return ", ".join(parts)

    def _render(self) -> str:
        where = self.context()
        text = f"[{where}] {self.message}" if where else self.message
        if self.hint:
            text += f"\nWhat to check next: {self.hint}"
        return text


class ConfigError(FleetgenError):
    """Invalid user input: fleet file, settings file, DAG params."""


class ProbeError(FleetgenError):
    """nvidia-smi output that cannot be parsed, or a GPU that is not there."""


class ModelConfigError(FleetgenError):
    """A model's config.json that fleetgen cannot size (unknown architecture, missing keys)."""


class PlanError(FleetgenError):
    """No launch plan fits the memory the GPUs have."""


class RemoteError(FleetgenError):
    """A command run on a node over SSH failed."""


class HostUnreachable(RemoteError):
    """The SSH connection to a node could not be made."""


class ServerError(FleetgenError):
    """An inference server misbehaved."""


class ServerStartupError(ServerError):
    """A server died while starting; carries SGLang's own fatal line and the log tail."""

    def __init__(self, message: str, *, fatal_line: str | None = None, kind: str | None = None,
                 log_tail: list[str] | None = None, **context) -> None:
        self.fatal_line = fatal_line
        self.kind = kind  # e.g. "oom_kv", "oom_mamba", "oom_cuda_graph", "exited"
        self.log_tail = list(log_tail or [])
        super().__init__(message, **context)


class ServerNotReady(ServerError):
    """A server did not become ready in time."""


class PromptsError(FleetgenError):
    """Structural problems in a prompts file; ``problems`` lists (line, message)."""

    def __init__(self, message: str, *, problems: list[tuple[int, str]] | None = None, **context) -> None:
        self.problems = list(problems or [])
        super().__init__(message, **context)


class GenerationError(FleetgenError):
    """A generation shard could not finish."""


class AllServersDown(GenerationError):
    """Every server is down; progress was saved before raising."""


class ValidationFailed(FleetgenError):
    """The output failed its expectations; ``summary`` is JSON-safe."""

    def __init__(self, message: str, *, summary: dict | None = None, **context) -> None:
        self.summary = summary or {}
        super().__init__(message, **context)
