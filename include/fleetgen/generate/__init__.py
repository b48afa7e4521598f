"""The generation hot path: settings, the pull-based dispatcher, and exactly-once per-shard output."""

from fleetgen.generate.settings import GenerationSettings, ServerEndpoint, server_limits, shard_endpoints
from fleetgen.generate.shard import ShardRunOptions, run_shard, run_shard_async

__all__ = ["GenerationSettings", "ServerEndpoint", "ShardRunOptions", "run_shard", "run_shard_async", "server_limits",
           "shard_endpoints"]
