"""Helpers of the oracle matrix: servers planned by the tuner, sized by the simulator and by SGLang 0.5.23.

Each case is a model installed on a simulated node (the simulator's presets), a GPU type, a tp size, the
user's extra SGLang args and tuner bounds. The three sides see the same inputs:

- tuner: the node's nvidia-smi output through ``fleetgen.nodes.probe`` and the installed model files;
- simulator: the server's argv as the launcher writes it, through ``sglang_sim.dryrun`` on that node;
- SGLang: the same argv in ``sglang_oracle.py`` (run once, in the SGLang venv, for every case), fed the
  memory the tuner assumes SGLang measures (its pre-load baseline, less the weights per GPU).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shlex
import subprocess

import pytest

from fleetgen.nodes import probe, remote
from fleetgen.tuning import LaunchOptions, TunerBounds, Workload, plan_server, profile_model
from fleetgen.tuning.model_files import read_model
from sglang_sim.node import create_node
from sglang_sim.nvidia_smi import render
from sglang_sim.presets import install_model

REPO = pathlib.Path(__file__).resolve().parents[2]
VENV_PYTHON = pathlib.Path(os.environ.get("FLEETGEN_SGLANG_VENV", REPO / ".sglang-venv")) / "bin" / "python"
ORACLE = pathlib.Path(__file__).with_name("sglang_oracle.py")
HOST = "oracle-node"
# nvidia-smi memory.total (MiB) and name of each GPU type; the SGLang generation follows from the name.
GPUS = {"B200": ("NVIDIA B200", 183_359, "sm100"), "H200": ("NVIDIA H200", 143_771, "sm90"),
        "H100": ("NVIDIA H100 80GB HBM3", 81_559, "sm90"), "A100-80G": ("NVIDIA A100-SXM4-80GB", 81_920, "sm80"),
        "A100-40G": ("NVIDIA A100-SXM4-40GB", 40_960, "sm80"), "L40S": ("NVIDIA L40S", 46_068, "sm89"),
        "L4": ("NVIDIA L4", 23_034, "sm89"), "A10G": ("NVIDIA A10G", 23_028, "sm86")}
SEED_SPEC = ("--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
             "--speculative-num-draft-tokens", "4")
SEED_ARGS = SEED_SPEC + ("--mamba-radix-cache-strategy", "extra_buffer", "--context-length", "8192")
WORKLOAD = Workload(max_output_tokens=4096, prompt_tokens_mean=270.0, prompt_tokens_max=1900, prompt_count=913_786)


@dataclasses.dataclass(frozen=True)
class MatrixCase:
    id: str
    preset: str
    gpu: str
    tp: int = 1
    extra_args: tuple[str, ...] = ()
    bounds: TunerBounds = TunerBounds()
    foreign_mib: int = 0
    refused: str | None = None  # a case SGLang refuses: the words of the reason the tuner and simulator name too


def _inventory(node) -> dict:
    gpu_text, _ = render(node, shlex.split(probe.GPU_QUERY)[1:])
    apps_text, _ = render(node, shlex.split(probe.APP_QUERY)[1:])
    return probe.build_inventory(HOST, probe.parse_gpu_csv(gpu_text, host=HOST),
                                 probe.parse_apps_csv(apps_text, host=HOST), {})


@dataclasses.dataclass
class Prepared:
    case: MatrixCase
    node: object
    model_dir: pathlib.Path
    plan: object = None
    argv: list = None
    plan_error: str | None = None


def prepare(case: MatrixCase, root: pathlib.Path) -> Prepared:
    """The node, the model folder and the tuner's plan (or the reason it refuses) for ``case``."""
    name, total_mib, _ = GPUS[case.gpu]
    try:
        options, refusal = dataclasses.replace(LaunchOptions.from_args(list(case.extra_args)), tp_size=case.tp), None
    except Exception as error:  # noqa: BLE001  (refused args: compared like any refusal, below)
        options, refusal = None, error
    gpu_ids = list(range(options.gpus_per_server if options else case.tp))  # tp GPUs per --dp-size replica
    node = create_node(root / case.id / "node", name=HOST, gpus=len(gpu_ids), gpu_name=name, total_mib=total_mib,
                       sim={"load_seconds": 0.3, "time_scale": 1000})
    if case.foreign_mib:
        node.set_holder(0, os.getpid(), "python", case.foreign_mib)
    # weights: the preset's bytes (sglang_sim.presets.PRESET_WEIGHTS_BYTES)
    model_dir = install_model(root / case.id / case.preset, case.preset)
    prepared = Prepared(case, node, model_dir)
    # the node's model folder read as the DAG reads it over SSH: the same command, run by a local shell
    model = read_model(lambda command: subprocess.run(["bash", "-c", command], capture_output=True, text=True,
                                                      check=True).stdout, str(model_dir), host=HOST)
    try:
        if refusal is not None:
            raise refusal
        profile = profile_model(model.config, model.weights_bytes, options, hf_quant_config=model.hf_quant_config)
        gpus = probe.select_gpus(_inventory(node), gpu_ids)
        prepared.plan = plan_server(host=HOST, gpu_ids=gpu_ids, port=30000, gpus=gpus, profile=profile,
                                    options=options, workload=WORKLOAD, bounds=case.bounds)
    except Exception as error:  # noqa: BLE001  (a refusal is a result the matrix compares)
        prepared.plan_error = f"{type(error).__name__}: {error}"
        return prepared
    spec = remote.LaunchSpec(python="python", module="sglang.launch_server", model_path=str(model_dir),
                             served_name=case.preset, port=30000, gpu_ids=tuple(gpu_ids), bind_host="127.0.0.1",
                             run_dir="/tmp/run", log_dir="/tmp/log",
                             args=tuple(remote.flags_to_args(prepared.plan.flags) + list(case.extra_args)))
    prepared.argv = spec.argv()[3:]
    return prepared


def oracle_case(case_id: str, argv: list[str], gpu: str, pre_model_load_bytes: int, available_bytes: int) -> dict:
    """One input of ``sglang_oracle.py``."""
    return {"id": case_id, "argv": list(argv), "gpu": {"total_mib": GPUS[gpu][1], "arch": GPUS[gpu][2]},
            "pre_model_load_bytes": pre_model_load_bytes, "available_bytes": available_bytes}


def require_venv() -> None:
    """Skip (fail under CI, where ``make test`` builds it) without the SGLang venv."""
    if not VENV_PYTHON.exists():
        if os.environ.get("CI"):
            pytest.fail(f"no SGLang venv at {VENV_PYTHON.parent.parent}: scripts/sglang-venv.sh did not run")
        pytest.skip(f"no SGLang venv at {VENV_PYTHON.parent.parent}; build it with scripts/sglang-venv.sh")


def run_sglang(cases: list[dict]) -> dict[str, dict]:
    """SGLang's answers for ``cases``, in one subprocess (SGLang imports once)."""
    require_venv()
    done = subprocess.run([str(VENV_PYTHON), str(ORACLE)], input=json.dumps(cases), capture_output=True, text=True,
                          timeout=1500)
    assert done.returncode == 0, done.stderr[-3000:]
    return {result["id"]: result for result in json.loads(done.stdout.strip().splitlines()[-1])}


def run_oracle(prepared: list[Prepared], extra: list[dict] = ()) -> dict[str, dict]:
    """SGLang's answers for every planned case, fed the memory the plan assumes SGLang measures, and for
    the ``extra`` oracle inputs (one SGLang import for all)."""
    cases = list(extra)
    for item in prepared:
        if item.plan is None and item.case.refused:
            # the launch as the user wrote it: SGLang refuses it before measuring memory
            total = GPUS[item.case.gpu][1] << 20
            argv = ["--model-path", str(item.model_dir), "--tp-size", str(item.case.tp), *item.case.extra_args]
            cases.append(oracle_case(item.case.id, argv, item.case.gpu, total, total))
        if item.plan is None:
            continue
        rows = {row["item"].strip(): row["bytes"] for row in item.plan.budget}
        pre = rows["pre-load free (SGLang baseline)"]
        cases.append(oracle_case(item.case.id, item.argv, item.case.gpu, pre, pre - rows["weights per GPU"]))
    return run_sglang(cases)
