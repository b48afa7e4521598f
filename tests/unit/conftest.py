"""Shared by the unit tests: the fakes (generate_fakes.py: a fake fleet; validate_fixtures.py and report_fixtures.py:
a synthetic run's output), importable by name under --import-mode=importlib; and the tuner's fixtures: model
configs (tuning/configs/), the seed scenario's GPUs and args.

The seed scenario (docs/sglang-memory-model.md §4.2): 7 x B200 of 183,359 MiB, a 27B hybrid
model with ~54 GB of bf16 weights, NEXTN 3/1/4, extra_buffer with overlap, context 8192.
"""

import json
import pathlib
import sys
from types import SimpleNamespace

import pytest

from fleetgen.tuning.planner import Workload
from fleetgen.tuning.profile import LaunchOptions, profile_model

_here = str(pathlib.Path(__file__).resolve().parent)
if _here not in sys.path:
    sys.path.insert(0, _here)

CONFIGS = pathlib.Path(__file__).parent / "tuning" / "configs"
B200_TOTAL_MIB = 183_359
SEED_WEIGHTS_BYTES = 54_000_000_000
SEED_EXTRA_ARGS = ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3",
                   "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
                   "--mamba-radix-cache-strategy", "extra_buffer", "--context-length", "8192",
                   "--reasoning-parser", "qwen3", "--tp-size", "1"]


def _load_config(name: str) -> dict:
    return json.loads((CONFIGS / name).read_text())


def _gpu_row(index: int, *, total_mib: int = B200_TOTAL_MIB, driver_mib: int = 0,
             processes: list[dict] | None = None) -> dict:
    """An inventory row as the probe builds it: used = driver baseline + every process."""
    processes = processes or []
    used = driver_mib + sum(p["used_mib"] for p in processes)
    return {"index": index, "uuid": f"GPU-{index:04d}", "name": "NVIDIA B200", "total_mib": total_mib,
            "used_mib": used, "free_mib": total_mib - used, "processes": processes}


@pytest.fixture
def cases() -> SimpleNamespace:
    """Constants and helpers shared by the tuner tests."""
    return SimpleNamespace(
        load_config=_load_config, gpu_row=_gpu_row, B200_TOTAL_MIB=B200_TOTAL_MIB,
        SEED_WEIGHTS_BYTES=SEED_WEIGHTS_BYTES, SEED_EXTRA_ARGS=list(SEED_EXTRA_ARGS),
        SEED_WORKLOAD=Workload(max_output_tokens=4096, prompt_tokens_mean=270.0, prompt_tokens_max=1900,
                               prompt_count=913_786))


@pytest.fixture
def seed_config() -> dict:
    return _load_config("seed-qwen3.6-27b.json")


@pytest.fixture
def seed_options() -> LaunchOptions:
    return LaunchOptions.from_args(SEED_EXTRA_ARGS)


@pytest.fixture
def seed_profile(seed_config, seed_options):
    return profile_model(seed_config, SEED_WEIGHTS_BYTES, seed_options)


@pytest.fixture
def qwen3_next_config() -> dict:
    return _load_config("qwen3-next-80b-a3b.json")
