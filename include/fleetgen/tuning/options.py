"""SGLang launch options that change memory, and their parsing out of a user's extra args.

A user passes SGLang flags of their own (speculative decoding, context length, ...). The ones that
change how SGLang sizes memory are read here; the tuner plans around them and never emits a flag the
user already set (docs/sglang-memory-model.md §1 lists the flags and their 0.5.23 names).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields
from decimal import Decimal

from fleetgen.errors import ConfigError
from fleetgen.tuning.architectures import architecture as architecture_entry
from fleetgen.json_types import is_json_int

KV_CACHE_DTYPES = {"auto", "bfloat16", "bf16", "float16", "fp16", "half", "float32",
                   "fp8_e4m3", "fp8_e5m2"}
SSM_DTYPES = {"float32", "bfloat16", "float16"}
RADIX_STRATEGIES = {"auto", "no_buffer", "extra_buffer", "extra_buffer_lazy"}
# NEXTN is rewritten to EAGLE by SGLang (docs/sglang-memory-model.md §1.4).
EAGLE_FAMILY = {"EAGLE", "EAGLE3", "NEXTN", "STANDALONE"}
SPEC_ALGORITHMS = EAGLE_FAMILY | {"NGRAM", "DFLASH", "DSPARK", "UNO", "FROZEN_KV_MTP"}

# Flags 0.5.23 rejects (docs/sglang-memory-model.md §1.7): a user's args holding them would kill the launch.
REJECTED_FLAGS = {
    "--mamba-scheduler-strategy": "--mamba-radix-cache-strategy",
    "--cuda-graph-max-bs": "--cuda-graph-max-bs-decode",
}
# Layouts the memory arithmetic here does not cover; planning them would be a guess.
UNMODELED = {"--pp-size", "--pipeline-parallel-size", "--attn-dp-size", "--attention-data-parallel-size",
             "--enable-dp-attention"}

_VALUE_FLAGS = {
    "--tp-size": "tp_size", "--tensor-parallel-size": "tp_size",
    "--dp-size": "dp_size", "--data-parallel-size": "dp_size",
    "--ep-size": "ep_size", "--expert-parallel-size": "ep_size", "--ep": "ep_size",
    "--swa-full-tokens-ratio": "swa_full_tokens_ratio",
    "--kv-cache-dtype": "kv_cache_dtype",
    "--quantization": "quantization",
    "--mamba-ssm-dtype": "mamba_ssm_dtype",
    "--speculative-algorithm": "speculative_algorithm",
    "--speculative-num-steps": "speculative_num_steps",
    "--speculative-eagle-topk": "speculative_eagle_topk",
    "--speculative-num-draft-tokens": "speculative_num_draft_tokens",
    "--speculative-draft-model-path": "speculative_draft_model_path",
    "--mamba-radix-cache-strategy": "mamba_radix_cache_strategy",
    "--page-size": "page_size",
    "--context-length": "context_length",
    "--mem-fraction-static": "mem_fraction_static",
    "--max-running-requests": "max_running_requests",
    "--max-mamba-cache-size": "max_mamba_cache_size",
    "--max-total-tokens": "max_total_tokens",
    "--chunked-prefill-size": "chunked_prefill_size",
    "--cuda-graph-max-bs-decode": "cuda_graph_max_bs_decode",
    "--mamba-full-memory-ratio": "mamba_full_memory_ratio",
    "--mm-feature-transport": "mm_feature_transport",
    "--attention-backend": "attention_backend",
    "--device": "device",
}
_SWITCH_FLAGS = {
    "--disable-overlap-schedule": "disable_overlap_schedule",
    "--disable-radix-cache": "disable_radix_cache",
    "--disable-cuda-graph": "disable_cuda_graph",
    "--language-model-only": "language_model_only",
    "--disable-hybrid-swa-memory": "disable_hybrid_swa_memory",
}


@dataclass(frozen=True)
class LaunchOptions:
    """The SGLang options that change memory sizing. ``None`` means SGLang's default.

    The second block holds values the tuner would otherwise choose itself; when a user pins one in
    their extra args the tuner uses it as given and does not emit that flag.
    """

    tp_size: int = 1
    # Data-parallel replicas (--dp-size): each is its own scheduler on its own tp_size GPUs with its
    # own pools (managers/data_parallel_controller.py), so a server holds tp_size x dp_size GPUs.
    dp_size: int = 1
    # Expert parallelism (--ep-size): splits the experts, not their bytes; weights per GPU stay total / tp.
    ep_size: int = 1
    disable_hybrid_swa_memory: bool = False
    swa_full_tokens_ratio: float | None = None  # None: SGLang's fallback 0.8 (arg_groups/fields/schedule.py)
    kv_cache_dtype: str = "auto"
    quantization: str | None = None  # --quantization; None: the checkpoint's own (tuning/quantization.py)
    mamba_ssm_dtype: str | None = None
    speculative_algorithm: str | None = None
    speculative_num_steps: int | None = None
    speculative_eagle_topk: int | None = None
    speculative_num_draft_tokens: int | None = None
    speculative_draft_model_path: str | None = None
    mamba_radix_cache_strategy: str = "auto"
    disable_overlap_schedule: bool = False
    disable_radix_cache: bool = False
    disable_cuda_graph: bool = False
    language_model_only: bool = False
    mm_feature_transport: str | None = None
    page_size: int | None = None  # None: SGLang picks it with the attention backend (tuning/platform.py)
    attention_backend: str | None = None
    device: str | None = None  # None: SGLang's default, the GPU; the plan sizes a GPU's memory
    context_length: int | None = None
    # Pinned by the user (else chosen by the tuner).
    mem_fraction_static: float | None = None
    max_running_requests: int | None = None
    max_mamba_cache_size: int | None = None
    max_total_tokens: int | None = None
    chunked_prefill_size: int | None = None
    cuda_graph_max_bs_decode: int | None = None
    mamba_full_memory_ratio: float | None = None

    def __post_init__(self) -> None:
        def bad(message: str, hint: str | None = None) -> ConfigError:
            return ConfigError(f"SGLang launch options: {message}", hint=hint)

        for name in ("tp_size", "dp_size", "ep_size"):
            value = getattr(self, name)
            if not is_json_int(value) or value < 1:
                raise bad(f"{name} must be a positive integer, got {value!r}")
        if self.swa_full_tokens_ratio is not None and not 0 < self.swa_full_tokens_ratio <= 1:
            # arg_groups/kv_cache_hook.py::_handle_cache_compatibility raises this before anything loads.
            raise bad("--swa-full-tokens-ratio should be in range (0, 1.0].",
                      hint="drop --swa-full-tokens-ratio or give a value in (0, 1]")
        for name in ("page_size", "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
                     "context_length", "max_running_requests", "max_mamba_cache_size", "max_total_tokens",
                     "cuda_graph_max_bs_decode"):
            value = getattr(self, name)
            if value is not None and (not is_json_int(value) or value < 1):
                raise bad(f"{name} must be a positive integer, got {value!r}")
        if self.chunked_prefill_size is not None and (
                not is_json_int(self.chunked_prefill_size)
                or (self.chunked_prefill_size < 1 and self.chunked_prefill_size != -1)):
            raise bad(f"chunked_prefill_size must be positive or -1 (off), got {self.chunked_prefill_size!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise bad(f"--kv-cache-dtype {self.kv_cache_dtype!r} is not modeled here",
                      hint=f"use one of {sorted(KV_CACHE_DTYPES)}")
        if self.mamba_ssm_dtype is not None and self.mamba_ssm_dtype not in SSM_DTYPES:
            raise bad(f"--mamba-ssm-dtype {self.mamba_ssm_dtype!r} is not one of {sorted(SSM_DTYPES)}")
        if self.mamba_radix_cache_strategy not in RADIX_STRATEGIES:
            raise bad(f"--mamba-radix-cache-strategy {self.mamba_radix_cache_strategy!r} is not one of "
                      f"{sorted(RADIX_STRATEGIES)}")
        if self.mem_fraction_static is not None and not 0 < self.mem_fraction_static < 1:
            raise bad(f"--mem-fraction-static must lie in (0, 1), got {self.mem_fraction_static}")
        if self.mamba_full_memory_ratio is not None and self.mamba_full_memory_ratio <= 0:
            raise bad(f"--mamba-full-memory-ratio must be positive, got {self.mamba_full_memory_ratio}")
        algorithm = self.speculative_algorithm
        if algorithm is not None:
            if algorithm not in SPEC_ALGORITHMS:
                raise bad(f"--speculative-algorithm {algorithm!r} is not one of {sorted(SPEC_ALGORITHMS)}")
            if algorithm in EAGLE_FAMILY and self.speculative_num_steps is None and (
                    self.speculative_eagle_topk is not None or self.speculative_num_draft_tokens is not None):
                # SGLang asserts this in speculative_hook._handle_eagle_family.
                raise bad("--speculative-eagle-topk / --speculative-num-draft-tokens need "
                          "--speculative-num-steps too (SGLang chooses all three or none)")
            if algorithm not in EAGLE_FAMILY and self.speculative_num_draft_tokens is None:
                raise bad(f"--speculative-algorithm {algorithm} needs an explicit --speculative-num-draft-tokens: "
                          "its default is not modeled here")
        elif any(v is not None for v in (self.speculative_num_steps, self.speculative_eagle_topk,
                                          self.speculative_num_draft_tokens)):
            raise bad("speculative steps/top-k/draft tokens are set but --speculative-algorithm is not")

    # -- derived values -------------------------------------------------------------------------

    @property
    def gpus_per_server(self) -> int:
        """GPUs one server launch holds: tp_size for each of its dp_size replicas."""
        return self.tp_size * self.dp_size

    @property
    def spec_enabled(self) -> bool:
        return self.speculative_algorithm is not None

    @property
    def eagle_family(self) -> bool:
        return self.speculative_algorithm in EAGLE_FAMILY

    def resolved_spec(self, architecture: str) -> tuple[int, int, int] | None:
        """(steps, topk, draft_tokens) as SGLang resolves them (docs/sglang-memory-model.md §1.4), None without spec.

        Eagle family with nothing set: ``_auto_choose_speculative_params`` -> (3, 1, 4), Llama/Grok
        (5, 4, 8), STANDALONE (3, 1, 4). topk == 1 forces draft = steps + 1.
        """
        if not self.spec_enabled:
            return None
        if not self.eagle_family:
            return (self.speculative_num_steps or 1, self.speculative_eagle_topk or 1,
                    int(self.speculative_num_draft_tokens))
        if self.speculative_num_steps is None:
            defaults = architecture_entry(architecture).eagle_defaults
            if self.speculative_algorithm != "STANDALONE" and defaults is not None:
                return defaults
            return (3, 1, 4)
        steps = self.speculative_num_steps
        topk = self.speculative_eagle_topk if self.speculative_eagle_topk is not None else 1
        draft = self.speculative_num_draft_tokens if self.speculative_num_draft_tokens is not None else steps + 1
        if topk == 1:
            draft = steps + 1
        return (steps, topk, draft)

    def replace(self, **changes) -> "LaunchOptions":
        values = asdict(self)
        values.update(changes)
        return LaunchOptions(**values)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "LaunchOptions":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"SGLang launch options: unknown field(s) {unknown}")
        return cls(**data)

    @classmethod
    def from_args(cls, extra_args: list[str]) -> "LaunchOptions":
        """Read the memory-relevant flags out of a user's extra SGLang args.

        Accepts ``--flag value`` and ``--flag=value``; flags that do not change memory are skipped
        (with their value, when the next item is not itself a flag). Old flag names that 0.5.23
        rejects, and parallel layouts this arithmetic does not cover, are errors here rather than at
        launch time.
        """
        values: dict = {}
        index = 0
        args = [str(a) for a in extra_args]
        while index < len(args):
            arg = args[index]
            index += 1
            if not arg.startswith("--"):
                continue
            name, has_inline, inline = arg.partition("=")
            if name in REJECTED_FLAGS:
                raise ConfigError(f"extra SGLang args: {name} no longer exists in SGLang 0.5.23",
                                  hint=f"use {REJECTED_FLAGS[name]} instead")
            if name in _SWITCH_FLAGS:
                values[_SWITCH_FLAGS[name]] = True
                continue
            takes_value = name in _VALUE_FLAGS or name in UNMODELED
            if not takes_value:
                if not has_inline and index < len(args) and not args[index].startswith("--"):
                    index += 1  # the value of a flag that does not change memory
                continue
            if name == "--enable-dp-attention":
                # Attention weights are split over tp / attn_dp ranks and replicated across the groups, the rest
                # over all tp ranks: weights per GPU are not the checkpoint's total / tp.
                raise ConfigError("extra SGLang args: attention data parallelism is not modeled by the tuner "
                                  "(its weights per GPU and per-group pools)",
                                  hint="drop --enable-dp-attention (--dp-size alone runs independent replicas), "
                                       "or plan this server by hand")
            if has_inline:
                raw = inline
            elif index < len(args):
                raw = args[index]
                index += 1
            else:
                raise ConfigError(f"extra SGLang args: {name} has no value")
            if name in UNMODELED:
                if raw.strip() != "1":
                    raise ConfigError(f"extra SGLang args: {name} {raw} is not modeled by the tuner "
                                      "(pipeline / attention-DP parallelism)",
                                      hint="run one tensor-parallel server per GPU group, or plan by hand")
                continue
            values[_VALUE_FLAGS[name]] = _convert(_VALUE_FLAGS[name], raw, name)
        return cls(**values)


_INT_FIELDS = {"tp_size", "dp_size", "ep_size", "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
               "page_size", "context_length", "max_running_requests", "max_mamba_cache_size",
               "max_total_tokens", "chunked_prefill_size", "cuda_graph_max_bs_decode"}
_FLOAT_FIELDS = {"mem_fraction_static", "mamba_full_memory_ratio", "swa_full_tokens_ratio"}


def _convert(field_name: str, raw: str, flag: str):
    text = raw.strip()
    try:
        if field_name in _INT_FIELDS:
            return _human_readable_int(text)
        if field_name in _FLOAT_FIELDS:
            return float(text)
    except ValueError:
        raise ConfigError(f"extra SGLang args: {flag} {raw!r} is not a number") from None
    if field_name == "speculative_algorithm":
        return text.upper()
    return text


_SI = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_IEC = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def _human_readable_int(text: str) -> int:
    """SGLang's ``utils/common.py::human_readable_int``: SI (k, M, G, T; decimals allowed) and IEC
    (Ki, Mi, Gi, Ti; integers only) suffixes, case-sensitive; a plain int otherwise."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", text)
    if not match:
        return int(text)
    number, suffix = match.groups()
    if suffix in _IEC:
        if "." in number:
            raise ValueError(text)
        return int(number) * _IEC[suffix]
    return int(Decimal(number) * _SI[suffix])
