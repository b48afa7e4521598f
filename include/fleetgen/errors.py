"""One exception tree for the whole project.

Every error names what it concerns (host, server, shard, file and line) so that a task log
read by an on-call engineer says where to look without a stack trace.
"""

from __future__ import annotations

from enum import Enum


class FailureKind(str, Enum):
    """Why a server failed to start: the one list shared by the log classifier (``fleetgen.nodes.readiness``),
    the readiness operator (relaunch or fail) and the tuner's back-off (which dimension to shrink)."""

    OOM_WEIGHTS = "oom_weights"        # the weights left no memory for the pools
    OOM_KV = "oom_kv"                  # the KV pool did not fit
    OOM_MAMBA = "oom_mamba"            # the Mamba/linear-attention state pool did not fit or is too small
    OOM_CUDA_GRAPH = "oom_cuda_graph"  # CUDA-graph capture ran out of memory outside the static pool
    OOM_RUNTIME = "oom_runtime"        # "CUDA out of memory" elsewhere: activations outside the static pool
    BAD_ARGS = "bad_args"              # SGLang refused its command line
    PORT_IN_USE = "port_in_use"        # another process listens on the port
    EXITED = "exited"                  # the process died without a line we recognise

    def can_back_off(self) -> bool:
        """A smaller plan can fix this failure (memory); the others fail the same way every time."""
        return self.backoff_step is not None

    @property
    def backoff_step(self) -> str | None:
        """What the back-off shrinks: running ``requests``, more ``reserve`` outside the static pool, or
        less ``pre_load`` free memory than the probe saw; None when re-planning cannot help."""
        return _BACKOFF_STEPS.get(self)

    @property
    def hint(self) -> str:
        return _FAILURE_HINTS[self]


_BACKOFF_STEPS = {
    FailureKind.OOM_WEIGHTS: "pre_load",
    FailureKind.OOM_KV: "requests",
    FailureKind.OOM_MAMBA: "requests",
    FailureKind.OOM_CUDA_GRAPH: "reserve",
    FailureKind.OOM_RUNTIME: "reserve",
}

_FAILURE_HINTS = {
    FailureKind.OOM_WEIGHTS: "the weights leave no room for the KV and state pools on this GPU: check for foreign "
                             "processes in the probe's inventory; raise the DAG parameter memory_margin_mib (lowers "
                             "--mem-fraction-static) only if something else takes memory after the probe",
    FailureKind.OOM_KV: "the KV pool did not fit: fleetgen re-plans smaller by itself; if it still fails, set the DAG "
                        "parameter max_running_requests lower (drives --max-running-requests and "
                        "--max-mamba-cache-size) or raise memory_margin_mib",
    FailureKind.OOM_MAMBA: "the Mamba state pool did not fit: set the DAG parameter max_running_requests lower "
                           "(drives --max-mamba-cache-size), or turn on bf16_ssm_state to halve the state",
    FailureKind.OOM_CUDA_GRAPH: "CUDA graphs/activations did not fit outside the static pool: raise the DAG parameter "
                                "memory_margin_mib (lowers --mem-fraction-static)",
    FailureKind.OOM_RUNTIME: "CUDA ran out of memory outside the static pool: check for foreign processes on the GPU "
                             "(nvidia-smi), then raise the DAG parameter memory_margin_mib (lowers "
                             "--mem-fraction-static)",
    FailureKind.BAD_ARGS: "SGLang refused its command line: check server.extra_args in the fleet description "
                          "against the installed SGLang version",
    FailureKind.PORT_IN_USE: "another process listens on this port: find it with `ss -ltnp` on the node, or change "
                             "the node's ports/base_port in the fleet description",
    FailureKind.EXITED: "read the log lines above the failure for the cause",
}


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


class PathOutsideRun(ConfigError):
    """A results view asked for a file outside the run's folder (or one that is not there), or for a run it does
    not serve: outside the deployment's output root, or under a run id that is no plain folder name."""


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


class AuthenticationRefused(HostUnreachable):
    """The node answered and refused the connection's login or key. Never retried: the same credentials are
    refused on every try; a person must fix the Airflow connection or the node's authorized_keys."""


class HostKeyMismatch(HostUnreachable):
    """The node presented another host key than the connection holds. Never retried: the same key
    comes back on every try, and connecting anyway would hand credentials to whoever answers."""

    def __init__(self, message: str, *, expected: str, received: str, **context) -> None:
        self.expected = expected  # "ssh-ed25519 SHA256:...", as OpenSSH prints fingerprints
        self.received = received
        super().__init__(f"{message}: expected {expected}, received {received}", **context)


class ServerError(FleetgenError):
    """An inference server misbehaved."""


class ServerStartupError(ServerError):
    """A server died while starting; carries SGLang's own fatal line and the log tail."""

    def __init__(self, message: str, *, fatal_line: str | None = None, kind: str | None = None,
                 log_tail: list[str] | None = None, **context) -> None:
        self.fatal_line = fatal_line
        self.kind = kind  # a FailureKind value
        self.log_tail = list(log_tail or [])
        super().__init__(message, **context)

    def _render(self) -> str:
        # What to check next right under the headline, before the log tail: the first screen of a task log
        # then says what failed and what to change.
        where = self.context()
        headline, _, rest = self.message.partition("\n")
        lines = [f"[{where}] {headline}" if where else headline]
        if self.hint:
            lines.append(f"What to check next: {self.hint}")
        return "\n".join(lines + ([rest] if rest else []))


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


class ServerReplaced(GenerationError):
    """The server behind a URL is not the launch ``wait_ready`` read: restarted by hand or by another run.
    The same readback fails the same way on a retry."""


class ShardLeaseBusy(GenerationError):
    """Another try of the shard still holds its output after the wait; a later retry may succeed."""


class ShardLeaseLost(GenerationError):
    """A newer try of the shard took its output over; this try stopped before writing more."""


class ShardPlanChanged(GenerationError):
    """The shard's output on disk was written for another plan (the prompts file or shard_size changed since).
    Never retried: every try of the shard finds the same recorded plan."""


class OutputError(GenerationError):
    """A shard's output could not be written; ``errno`` is the OS error number. Retryable: the
    space came back (something was freed) or the error may be transient."""

    def __init__(self, message: str, *, errno: int | None = None, **context) -> None:
        self.errno = errno
        super().__init__(message, **context)


class OutputUnwritable(OutputError):
    """The output cannot be written and a retry would fail the same way: the disk is still full,
    the quota spent, the file system read-only or the folder not ours to write."""


class StoreError(FleetgenError):
    """The object store that holds a run (``output_root`` / ``prompts_path`` as an ``s3://`` URL) failed a request
    after the retries a retry could help. ``path`` is the object's URL; ``conn_id`` the Airflow connection used.
    Retryable as a task: the store may answer later (503 SlowDown, a restart), and nothing committed is lost."""

    def __init__(self, message: str, *, conn_id: str | None = None, **context) -> None:
        self.conn_id = conn_id
        super().__init__(message, **context)


class StoreUnreachable(StoreError):
    """No answer from the store's endpoint (refused, timed out, name not resolved)."""


class StoreDenied(StoreError):
    """The store refused the connection's credentials or their rights (403): a retry fails the same way."""


class StoreBucketMissing(StoreError):
    """The bucket named by the URL does not exist: a retry fails the same way."""


class StoreConflict(StoreError):
    """A conditional write lost (412 PreconditionFailed, 409 ConditionalRequestConflict): someone else wrote the
    object first. The commit protocol turns this into what it means (a newer try took the shard over)."""


class ObjectMissing(StoreError):
    """The object is not there (404 NoSuchKey)."""


class ValidationFailed(FleetgenError):
    """The output failed its expectations; ``summary`` is JSON-safe."""

    def __init__(self, message: str, *, summary: dict | None = None, **context) -> None:
        self.summary = summary or {}
        super().__init__(message, **context)
