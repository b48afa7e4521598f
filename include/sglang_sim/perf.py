"""How fast a simulated server generates: decode step time by batch size, prefill speed.

Decode is memory-bound: one step streams the weights once (for MoE, the experts the batch touches)
and each running request adds its compute (2 x active params x tokens verified per step) and its
KV/state reads. Under speculative decoding each step also runs ``num_steps`` draft passes (one
layer plus the LM head) and yields ``accept_length`` tokens per request instead of one.
Prefill is compute-bound at 50 % of the GPU's dense bf16 FLOP/s.

For the seed (Qwen3.6-27B, B200, MTP 3/1/4): ~12 ms + ~0.23 ms per running request per step, i.e.
~200 tok/s per request at batch 16 and ~5,900 tok/s per server at batch 40; prefill ~21k tok/s.
``sim.decode_base_ms`` / ``decode_per_request_ms`` / ``prefill_tokens_per_s`` override the derivation.
"""

from __future__ import annotations

from dataclasses import dataclass

from sglang_sim.modelcfg import ModelShape
from sglang_sim.node import SimSettings
from sglang_sim.resolve import Launch

# name substring -> (HBM bytes/s, dense bf16 FLOP/s); first match wins, unknown GPUs read as H100
GPU_SPEEDS = (("B300", 8.0e12, 2.25e15), ("B200", 8.0e12, 2.25e15), ("H200", 4.8e12, 0.989e15),
              ("H100", 3.35e12, 0.989e15), ("H800", 3.35e12, 0.989e15), ("H20", 4.0e12, 0.148e15),
              ("A100", 2.0e12, 0.312e15), ("L40S", 0.864e12, 0.362e15), ("L4", 0.3e12, 0.121e15),
              ("A10", 0.6e12, 0.125e15))
BANDWIDTH_EFFICIENCY = 0.75
DECODE_MFU = 0.5
PREFILL_MFU = 0.5
STEP_OVERHEAD_S = {True: 0.0015, False: 0.006}  # per step: with / without decode CUDA graphs
TYPICAL_CONTEXT_TOKENS = 1500  # KV read per request per step, averaged over a generation


def gpu_speed(gpu_name: str) -> tuple[float, float]:
    for key, bandwidth, flops in GPU_SPEEDS:
        if key in gpu_name.upper():
            return bandwidth, flops
    return 3.35e12, 0.989e15


@dataclass(frozen=True)
class Timing:
    step_base_s: float          # decode step at batch 0 (dense part)
    expert_stream_s: float      # MoE: time to stream every expert once (scaled by touched share)
    step_per_request_s: float
    accept_length: float        # tokens per request per step
    prefill_s_per_token: float
    experts: int = 0
    experts_per_token: int = 0

    def __post_init__(self) -> None:
        if self.step_base_s < 0 or self.step_per_request_s < 0 or self.accept_length < 1:
            raise ValueError(f"invalid timing {self}")

    def step_seconds(self, batch: int) -> float:
        touched = 0.0
        if self.experts and batch:
            touched = 1 - (1 - self.experts_per_token / self.experts) ** batch
        return self.step_base_s + self.expert_stream_s * touched + self.step_per_request_s * batch

    def request_rate(self, batch: int) -> float:
        """Tokens per second each of ``batch`` running requests receives."""
        return self.accept_length / self.step_seconds(max(1, batch))


def derive_timing(model: ModelShape, launch: Launch, settings: SimSettings, gpu_name: str,
                  weights_bytes: int, kv_cell_bytes: int, mamba_slot_bytes: int,
                  speed: float = 1.0) -> Timing:
    bandwidth, flops = gpu_speed(gpu_name)
    bandwidth *= BANDWIDTH_EFFICIENCY * speed
    flops *= speed
    per_gpu = weights_bytes / launch.tp
    expert_share = 0.0
    if model.num_experts:
        total = model.param_count()
        expert_share = model.moe_layers * 3 * model.hidden_size * model.num_experts * model.moe_ffn_size / total
    spec = launch.spec_algorithm is not None
    base = per_gpu * (1 - expert_share) / bandwidth + STEP_OVERHEAD_S[launch.decode_graph] / speed
    if spec:
        draft_pass = (per_gpu / model.num_layers + model.vocab_size * model.hidden_size *
                      model.dtype_bytes / launch.tp) / bandwidth
        base += launch.spec_steps * draft_pass
    tokens_per_step = launch.spec_draft_tokens if spec else 1
    active = model.param_count(active=True) / launch.tp
    per_request = (2 * active * tokens_per_step / (flops * DECODE_MFU)
                   + (mamba_slot_bytes + TYPICAL_CONTEXT_TOKENS * kv_cell_bytes) / bandwidth)
    if settings.decode_base_ms is not None:
        base, expert_share = settings.decode_base_ms / 1000 / speed, 0.0
    if settings.decode_per_request_ms is not None:
        per_request = settings.decode_per_request_ms / 1000 / speed
    prefill_rate = settings.prefill_tokens_per_s * speed if settings.prefill_tokens_per_s else \
        flops * PREFILL_MFU * launch.tp / (2 * model.param_count(active=True))
    accept = min(settings.accept_length, launch.spec_draft_tokens) if spec else 1.0
    return Timing(step_base_s=base, expert_stream_s=per_gpu * expert_share / bandwidth,
                  step_per_request_s=per_request, accept_length=accept,
                  prefill_s_per_token=1 / prefill_rate if prefill_rate else 0.0,
                  experts=model.num_experts, experts_per_token=model.experts_per_token)
