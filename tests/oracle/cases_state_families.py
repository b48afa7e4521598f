"""Oracle matrix cases: the state-cache families beyond Qwen3-Next/3.5, Nemotron-H and Falcon-H1, one public
checkpoint each (``sglang_sim/models/<preset>``: its config.json, its weight bytes in
``sglang_sim.presets.PRESET_WEIGHTS_BYTES``), on varied GPUs and tp:

- granite-4.0-h-small: ibm-granite/granite-4.0-h-small (GraniteMoeHybrid: 36 Mamba2 layers, 4 GQA attention layers,
  ``layer_types``); extra_buffer by default, flashinfer on SM100 (model_overrides/granitemoehybrid.py);
- kimi-linear-48b-a3b: moonshotai/Kimi-Linear-48B-A3B-Instruct (20 KDA layers, ``KimiLinearStateShape``; 7 MLA
  layers whose KV is one latent per token);
- lfm2.5-2.6b: LiquidAI LFM2.5-2.6B (22 short-convolution layers, a conv state and no temporal state; 8 GQA
  layers); outside SGLang's extra-buffer list, so ``auto`` resolves to no_buffer and overlap scheduling goes off;
- jet-nemotron-2b: jet-ai/Jet-Nemotron-2B (24 JetBlocks, the GatedDeltaNet shape; 2 full and 2 sliding-window
  layers, both kept in the one KV pool); no_buffer as LFM2, triton on SM100;
- lfm2-8b-a1b: LiquidAI/LFM2-8B-A1B (LFM2-MoE: 18 short-conv layers, 6 GQA layers);
- falcon-mamba-7b (tiiuae/falcon-mamba-7b, Mamba-1) and mamba-codestral-7b (mistralai/Mamba-Codestral-7B-v0.1,
  Mamba-2): no attention layer, so a zero KV cell, and SGLang's token pool is --max-total-tokens, else the context
  length (2,048: their configs name none); outside SGLang's radix list, so ``auto`` stays: 3 slots a request, overlap
  scheduling on. With the context length as its only token pool a pure Mamba server holds one request at a time;
  --max-total-tokens (free: no KV cell) lets the plan run more.

None of these checkpoints has an MTP head, so none is planned with speculative decoding. Two launches their servers
refuse close the list: an explicit extra_buffer for LFM2 (no extra buffers) and for Falcon-Mamba (no radix strategy).
"""

from fleetgen.tuning import TunerBounds

from oracle_harness import MatrixCase

STATE_FAMILY_CASES: list[MatrixCase] = [
    MatrixCase("granite-4h-small-h200", "granite-4.0-h-small", "H200"),
    MatrixCase("granite-4h-small-tp2-h100", "granite-4.0-h-small", "H100", tp=2),
    MatrixCase("granite-4h-small-b200", "granite-4.0-h-small", "B200"),
    MatrixCase("granite-4h-small-tp4-l40s", "granite-4.0-h-small", "L40S", tp=4),
    MatrixCase("granite-4h-small-tp2-a100-80g-no-buffer", "granite-4.0-h-small", "A100-80G", tp=2,
               bounds=TunerBounds(no_buffer_radix=True)),
    MatrixCase("granite-4h-small-h200-bf16-ssm", "granite-4.0-h-small", "H200", bounds=TunerBounds(bf16_ssm_state=True)),
    MatrixCase("granite-4h-small-b200-defaults", "granite-4.0-h-small", "B200",
               bounds=TunerBounds(mode="sglang_defaults")),
    MatrixCase("kimi-linear-h200", "kimi-linear-48b-a3b", "H200"),
    MatrixCase("kimi-linear-tp2-h100", "kimi-linear-48b-a3b", "H100", tp=2),
    MatrixCase("kimi-linear-b200", "kimi-linear-48b-a3b", "B200"),
    MatrixCase("kimi-linear-tp4-a100-40g", "kimi-linear-48b-a3b", "A100-40G", tp=4),
    MatrixCase("kimi-linear-tp2-b200-context-128k", "kimi-linear-48b-a3b", "B200", tp=2,
               extra_args=("--context-length", "131072")),
    MatrixCase("lfm2.5-2.6b-l4", "lfm2.5-2.6b", "L4"),
    MatrixCase("lfm2.5-2.6b-a10g-tp2", "lfm2.5-2.6b", "A10G", tp=2),
    MatrixCase("lfm2.5-2.6b-h100", "lfm2.5-2.6b", "H100"),
    MatrixCase("lfm2.5-2.6b-b200", "lfm2.5-2.6b", "B200"),
    MatrixCase("lfm2.5-2.6b-l40s-defaults", "lfm2.5-2.6b", "L40S", bounds=TunerBounds(mode="sglang_defaults")),
    MatrixCase("jet-nemotron-2b-h100", "jet-nemotron-2b", "H100"),
    MatrixCase("jet-nemotron-2b-b200", "jet-nemotron-2b", "B200"),
    MatrixCase("jet-nemotron-2b-a100-40g-tp2", "jet-nemotron-2b", "A100-40G", tp=2),
    MatrixCase("jet-nemotron-2b-l4-mrr-64", "jet-nemotron-2b", "L4", bounds=TunerBounds(max_running_requests=64)),
    MatrixCase("lfm2-8b-a1b-h100", "lfm2-8b-a1b", "H100"),
    MatrixCase("lfm2-8b-a1b-b200-tp2", "lfm2-8b-a1b", "B200", tp=2),
    MatrixCase("lfm2-8b-a1b-l40s-bf16-ssm", "lfm2-8b-a1b", "L40S", bounds=TunerBounds(bf16_ssm_state=True)),
    MatrixCase("falcon-mamba-7b-h100", "falcon-mamba-7b", "H100"),
    MatrixCase("falcon-mamba-7b-l40s-max-total-tokens", "falcon-mamba-7b", "L40S",
               extra_args=("--max-total-tokens", "262144")),
    MatrixCase("codestral-mamba-tp2-a100-80g", "mamba-codestral-7b", "A100-80G", tp=2),
    MatrixCase("codestral-mamba-b200-max-total-tokens", "mamba-codestral-7b", "B200",
               extra_args=("--max-total-tokens", "65536")),
    # the radix strategies these families' servers refuse (mamba_hook.py::validate_mamba_extra_buffer,
    # model_hook.py::handle_mamba_radix_cache)
    MatrixCase("lfm2.5-2.6b-extra-buffer-refused", "lfm2.5-2.6b", "H100",
               extra_args=("--mamba-radix-cache-strategy", "extra_buffer"),
               refused="extra_buffer is not supported for Lfm2ForCausalLM; use no_buffer."),
    MatrixCase("falcon-mamba-7b-extra-buffer-refused", "falcon-mamba-7b", "H100",
               extra_args=("--mamba-radix-cache-strategy", "extra_buffer"),
               refused="--mamba-radix-cache-strategy extra_buffer needs mamba state, got FalconMambaForCausalLM."),
]
