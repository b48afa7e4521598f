"""SGLang 0.5.23's launch flags, parsed the way SGLang parses them (docs/sglang-memory-model.md §1, §1.7).

A plain ``argparse.ArgumentParser(prog="sglang serve")`` with prefix abbreviation on, so the
0.5.9 name ``--cuda-graph-max-bs`` fails with argparse's "ambiguous option" error and
``--mamba-scheduler-strategy`` with "unrecognized arguments", both exiting 2.

Flags that change nothing the simulation models (tokenizer, backends, logging, scheduling policy,
hierarchical cache, torch.compile) are accepted and reported back in ``/server_info``.
``--cuda-graph-config`` is not accepted: use the per-phase ``--cuda-graph-*`` flags.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

SPEC_ALGORITHMS = ["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK", "UNO"]
GRAPH_BACKENDS = ["full", "breakable", "disabled"]
MAMBA_STRATEGIES = ["auto", "no_buffer", "extra_buffer", "extra_buffer_lazy"]
KV_CACHE_DTYPES = ["auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16", "fp4_e2m1"]
_SUFFIX = {"k": 10**3, "m": 10**6, "g": 10**9}


def human_int(text: str) -> int:
    """``800000``, ``800k``, ``1.5M`` -> int (SGLang's --max-total-tokens takes human-readable ints)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKmMgG]?)\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}")
    return int(float(match.group(1)) * _SUFFIX.get(match.group(2).lower(), 1))


def _model_flags(add) -> None:
    """SGLang 0.5.23's model, tokenizer and multimodal flags."""
    # model and tokenizer
    add("--model-path", "--model", dest="model_path", required=True)
    add("--tokenizer-path")
    add("--tokenizer-mode", default="auto")
    add("--tokenizer-worker-num", type=int, default=1)
    add("--skip-tokenizer-init", action="store_true")
    add("--load-format", default="auto")
    add("--model-loader-extra-config", default="{}")
    add("--trust-remote-code", action="store_true")
    add("--context-length", type=int)
    add("--is-embedding", action="store_true")
    add("--revision")
    add("--dtype", default="auto")
    add("--quantization")
    add("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES)
    add("--json-model-override-args", default="{}")
    add("--served-model-name")
    add("--weight-version", default="default")
    add("--chat-template")
    add("--completion-template")
    add("--download-dir")
    # multimodal: a VLM served without its vision tower; feature transport pools (fields/mm.py, disagg.py)
    add("--language-model-only", action="store_true")
    add("--mm-feature-transport", choices=["cpu", "cuda_ipc", "cuda_vmm"])


def _serving_flags(add) -> None:
    """SGLang 0.5.23's serving, memory and scheduling flags."""
    # serving
    add("--host", default="127.0.0.1")
    add("--port", type=int, default=30000)
    add("--api-key")
    add("--skip-server-warmup", action="store_true")
    add("--allow-auto-truncate", action="store_true")
    add("--enable-cache-report", action="store_true")
    add("--reasoning-parser")
    add("--tool-call-parser")
    add("--preferred-sampling-params")
    # memory and scheduling
    add("--mem-fraction-static", type=float)
    add("--max-running-requests", type=int)
    add("--max-queued-requests", type=int)
    add("--max-total-tokens", type=human_int)
    add("--chunked-prefill-size", type=int)
    add("--max-prefill-tokens", type=int, default=16384)
    add("--schedule-policy", default="fcfs")
    add("--schedule-conservativeness", type=float, default=1.0)
    add("--page-size", type=int)
    add("--enable-mixed-chunk", action="store_true")
    add("--disable-radix-cache", action="store_true")
    add("--disable-overlap-schedule", action="store_true")
    add("--stream-interval", type=int, default=1)
    add("--random-seed", type=int)
    add("--enable-memory-saver", action="store_true")
    add("--enable-hierarchical-cache", "--enable-hicache", dest="enable_hierarchical_cache", action="store_true")
    add("--hicache-ratio", type=float, default=2.0)
    add("--hicache-size", type=int, default=0)


def _parallel_and_graph_flags(add) -> None:
    """SGLang 0.5.23's parallelism and CUDA graphs flags."""
    # parallelism
    add("--tp-size", "--tensor-parallel-size", dest="tp_size", type=int, default=1)
    add("--dp-size", "--data-parallel-size", dest="dp_size", type=int, default=1)
    add("--pp-size", "--pipeline-parallel-size", dest="pp_size", type=int, default=1)
    add("--ep-size", "--expert-parallel-size", "--ep", dest="ep_size", type=int, default=1)
    add("--attn-dp-size", "--attention-data-parallel-size", dest="attn_dp_size", type=int, default=1)
    add("--enable-dp-attention", action="store_true")
    add("--device")  # accepted and reported; the simulated server is a GPU server whatever it says
    add("--sleep-on-idle", action="store_true")  # accepted and reported; the simulated scheduler never spins
    add("--base-gpu-id", type=int, default=0)
    add("--gpu-id-step", type=int, default=1)
    add("--nnodes", type=int, default=1)
    add("--node-rank", type=int, default=0)
    add("--dist-init-addr")
    add("--disable-custom-all-reduce", action="store_true")
    # CUDA graphs
    add("--cuda-graph-max-bs-decode", type=int)
    add("--cuda-graph-max-bs-prefill", type=int)
    add("--cuda-graph-bs-decode", type=int, nargs="+")
    add("--cuda-graph-bs-prefill", type=int, nargs="+")
    add("--cuda-graph-backend-decode", choices=GRAPH_BACKENDS)
    add("--cuda-graph-backend-prefill", choices=GRAPH_BACKENDS)
    add("--disable-cuda-graph", action="store_true")
    add("--enable-torch-compile", action="store_true")
    add("--torch-compile-max-bs", type=int, default=32)


def _state_speculative_and_backend_flags(add) -> None:
    """SGLang 0.5.23's state pools, speculative decoding, kernels, logging, --config flags."""
    # Mamba / linear-attention state
    add("--max-mamba-cache-size", type=int)
    add("--mamba-full-memory-ratio", type=float)
    add("--mamba-ssm-dtype", choices=["float32", "bfloat16", "float16"])
    add("--mamba-radix-cache-strategy", default="auto", choices=MAMBA_STRATEGIES)
    add("--mamba-track-interval", type=int, default=256)
    # sliding-window (SWA) KV pool
    add("--swa-full-tokens-ratio", type=float)
    add("--disable-hybrid-swa-memory", action="store_true")
    # speculative decoding
    add("--speculative-algorithm", choices=SPEC_ALGORITHMS)
    add("--speculative-draft-model-path", "--speculative-draft-model", dest="speculative_draft_model_path")
    add("--speculative-draft-model-revision")
    add("--speculative-num-steps", type=int)
    add("--speculative-eagle-topk", type=int)
    add("--speculative-num-draft-tokens", type=int)
    add("--speculative-accept-threshold-single", type=float, default=1.0)
    add("--speculative-accept-threshold-acc", type=float, default=1.0)
    # kernels and backends
    add("--attention-backend")
    add("--prefill-attention-backend")
    add("--decode-attention-backend")
    add("--sampling-backend")
    add("--grammar-backend")
    add("--moe-runner-backend", default="auto")
    add("--moe-a2a-backend", default="none")
    # logging and metrics
    add("--log-level", default="info")
    add("--log-level-http")
    add("--log-requests", action="store_true")
    add("--log-requests-level", type=int, default=2)
    add("--show-time-cost", action="store_true")
    add("--enable-metrics", action="store_true")
    add("--decode-log-interval", type=int, default=40)
    add("--watchdog-timeout", type=float, default=300)
    # configuration file (sglang/srt/server_args.py): YAML merged before the command line's own flags
    add("--config", type=str)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sglang serve")
    for add_group in (_model_flags, _serving_flags, _parallel_and_graph_flags, _state_speculative_and_backend_flags):
        add_group(parser.add_argument)
    return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse like SGLang; invalid flags print argparse's usage + error and exit 2.

    ``--config FILE`` is merged first, as SGLang's ``prepare_server_args`` does.
    """
    parser = build_parser()
    if "--config" in argv:
        argv = merge_config_file(parser, list(argv))
    return parser.parse_args(argv)


def _config_keys(action: argparse.Action) -> set[str]:
    return {action.dest} | {option[2:].replace("-", "_") for option in action.option_strings
                            if option.startswith("--")}


def merge_config_file(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """SGLang 0.5.23's ``ConfigArgumentMerger.merge_config_with_args`` (sglang/srt/utils/
    server_args_config_parser.py): the YAML mapping becomes ``--key value`` words placed before the
    command line's, so a flag given on the command line wins; errors are its ValueErrors."""
    import json

    import yaml

    positions = [i for i, word in enumerate(argv) if word == "--config"]
    if len(positions) > 1:
        raise ValueError("Multiple config files specified! Only one allowed.")
    if positions[0] == len(argv) - 1:
        raise ValueError("No config file specified after --config flag!")
    path = Path(argv[positions[0] + 1])
    if path.suffix.lower() not in (".yaml", ".yml"):
        raise ValueError(f"Config file must be YAML format, got: {path.suffix}")
    if not path.exists():
        raise ValueError(f"Config file not found: {path}")
    with open(path) as handle:
        config = yaml.safe_load(handle)
    if config is None:
        config = {}
    if not isinstance(config, dict):
        raise ValueError("Config file must contain a dictionary at root level")
    single = [a for a in parser._actions if isinstance(a, argparse._StoreTrueAction)
              or isinstance(a, argparse._StoreAction) or a.nargs is None]
    switches = {key for a in parser._actions if isinstance(a, argparse._StoreTrueAction) for key in _config_keys(a)}
    supported = {key for a in single for key in _config_keys(a)}
    unsupported = {key: a for a in parser._actions if a.option_strings and a not in single
                   and not {"--config", "--help", "-h"} & set(a.option_strings)
                   for key in _config_keys(a) if key not in supported}
    words: list[str] = []
    for key, value in config.items():
        norm = key.replace("-", "_")
        if norm in unsupported:
            raise ValueError(f"Unsupported config option '{norm}' with action '{unsupported[norm].__class__.__name__}'")
        if isinstance(value, bool):
            words += ([f"--{key}"] if value else []) if norm in switches else [f"--{key}", str(value).lower()]
        elif isinstance(value, list):
            words += [f"--{key}", *(str(item) for item in value)] if value else []
        else:
            words += [f"--{key}", json.dumps(value) if isinstance(value, dict) else str(value)]
    return words + argv[:positions[0]] + argv[positions[0] + 2:]
