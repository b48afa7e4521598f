"""Oracle matrix cases: data parallel, expert parallel, sliding-window (SWA pool) and attention-sink models.

- ``--dp-size N``: every replica is its own scheduler with its own pools on its own tp GPUs
  (managers/data_parallel_controller.py); the plan's expected values are one replica's.
- ``--ep-size``: experts are split across ranks, weights per GPU stay total / tp.
- gpt-oss-20b (MXFP4 experts, attention sinks, sliding window 128 on every other layer): SGLang keeps a
  full and an SWA KV pool (pool_configurator.HybridSWAPoolConfigurator); ``--disable-hybrid-swa-memory``
  puts every layer back in the full pool; ``--swa-full-tokens-ratio`` resizes the SWA pool.
- Gemma-3 (layer_types with sliding layers): SGLang forces ``--disable-hybrid-swa-memory``
  (model_overrides/gemma2_gemma3.py), so every layer keeps full KV, with or without the flag.
"""

from fleetgen.tuning import TunerBounds

from oracle_harness import MatrixCase

PARALLEL_AND_WINDOW_CASES: list[MatrixCase] = [
    MatrixCase("llama-8b-dp2-h100", "llama3.1-8b", "H100", extra_args=("--dp-size", "2")),
    MatrixCase("llama-70b-tp2-dp2-h200", "llama3.1-70b", "H200", tp=2, extra_args=("--dp-size", "2")),
    MatrixCase("qwen3-next-tp2-ep2-h200", "qwen3-next-80b-a3b", "H200", tp=2, extra_args=("--ep-size", "2")),
    MatrixCase("gpt-oss-20b-h100", "gpt-oss-20b", "H100"),
    MatrixCase("gpt-oss-20b-b200", "gpt-oss-20b", "B200"),
    MatrixCase("gpt-oss-20b-a100-40g", "gpt-oss-20b", "A100-40G"),
    MatrixCase("gpt-oss-20b-h200-no-hybrid-swa", "gpt-oss-20b", "H200", extra_args=("--disable-hybrid-swa-memory",)),
    MatrixCase("gpt-oss-20b-h100-swa-ratio-0.5", "gpt-oss-20b", "H100", extra_args=("--swa-full-tokens-ratio", "0.5")),
    MatrixCase("gpt-oss-20b-dp2-h100", "gpt-oss-20b", "H100", extra_args=("--dp-size", "2")),
    MatrixCase("gpt-oss-20b-b200-defaults", "gpt-oss-20b", "B200", bounds=TunerBounds(mode="sglang_defaults")),
    MatrixCase("gemma-3-270m-l40s", "gemma-3-270m", "L40S"),
    MatrixCase("gemma-3-270m-h100-no-hybrid-swa", "gemma-3-270m", "H100", extra_args=("--disable-hybrid-swa-memory",)),
    # arg_groups/kv_cache_hook.py refuses a ratio outside (0, 1] before anything loads, for any model
    MatrixCase("swa-ratio-1.5-refused", "gpt-oss-20b", "H100", extra_args=("--swa-full-tokens-ratio", "1.5"),
               refused="--swa-full-tokens-ratio should be in range (0, 1.0]."),
    MatrixCase("swa-ratio-0-refused", "llama3.1-8b", "H100", extra_args=("--swa-full-tokens-ratio", "0"),
               refused="--swa-full-tokens-ratio should be in range (0, 1.0]."),
]
