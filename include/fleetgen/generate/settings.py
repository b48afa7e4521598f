"""What a generation shard is told: the servers with their in-flight limits, and the sampling settings."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any
from urllib.parse import urlsplit

from fleetgen.errors import ConfigError
from fleetgen.json_types import is_positive_int

# A request can wait behind about one full batch (the headroom queue) before it decodes, so the
# timeout allows two generations of max_tokens at a pessimistic per-request decode speed.
SLOWEST_DECODE_TOKENS_PER_S = 10.0
TIMEOUT_MARGIN_S = 60.0


@dataclass(frozen=True)
class ServerEndpoint:
    """One inference server as a shard sees it. ``max_in_flight`` is this shard's share of its limit."""

    name: str  # "host:port"
    url: str  # "http://host:port"
    max_in_flight: int
    host: str = ""
    gpu_ids: tuple[int, ...] = ()
    effective_max_running_requests: int = 0  # the server's own cap (/server_info), for the occupancy series
    # the launch wait_ready read (nodes/launch_identity.py): every completion accepted must name it; None when
    # the server reported none (an SGLang without weight_version), and then nothing is checked
    launch_id: str | None = None
    # what identified its launch in wait_ready's /server_info (nodes/readiness.py launch_fields): the shard re-reads
    # it at its start, when the server comes back up and every launch_check_s (generate/launch_check.py); {}: unchecked
    launch_fields: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError("a server endpoint needs a name", hint='use "host:port"')
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"server url {self.url!r} is not http(s)://host:port", server=self.name,
                              hint="pass the base URL the server listens on, without a path")
        if not is_positive_int(self.max_in_flight):
            raise ConfigError(f"max_in_flight must be a positive integer, got {self.max_in_flight!r}",
                              server=self.name, hint="derive it with server_limits() from the readiness readback")
        object.__setattr__(self, "url", self.url.rstrip("/"))
        object.__setattr__(self, "gpu_ids", tuple(self.gpu_ids))

    def to_dict(self) -> dict:
        return {**asdict(self), "gpu_ids": list(self.gpu_ids)}

    @classmethod
    def from_dict(cls, data: dict) -> "ServerEndpoint":
        known = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})


@dataclass(frozen=True)
class GenerationSettings:
    """Sampling and client behaviour for one run; JSON-safe through ``to_dict``/``from_dict``."""

    model: str
    max_tokens: int
    temperature: float = 0.6
    top_p: float = 0.95
    # Sent as-is in every request body, e.g. {"chat_template_kwargs": {...}, "separate_reasoning": True}.
    extra_body: dict = field(default_factory=dict)
    request_timeout_s: float | None = None  # None: sized from max_tokens (see effective_request_timeout_s)
    connect_timeout_s: float = 10.0
    max_attempts: int = 5  # tries per prompt across servers before it is written off as failed
    retry_backoff_s: float = 0.5  # first delay before a failed prompt is offered again; doubles per try
    recheck_initial_s: float = 1.0  # first health re-check of a server marked down; doubles per failure
    recheck_max_s: float = 30.0
    # SGLang 0.5.23's /health (http_server.py ``health_generate``) answers 200 at its first 1 s tick on
    # which the scheduler produced anything, so a busy healthy server answers in about a second; a hung
    # one only after SGLANG_HEALTH_CHECK_TIMEOUT (20 s). 5 s tells them apart (docs/sglang-memory-model.md §5.3).
    health_timeout_s: float = 5.0
    # A server with requests in flight that has answered nothing for this long gets a /health probe;
    # if that fails too it is marked down and its requests go elsewhere, without waiting out the
    # (long) request timeout. Busy but healthy servers answer /health and are left alone, so the probe
    # costs one cheap request; together with health_timeout_s a hang costs under 10 s once per run.
    stall_check_s: float = 4.0
    all_down_timeout_s: float = 120.0  # every server down this long fails the shard
    client_error_breaker: int = 20  # this many client errors before any success stops the shard
    # A new try of a shard whose output an older, still-live try holds waits this long for it to stop
    # (it is told to stop at its next write or progress save; see generate/lease.py).
    lease_wait_s: float = 60.0
    # Share server health with the other shards of the run through a file in the run's output folder
    # (generate/health.py): a server one shard found down is skipped by all until re-checked.
    share_server_health: bool = True
    sample_interval_s: float = 5.0  # scrape every server's /metrics this often (0: no occupancy series)
    # Re-read every server's /server_info this often to know it is still the launch wait_ready read (one cheap
    # request per server; generate/launch_check.py), besides at the shard's start and before a trial request.
    launch_check_s: float = 30.0

    def __post_init__(self) -> None:
        problems = []
        if not self.model:
            problems.append("model is empty")
        if not is_positive_int(self.max_tokens):
            problems.append(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if not 0 <= self.temperature:
            problems.append(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            problems.append(f"top_p must be in (0, 1], got {self.top_p}")
        if not isinstance(self.extra_body, dict):
            problems.append("extra_body must be a dict")
        if self.request_timeout_s is not None and not self.request_timeout_s > 0:
            problems.append(f"request_timeout_s must be > 0, got {self.request_timeout_s}")
        if not is_positive_int(self.max_attempts) or not is_positive_int(self.client_error_breaker):
            problems.append("max_attempts and client_error_breaker must be positive integers")
        for name in ("connect_timeout_s", "retry_backoff_s", "recheck_initial_s", "recheck_max_s",
                     "health_timeout_s", "all_down_timeout_s", "stall_check_s", "lease_wait_s", "launch_check_s"):
            if not getattr(self, name) > 0:
                problems.append(f"{name} must be > 0, got {getattr(self, name)}")
        if not self.sample_interval_s >= 0:
            problems.append(f"sample_interval_s must be >= 0, got {self.sample_interval_s}")
        if problems:
            raise ConfigError("invalid generation settings: " + "; ".join(problems),
                              hint="check the generation parameters of the run")

    @property
    def effective_request_timeout_s(self) -> float:
        if self.request_timeout_s is not None:
            return self.request_timeout_s
        return 2 * self.max_tokens / SLOWEST_DECODE_TOKENS_PER_S + TIMEOUT_MARGIN_S

    def sampling(self, overrides: dict | None = None) -> dict:
        """The sampling parameters of one request: the run's, then the prompt's overrides."""
        params = {"max_tokens": self.max_tokens, "temperature": self.temperature, "top_p": self.top_p}
        if overrides:
            params.update(overrides)
        return params

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "GenerationSettings":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown generation settings: {', '.join(unknown)}",
                              hint=f"known settings: {', '.join(sorted(known))}")
        return cls(**data)


def server_limits(effective_mrr_by_server: dict[str, int], *, headroom: float, parallel_shards: int) -> dict[str, int]:
    """Each shard's in-flight limit per server, so that all shards together hold about mrr x headroom.

    ``effective_mrr_by_server`` is the effective max_running_requests read back from each server
    (``internal_states[].effective_max_running_requests_per_dp`` summed over DP ranks,
    docs/sglang-memory-model.md §5.5), not the requested flag. The fleet total per server is at least mrr + 1 so
    the server's waiting queue never runs dry between a finish and the next request; rounding each
    shard's share up overshoots by fewer than ``parallel_shards`` requests.
    """
    if not headroom >= 1.0:
        raise ConfigError(f"headroom must be >= 1.0, got {headroom}", hint="use e.g. 1.25 (25 % queued)")
    if not is_positive_int(parallel_shards):
        raise ConfigError(f"parallel_shards must be a positive integer, got {parallel_shards!r}",
                          hint="pass the number of generate_shard tasks that run at once")
    limits = {}
    for server, mrr in effective_mrr_by_server.items():
        if not is_positive_int(mrr):
            raise ConfigError(f"effective max_running_requests must be a positive integer, got {mrr!r}",
                              server=server, hint="check the /server_info readback of this server")
        fleet_total = max(math.ceil(mrr * headroom), mrr + 1) if headroom > 1.0 else mrr
        limits[server] = math.ceil(fleet_total / parallel_shards)
    return limits


def shard_endpoints(readiness: list[dict], *, headroom: float, parallel_shards: int) -> list[ServerEndpoint]:
    """The servers a shard sends to, from the readiness results, each with its share of the in-flight limit.

    ``parallel_shards`` 0 means shared automatically: the shard starts with the whole limit and follows
    how many shards are running (see ``Dispatcher``)."""
    limits = server_limits({ready["server"]: ready["effective_max_running_requests"] for ready in readiness},
                           headroom=headroom, parallel_shards=parallel_shards or 1)
    return [ServerEndpoint(name=ready["server"], url=ready["url"], max_in_flight=limits[ready["server"]],
                           host=ready["host"], gpu_ids=tuple(ready["gpu_ids"]),
                           effective_max_running_requests=ready["effective_max_running_requests"],
                           launch_id=ready.get("launch_id"), launch_fields=dict(ready.get("launch_fields") or {}))
            for ready in readiness]
