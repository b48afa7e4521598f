"""The tuner's plan against the simulated node, built the way the product builds both sides.

Tuner side (as ``airflow/tasks.py::derive_plan`` does it): the model's ``config.json`` and
``model.safetensors.index.json`` as installed on the node, ``LaunchOptions.from_args(extra_args)``
with the server's tp size, and the GPU inventory parsed by ``fleetgen.nodes.probe`` from the node's own
``nvidia-smi`` output (the fake one, rendered in-process: the same text the binary prints).
Simulator side: the server's argv as ``remote.LaunchSpec`` builds it (plan flags, then the user's
extra args) sized by ``sglang_sim.dryrun`` on the same node, or launched for real.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import socket
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from fleetgen.nodes import probe
from fleetgen.nodes import remote
from fleetgen.tuning.profile import LaunchOptions, profile_model, weights_bytes_from_index
from sglang_sim.node import SimNode, create_node
from sglang_sim.nvidia_smi import render
from sglang_sim.presets import install_model
from fleetgen.tuning.planner import ServerPlan, TunerBounds, Workload, plan_server

B200_MIB = 183_359
SEED_GPUS = 7
SEED_WEIGHTS = 54_000_000_000
# The seed scenario (docs/sglang-memory-model.md §4.2): NEXTN 3/1/4, extra_buffer with overlap,
# context 8192, reasoning parser
SEED_EXTRA_ARGS = ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3",
                   "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
                   "--mamba-radix-cache-strategy", "extra_buffer", "--context-length", "8192",
                   "--reasoning-parser", "qwen3"]
SEED_WORKLOAD = Workload(max_output_tokens=4096, prompt_tokens_mean=270.0, prompt_tokens_max=1900,
                         prompt_count=913_786)
HOST = "sim-node-0"


def inventory_from_nvidia_smi(node: SimNode, our_pids: dict[int, int] | None = None) -> dict:
    """The probe stage's inventory of ``node``: its nvidia-smi answers to the probe's two queries."""
    gpu_text, gpu_rc = render(node, shlex.split(probe.GPU_QUERY)[1:])
    apps_text, apps_rc = render(node, shlex.split(probe.APP_QUERY)[1:])
    assert gpu_rc == 0 and apps_rc == 0, gpu_text + apps_text
    return probe.build_inventory(HOST, probe.parse_gpu_csv(gpu_text, host=HOST),
                                 probe.parse_apps_csv(apps_text, host=HOST), our_pids or {})


@dataclasses.dataclass(frozen=True)
class Case:
    """One server to plan and check: a model installed on the node, its GPUs and the user's args."""

    model_dir: Path
    gpu_ids: tuple[int, ...]
    extra_args: tuple[str, ...] = ()
    bounds: TunerBounds = TunerBounds()
    workload: Workload = SEED_WORKLOAD
    port: int = 30000

    def plan(self, node: SimNode, our_pids: dict[int, int] | None = None, calibration_bytes: int = 0) -> ServerPlan:
        """The plan from the node's nvidia-smi now; ``our_pids`` ({pid: port}) are the servers the
        probe recognises as ours (their memory counts as free: they are stopped before the launch)."""
        config = json.loads((self.model_dir / "config.json").read_text())
        index_path = self.model_dir / "model.safetensors.index.json"
        weights = weights_bytes_from_index(json.loads(index_path.read_text()), path=str(index_path))
        options = LaunchOptions.from_args(list(self.extra_args))
        # tp GPUs for each --dp-size replica
        options = dataclasses.replace(options, tp_size=len(self.gpu_ids) // options.dp_size)
        profile = profile_model(config, weights, options, config_path=str(self.model_dir / "config.json"))
        gpus = probe.select_gpus(inventory_from_nvidia_smi(node, our_pids), self.gpu_ids)
        return plan_server(host=HOST, gpu_ids=list(self.gpu_ids), port=self.port, gpus=gpus, profile=profile,
                           options=options, workload=self.workload, bounds=self.bounds,
                           calibration_bytes=calibration_bytes)

    def server_argv(self, plan: ServerPlan) -> list[str]:
        """The server's flags as the launcher writes them (``python -m MODULE`` left off)."""
        spec = remote.LaunchSpec(python="python", module="sglang_sim.server", model_path=str(self.model_dir),
                                 served_name=self.model_dir.name, port=self.port, gpu_ids=self.gpu_ids,
                                 bind_host="127.0.0.1", run_dir="/tmp/run", log_dir="/tmp/log",
                                 args=tuple(remote.flags_to_args(plan.flags) + list(self.extra_args)))
        return spec.argv()[3:]


def budget(plan: ServerPlan) -> dict[str, int]:
    return {row["item"].strip(): row["bytes"] for row in plan.budget}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> SimpleNamespace:
    """The presets installed once per module, as ``fleetgen-sim install-model`` writes them."""
    root = tmp_path_factory.mktemp("models")
    return SimpleNamespace(seed=install_model(root / "qwen3.6-27b", "qwen3.6-27b", SEED_WEIGHTS),
                           llama=install_model(root / "llama3.1-8b", "llama3.1-8b"),
                           qwen3_next=install_model(root / "qwen3-next-80b-a3b", "qwen3-next-80b-a3b"),
                           gpt_oss=install_model(root / "gpt-oss-20b", "gpt-oss-20b"))


@pytest.fixture
def seed_node(tmp_path) -> SimNode:
    """The seed's node: 7 x B200 of 183,359 MiB, idle (nvidia-smi shows the driver baseline only)."""
    return create_node(tmp_path / "node", name=HOST, gpus=SEED_GPUS, total_mib=B200_MIB,
                       sim={"load_seconds": 0.3, "time_scale": 1000})


@pytest.fixture
def xc():
    """This module: the constants and helpers above (tests cannot import conftest by name)."""
    return sys.modules[__name__]
