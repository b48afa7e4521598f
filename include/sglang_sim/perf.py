"""How fast a simulated server generates: decode step time by batch size and context, prefill speed.

A decode step (docs/simulator-speed.md derives and calibrates it):

- streams the target's weights once: every byte but the embedding table (a lookup) and the checkpoint's own
  MTP layers (the draft's), at ``BANDWIDTH_EFFICIENCY`` of the GPU's HBM bandwidth (for MoE, the experts the
  batch touches), plus ``STEP_OVERHEAD_S``;
- under speculative decoding adds ``num_steps`` draft passes (one layer's share of the weights plus the LM head);
- per running request: the compute of the tokens it runs through the target (1, or the verify pass's
  ``num_draft_tokens``) at ``DECODE_MFU`` / ``VERIFY_MFU`` of the GPU's dense FLOP/s (fp8 tensor cores for an
  fp8 checkpoint), and its Mamba/GDN state: read and written once, or under speculation read once and written
  once per draft token (SGLang's intermediate state buffer, pools.py);
- per context token of the batch: its KV cells, read once.

A request gains ``accept_length`` tokens a step: 1, or under speculation ``1 + a + ... + a^(D-1)`` for D draft
tokens and the per-position acceptance a (``sim.draft_acceptance``), the same at every batch size. Prefill runs
at ``PREFILL_MFU`` of the dense FLOP/s. The fitted constants reproduce SGLang PR #34307's Qwen3.6-27B-FP8 table on
one H200 within 15 % (tests/unit/sim/test_perf_calibration.py). ``sim.decode_base_ms`` /
``decode_per_request_ms`` / ``prefill_tokens_per_s`` override the derivation.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sglang_sim.modelcfg import ModelShape
from sglang_sim.node import SimSettings
from sglang_sim.resolve import Launch

# name substring -> (HBM bytes/s, dense bf16 FLOP/s, dense fp8 FLOP/s or None without fp8 tensor cores), from
# NVIDIA's datasheets (dense, without sparsity); first match wins, unknown GPUs read as H100
GPU_SPEEDS = (("B300", 8.0e12, 2.25e15, 4.5e15), ("B200", 8.0e12, 2.25e15, 4.5e15),
              ("H200", 4.8e12, 0.989e15, 1.979e15), ("H100", 3.35e12, 0.989e15, 1.979e15),
              ("H800", 3.35e12, 0.989e15, 1.979e15), ("H20", 4.0e12, 0.148e15, 0.296e15),
              ("A100", 2.0e12, 0.312e15, None), ("L40S", 0.864e12, 0.362e15, 0.733e15),
              ("L4", 0.3e12, 0.121e15, 0.242e15), ("A10", 0.6e12, 0.125e15, None))
DEFAULT_GPU_SPEED = (3.35e12, 0.989e15, 1.979e15)
# Checkpoint quantization methods whose linear layers run on fp8 tensor cores (layers/quantization/fp8.py,
# modelopt_quant.py); any other runs at the bf16 figure.
FP8_METHODS = frozenset({"fp8", "modelopt_fp8", "w8a8_fp8"})
# Fitted to PR #34307's table (docs/simulator-speed.md §2): the share of HBM bandwidth a decode step's reads reach,
# the verify pass's and a one-token decode's MFU, the prefill's MFU, and the per-step overhead with decode CUDA
# graphs (kernel gaps and the fp8 GEMV's shortfall at one token). Without graphs: not calibrated (no measurement).
BANDWIDTH_EFFICIENCY = 0.9
DECODE_MFU = 0.4
VERIFY_MFU = 0.165
PREFILL_MFU = 0.55
STEP_OVERHEAD_S = {True: 0.0038, False: 0.006}


def gpu_speed(gpu_name: str) -> tuple[float, float, float | None]:
    for key, bandwidth, bf16, fp8 in GPU_SPEEDS:
        if key in gpu_name.upper():
            return bandwidth, bf16, fp8
    return DEFAULT_GPU_SPEED


def forward_params(model: ModelShape) -> int:
    """Parameters a token multiplies through the target: all active ones but the embedding table (a lookup)
    and the checkpoint's MTP layers (the draft's)."""
    embedding = 0 if model.tie_word_embeddings else model.vocab_size * model.hidden_size
    return replace(model, mtp_layers=0).param_count(active=True) - embedding


def accept_length(draft_tokens: int, acceptance: float) -> float:
    """Tokens a request gains per verify of a chain of ``draft_tokens``: the bonus token plus each draft
    accepted with its predecessors, ``sum(acceptance ** i for i < draft_tokens)``."""
    return sum(acceptance ** i for i in range(max(1, draft_tokens)))


@dataclass(frozen=True)
class Timing:
    step_base_s: float          # decode step at batch 0 (dense part)
    expert_stream_s: float      # MoE: time to stream every expert once (scaled by touched share)
    step_per_request_s: float
    accept_length: float        # tokens per request per step
    prefill_s_per_token: float
    experts: int = 0
    experts_per_token: int = 0
    step_per_context_token_s: float = 0.0  # KV read per token the running requests hold

    def __post_init__(self) -> None:
        if min(self.step_base_s, self.step_per_request_s, self.step_per_context_token_s) < 0 or \
                self.accept_length < 1:
            raise ValueError(f"invalid timing {self}")

    def step_seconds(self, batch: int, context_tokens: float = 0.0) -> float:
        """One decode step of ``batch`` requests holding ``context_tokens`` KV tokens between them."""
        touched = 0.0
        if self.experts and batch:
            touched = 1 - (1 - self.experts_per_token / self.experts) ** batch
        return self.step_base_s + self.expert_stream_s * touched + self.step_per_request_s * batch + \
            self.step_per_context_token_s * context_tokens

    def request_rate(self, batch: int, context_tokens: float = 0.0) -> float:
        """Tokens per second each of ``batch`` running requests receives."""
        return self.accept_length / self.step_seconds(max(1, batch), context_tokens)


def derive_timing(model: ModelShape, launch: Launch, settings: SimSettings, gpu_name: str,
                  weights_bytes: int, kv_cell_bytes: int, mamba_slot_bytes: int,
                  speed: float = 1.0) -> Timing:
    bandwidth, bf16_flops, fp8_flops = gpu_speed(gpu_name)
    bandwidth *= BANDWIDTH_EFFICIENCY * speed
    flops = (fp8_flops if fp8_flops and model.quantization in FP8_METHODS else bf16_flops) * speed
    per_gpu = weights_bytes / launch.tp
    layer_share = per_gpu / model.num_layers
    table = model.vocab_size * model.hidden_size * model.dtype_bytes / launch.tp  # embedding or LM head
    streamed = per_gpu - (0 if model.tie_word_embeddings else table) - model.mtp_layers * layer_share
    expert_share = 0.0
    if model.num_experts:
        total = model.param_count()
        expert_share = model.moe_layers * 3 * model.hidden_size * model.num_experts * model.moe_ffn_size / total
    spec = launch.spec_algorithm is not None
    base = streamed * (1 - expert_share) / bandwidth + STEP_OVERHEAD_S[launch.decode_graph] / speed
    if spec:
        base += launch.spec_steps * (layer_share + table) / bandwidth
    tokens, mfu = (launch.spec_draft_tokens, VERIFY_MFU) if spec else (1, DECODE_MFU)
    state_passes = 1 + launch.spec_draft_tokens if spec else 2
    active = forward_params(model) / launch.tp
    per_request = 2 * active * tokens / (flops * mfu) + state_passes * mamba_slot_bytes / bandwidth
    per_context_token = kv_cell_bytes / bandwidth
    if settings.decode_base_ms is not None:
        base, expert_share = settings.decode_base_ms / 1000 / speed, 0.0
    if settings.decode_per_request_ms is not None:
        per_request, per_context_token = settings.decode_per_request_ms / 1000 / speed, 0.0
    prefill_rate = settings.prefill_tokens_per_s * speed if settings.prefill_tokens_per_s else \
        flops * PREFILL_MFU * launch.tp / (2 * forward_params(model))
    accept = accept_length(launch.spec_draft_tokens, settings.draft_acceptance) if spec else 1.0
    return Timing(step_base_s=base, expert_stream_s=streamed * expert_share / bandwidth,
                  step_per_request_s=per_request, accept_length=accept,
                  prefill_s_per_token=1 / prefill_rate if prefill_rate else 0.0,
                  experts=model.num_experts, experts_per_token=model.experts_per_token,
                  step_per_context_token_s=per_context_token)
