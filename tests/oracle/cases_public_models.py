"""Oracle matrix cases: Public models outside the seed families (MoE, Gemma, Mistral, Llama 4) and small GPUs.

Each preset is the public checkpoint's config.json (``sglang_sim/models/<preset>``) with its real weight bytes
(``sglang_sim.presets.PRESET_WEIGHTS_BYTES``):

- qwen3-30b-a3b: Qwen/Qwen3-30B-A3B (Qwen3-MoE, 128 experts, GQA 4 KV heads);
- mixtral-8x7b: mistralai/Mixtral-8x7B-v0.1 (8 experts, GQA 8 KV heads);
- deepseek-v3: deepseek-ai/DeepSeek-V3 (MLA + MoE, FP8 block-quantized weights, one MTP layer);
- mistral-small-3.1-24b: mistralai/Mistral-Small-3.1-24B-Instruct-2503 (Mistral3ForConditionalGeneration,
  a Pixtral vision tower: multimodal to SGLang);
- llama4-scout: meta-llama/Llama-4-Scout-17B-16E-Instruct (16 experts; three in four layers chunked attention,
  which SGLang keeps in its hybrid SWA pool; multimodal off by default);
- llama3.2-3b, qwen3-4b: small dense models for the 24 GB GPUs (L4, A10G).
"""

from oracle_harness import MatrixCase

from fleetgen.tuning import TunerBounds

PUBLIC_MODEL_CASES: list[MatrixCase] = [
    MatrixCase("qwen3-moe-30b-h100", "qwen3-30b-a3b", "H100"),
    MatrixCase("qwen3-moe-30b-b200", "qwen3-30b-a3b", "B200"),
    MatrixCase("qwen3-moe-30b-tp2-l40s", "qwen3-30b-a3b", "L40S", tp=2),
    MatrixCase("mixtral-8x7b-tp2-h100", "mixtral-8x7b", "H100", tp=2),
    MatrixCase("mixtral-8x7b-tp4-a100-40g", "mixtral-8x7b", "A100-40G", tp=4),
    MatrixCase("mixtral-8x7b-b200-defaults", "mixtral-8x7b", "B200", bounds=TunerBounds(mode="sglang_defaults")),
    MatrixCase("deepseek-v3-tp8-h200", "deepseek-v3", "H200", tp=8),
    MatrixCase("deepseek-v3-tp8-b200", "deepseek-v3", "B200", tp=8),
    MatrixCase("deepseek-v3-tp8-h200-nextn", "deepseek-v3", "H200", tp=8,
               extra_args=("--speculative-algorithm", "NEXTN")),
    MatrixCase("deepseek-v3-tp8-b200-page-32", "deepseek-v3", "B200", tp=8, extra_args=("--page-size", "32")),
    MatrixCase("deepseek-v3-tp8-b200-nextn-fp8-kv", "deepseek-v3", "B200", tp=8,
               extra_args=("--speculative-algorithm", "NEXTN", "--kv-cache-dtype", "fp8_e4m3")),
    MatrixCase("mistral-small-3.1-h100", "mistral-small-3.1-24b", "H100"),
    MatrixCase("mistral-small-3.1-tp2-l40s", "mistral-small-3.1-24b", "L40S", tp=2),
    MatrixCase("mistral-small-3.1-b200", "mistral-small-3.1-24b", "B200"),
    MatrixCase("mistral-small-3.1-h200-mrr-500", "mistral-small-3.1-24b", "H200",
               bounds=TunerBounds(max_running_requests=500)),
    MatrixCase("llama4-scout-tp4-h100", "llama4-scout", "H100", tp=4),
    MatrixCase("llama4-scout-tp2-b200", "llama4-scout", "B200", tp=2),
    MatrixCase("llama4-scout-tp4-a100-80g", "llama4-scout", "A100-80G", tp=4),
    MatrixCase("mixtral-8x7b-tp4-l40s-fp8-kv", "mixtral-8x7b", "L40S", tp=4,
               extra_args=("--kv-cache-dtype", "fp8_e4m3")),
    MatrixCase("llama-3b-l4", "llama3.2-3b", "L4"),
    MatrixCase("llama-3b-a10g", "llama3.2-3b", "A10G"),
    MatrixCase("qwen3-4b-l4", "qwen3-4b", "L4"),
    MatrixCase("qwen3-4b-a10g-mrr-64", "qwen3-4b", "A10G", bounds=TunerBounds(max_running_requests=64)),
    MatrixCase("qwen3-4b-tp2-a10g", "qwen3-4b", "A10G", tp=2),
    MatrixCase("qwen3-moe-30b-tp4-l4", "qwen3-30b-a3b", "L4", tp=4),
    MatrixCase("mixtral-8x7b-tp8-a10g", "mixtral-8x7b", "A10G", tp=8),
    MatrixCase("qwen3-4b-a10g-defaults", "qwen3-4b", "A10G", bounds=TunerBounds(mode="sglang_defaults")),
    MatrixCase("llama-3b-l4-context-64k", "llama3.2-3b", "L4", extra_args=("--context-length", "65536")),
]
