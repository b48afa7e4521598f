"""A run report built on the synthetic run of validate_fixtures.py: three servers, two shards, ROWS completions."""

from __future__ import annotations

import json
from pathlib import Path

from validate_fixtures import MAX_TOKENS, SERVERS

from fleetgen.nodes.readiness import RankLimits, ServerInfo
from fleetgen.report.build import build_report

ROWS = 300


def plan_and_readiness(effective_running: int) -> tuple[list[dict], list[dict]]:
    """Three servers as in the fixtures; node-b:30000 runs tensor parallel over two GPUs."""
    plan, readiness = [], []
    for server, gpu_ids in zip(SERVERS, ([0], [1], [0, 1])):
        host, port = server.split(":")
        plan.append({"host": host, "gpu_ids": gpu_ids, "port": int(port),
                     "flags": {"--max-mamba-cache-size": 200, "--mem-fraction-static": 0.93},
                     "expected": {"max_running_requests": 40, "max_mamba_cache_size": 200,
                                  "max_total_num_tokens": 798_000}, "budget": []})
        limits = ServerInfo(server=server, ranks=(RankLimits(effective_running, None, 200),),
                            top_level_total_tokens=798_000, context_length=None, version="0.5.23")
        readiness.append({"server": server, "host": host, "port": int(port), "gpu_ids": gpu_ids,
                          **limits.to_dict()})
    return plan, readiness


def report_of(out: Path, run_id: str, *, effective_running: int = 40, previous: Path | None = None,
              wall_seconds: float | None = None, validation: dict | None = None) -> tuple[dict, dict]:
    plan, readiness = plan_and_readiness(effective_running)
    shards = [{"shard_id": 0, "done": 150, "failed": 1, "prompt_tokens": 1, "completion_tokens": 2, "seconds": 20.0},
              {"shard_id": 1, "done": 150, "failed": 0, "prompt_tokens": 1, "completion_tokens": 2, "seconds": 31.5}]
    validation = validation if validation is not None else {
        "success": True, "thresholds": {"max_tokens": MAX_TOKENS},
        "expectations": [{"name": "length_share", "success": True, "observed": 0.0, "bound": "<= 0.2"}]}
    brief = build_report(out, run_id=run_id, plan=plan, readiness=readiness, shard_results=shards,
                         validation=validation, previous_report=previous, wall_seconds=wall_seconds)
    return brief, json.loads(Path(brief["report_json"]).read_text())
