"""A run folder with known server times for the GPU-hours tests (report/gpu_hours.py): events, stats rows, plan
entries naming their GPUs as nvidia-smi does, and a tuning trial's payoff."""

from __future__ import annotations

import pandas as pd

from fleetgen.outputs import RunLayout, record_server_time

B200, H100 = "NVIDIA B200", "NVIDIA H100 80GB HBM3"


def events(*pairs: tuple[str, float]) -> list[dict]:
    return [{"event": event, "t": at, "pid": 1} for event, at in pairs]


def stats(*rows: tuple[str, float, float, int]) -> pd.DataFrame:
    """(server, finished_at, latency_s, completion tokens) per completion."""
    return pd.DataFrame([{"server": server, "finished_at": finished, "latency_s": latency, "completion_tokens": tokens}
                         for server, finished, latency, tokens in rows],
                        columns=["server", "finished_at", "latency_s", "completion_tokens"])


def plan_entry(host: str, port: int, names: list[str]) -> dict:
    return {"host": host, "port": port, "gpu_ids": list(range(len(names))),
            "inputs": {"gpus": [{"index": index, "name": name} for index, name in enumerate(names)]}}


def record(layout: RunLayout, server: str, *pairs: tuple[str, float]) -> None:
    for event, at in pairs:
        record_server_time(layout, server, event, pid=1, at=at)


def where(plan: list[dict]) -> dict[str, dict]:
    return {f"{item['host']}:{item['port']}": {"host": item["host"], "gpu_ids": item["gpu_ids"]} for item in plan}


def trial_payoff() -> dict:
    def candidate(name, rate, servers, *, incumbent=False, winner=False):
        return {"name": name, "servers": servers, "score": {"median": rate} if rate else None,
                "incumbent": incumbent, "winner": winner}

    return {"candidates": [candidate("incumbent", 1000.0, ["a:1", "b:1"], incumbent=True),
                           candidate("cap-3/4", 1250.0, ["c:1"], winner=True), candidate("no-spec", None, ["d:1"])],
            "decision": {"incumbent": "incumbent", "winner": "cap-3/4"},
            "in_use": {"candidate": "cap-3/4", "score": {"median": 1250.0}},
            "vs_auto_sizing": {"measured": True, "rate": 800.0, "source": "run night3 (tuning mode sglang_defaults)"}}
