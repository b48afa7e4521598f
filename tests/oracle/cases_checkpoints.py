"""Oracle matrix cases: Quantized and single-file checkpoints: weight bytes and KV dtype as SGLang reads them.

- ``llama3.3-70b-nvfp4``: a ModelOpt NVFP4 export whose quantization lives only in ``hf_quant_config.json``,
  with ``kv_cache_quant_algo: FP8``: SGLang stores the KV cache in FP8 under ``--kv-cache-dtype auto``;
- FP8 KV by flag (``--kv-cache-dtype fp8_e4m3``) on a plain checkpoint, and the flag overriding the checkpoint's
  FP8 KV back to bf16;
- ``llama3.2-1b``: a single ``model.safetensors`` without an index (weights from its header);
- ``gemma-3-4b-it``: a ``text_config`` without ``max_position_embeddings`` or head counts, whose values are
  Gemma3TextConfig's defaults (131,072 tokens), for a workload that needs more than 2,048;
- ``--quantization`` on a ModelOpt checkpoint, which SGLang overrides with the checkpoint's own method;
- ``deepseek-v3``: FP8 block-quantized in config.json, and a ``--quantization`` it contradicts, which SGLang
  refuses (``_verify_quantization``) and so do the tuner and the simulator;
- ``llama3.1-8b-fp8-modelopt``: ModelOpt FP8 with FP8 KV in ``hf_quant_config.json``, refused on an A100 (compute
  capability 8.0 < 8.9, ``model_loader/loader.py``);
- ``llama3.1-8b-fp8-compressed`` (compressed-tensors FP8, bf16 KV), ``qwen2.5-7b-awq`` and
  ``qwen2.5-7b-gptq-int4`` (moved to their Marlin kernels), and an AWQ flag on the GPTQ checkpoint, refused.
"""

from oracle_harness import MatrixCase

KV_FP8 = ("--kv-cache-dtype", "fp8_e4m3")
KV_BF16 = ("--kv-cache-dtype", "bf16")

CHECKPOINT_CASES: list[MatrixCase] = [
    MatrixCase("ckpt-nvfp4-fp8kv-b200", "llama3.3-70b-nvfp4", "B200"),
    MatrixCase("ckpt-nvfp4-fp8kv-h200", "llama3.3-70b-nvfp4", "H200"),
    MatrixCase("ckpt-nvfp4-fp8kv-h100", "llama3.3-70b-nvfp4", "H100"),
    MatrixCase("ckpt-nvfp4-fp8kv-a100-tp2", "llama3.3-70b-nvfp4", "A100-80G", tp=2),
    MatrixCase("ckpt-nvfp4-bf16kv-flag-h200", "llama3.3-70b-nvfp4", "H200", extra_args=KV_BF16),
    MatrixCase("ckpt-nvfp4-flag-agrees-b200", "llama3.3-70b-nvfp4", "B200",
               extra_args=("--quantization", "modelopt_fp4")),
    # a ModelOpt checkpoint keeps its own method whatever --quantization names
    MatrixCase("ckpt-nvfp4-flag-overridden-b200", "llama3.3-70b-nvfp4", "B200", extra_args=("--quantization", "awq")),
    # FP8 block-quantized (quantization_config quant_method fp8, weight_block_size [128, 128]): weights as stored
    MatrixCase("ckpt-fp8-block-deepseek-v3-h200-tp8", "deepseek-v3", "H200", tp=8),
    MatrixCase("ckpt-fp8-block-deepseek-v3-b200-tp8-fp8kv", "deepseek-v3", "B200", tp=8, extra_args=KV_FP8),
    MatrixCase("ckpt-fp8-block-flag-contradicts", "deepseek-v3", "H200", tp=8, extra_args=("--quantization", "gptq"),
               refused="does not match the quantization method specified in the `quantization` argument (gptq)"),
    # ModelOpt FP8 with FP8 KV from hf_quant_config.json; below compute capability 8.9 SGLang refuses it at load
    MatrixCase("ckpt-modelopt-fp8-fp8kv-h100", "llama3.1-8b-fp8-modelopt", "H100"),
    MatrixCase("ckpt-modelopt-fp8-fp8kv-l40s", "llama3.1-8b-fp8-modelopt", "L40S"),
    MatrixCase("ckpt-modelopt-fp8-a100-refused", "llama3.1-8b-fp8-modelopt", "A100-80G",
               refused="The quantization method modelopt_fp8 is not supported for the current GPU. Minimum "
                       "capability: 89. Current capability: 80."),
    # compressed-tensors FP8 (kv_cache_scheme null: the KV cache stays bf16), AWQ and GPTQ (Marlin on CUDA)
    MatrixCase("ckpt-compressed-tensors-fp8-h100", "llama3.1-8b-fp8-compressed", "H100"),
    MatrixCase("ckpt-compressed-tensors-fp8-a100-40g", "llama3.1-8b-fp8-compressed", "A100-40G"),
    MatrixCase("ckpt-awq-h100", "qwen2.5-7b-awq", "H100"),
    MatrixCase("ckpt-awq-l40s-fp8kv", "qwen2.5-7b-awq", "L40S", extra_args=KV_FP8),
    MatrixCase("ckpt-gptq-a100-40g", "qwen2.5-7b-gptq-int4", "A100-40G"),
    MatrixCase("ckpt-gptq-b200", "qwen2.5-7b-gptq-int4", "B200"),
    MatrixCase("ckpt-awq-flag-on-gptq-refused", "qwen2.5-7b-gptq-int4", "H100", extra_args=("--quantization", "awq"),
               refused="Quantization method specified in the model config (gptq) does not match the quantization "
                       "method specified in the `quantization` argument (awq)."),
    MatrixCase("ckpt-fp8kv-flag-llama-8b-h100", "llama3.1-8b", "H100", extra_args=KV_FP8),
    MatrixCase("ckpt-fp8kv-flag-llama-8b-l40s", "llama3.1-8b", "L40S", extra_args=KV_FP8),
    MatrixCase("ckpt-single-file-llama-1b-h100", "llama3.2-1b", "H100"),
    MatrixCase("ckpt-single-file-llama-1b-l40s-fp8kv", "llama3.2-1b", "L40S", extra_args=KV_FP8),
    MatrixCase("ckpt-gemma3-text-defaults-h100", "gemma-3-4b-it", "H100"),
    MatrixCase("ckpt-gemma3-text-defaults-a100-40g", "gemma-3-4b-it", "A100-40G"),
]
