"""Oracle matrix cases: public checkpoints whose config.json SGLang reads past its first look.

- ``qwen3.6-35b-a3b-nvfp4``: nvidia/Qwen3.6-35B-A3B-NVFP4, a ModelOpt mixed-precision export (``modelopt_mixed``:
  NVFP4 experts, FP8 attention). Its config.json's quantization_config has the per-layer map but no KV-cache key,
  so ``get_quant_config`` reads hf_quant_config.json, whose ``kv_cache_quant_algo: FP8`` stores the KV cache in FP8
  under ``--kv-cache-dtype auto``; on GPUs down to compute capability 8.0 (ModelOptFp4Config's).
- ``minimax-m2.5``: MiniMaxAI/MiniMax-M2.5 (FP8 block-quantized, the MiniMax-M2 architecture), whose config.json
  has no torch_dtype: SGLang takes it as float32, which ``--dtype auto`` runs in float16, a 2-byte KV cache.
- ``nemotron-3.5-lightning-30b-a3b``: NVIDIA-Nemotron-3.5-Lightning-30B-A3B, a Nemotron-H that names its layers in
  ``layers_block_type`` (23 Mamba2, 6 attention, 23 MoE) instead of ``hybrid_override_pattern``.
"""

from oracle_harness import SEED_SPEC, MatrixCase

from fleetgen.tuning import TunerBounds

CONFIG_READER_CASES: list[MatrixCase] = [
    MatrixCase("ckpt-modelopt-mixed-qwen3.6-35b-b200", "qwen3.6-35b-a3b-nvfp4", "B200"),
    MatrixCase("ckpt-modelopt-mixed-qwen3.6-35b-tp2-h200", "qwen3.6-35b-a3b-nvfp4", "H200", tp=2),
    MatrixCase("ckpt-modelopt-mixed-qwen3.6-35b-b200-nextn", "qwen3.6-35b-a3b-nvfp4", "B200", extra_args=SEED_SPEC),
    MatrixCase("ckpt-modelopt-mixed-qwen3.6-35b-a100", "qwen3.6-35b-a3b-nvfp4", "A100-80G"),
    MatrixCase("ckpt-modelopt-mixed-qwen3.6-35b-h100-bf16-kv", "qwen3.6-35b-a3b-nvfp4", "H100",
               extra_args=("--kv-cache-dtype", "bf16")),
    MatrixCase("no-dtype-minimax-m2.5-tp4-h200", "minimax-m2.5", "H200", tp=4),
    MatrixCase("no-dtype-minimax-m2.5-tp2-b200", "minimax-m2.5", "B200", tp=2),
    MatrixCase("no-dtype-minimax-m2.5-tp8-h100-defaults", "minimax-m2.5", "H100", tp=8,
               bounds=TunerBounds(mode="sglang_defaults")),
    MatrixCase("nemotron-h-block-list-lightning-h100", "nemotron-3.5-lightning-30b-a3b", "H100"),
    MatrixCase("nemotron-h-block-list-lightning-tp2-h200", "nemotron-3.5-lightning-30b-a3b", "H200", tp=2),
]
