"""Model presets for simulated nodes: a config.json plus a generated safetensors index.

Presets live in ``sglang_sim/models/<name>/config.json`` (the seed, Llama-3.1 8B/70B, Qwen3-Next, a
DeepSeek-V2-Lite MLA model, Nemotron-H, Falcon-H1 and Qwen3-VL-8B), among them:
  qwen3.6-27b         the seed model: hybrid GatedDeltaNet, one MTP layer; weights 54e9 bytes
                      (the scenario's reported ~54 GB in bf16).
  qwen3.6-27b-fp8     its FP8 release (block-128 fp8 weights, bf16 embeddings, LM head and MTP layer), the model
                      the simulator's speed is calibrated on (docs/simulator-speed.md).
  llama3.1-8b         dense GQA (32 layers, 8 KV heads x 128); weights from the parameter estimate.
  qwen3-next-80b-a3b  hybrid MoE (512 experts, 10 active); weights from the parameter estimate.

Only ``metadata.total_size`` matters to the simulated server; the ``weight_map`` holds plausible
tensor names spread over ~5 GB shards so that tools reading the index see a normal checkpoint.

A preset in ``SINGLE_FILE_PRESETS`` ships as its public checkpoint does: one ``model.safetensors`` and no index,
written as a sparse file whose header declares the weight bytes (nothing but the header takes disk space). A
preset folder may hold an ``hf_quant_config.json`` (ModelOpt exports), installed beside config.json.
"""

from __future__ import annotations

import json
import math
import os
from importlib import resources
from pathlib import Path

from sglang_sim.errors import SimConfigError
from sglang_sim.modelcfg import INDEX_FILE, QUANT_CONFIG_FILE, ModelShape, from_config

PRESET_WEIGHTS_BYTES = {"qwen3.6-27b": 54_000_000_000,
                        # Qwen/Qwen3.6-27B-FP8 (the seed's shape, fp8 e4m3 in 128x128 blocks): 29 GiB on disk as
                        # LibertAIDAI/Qwen3.6-27B-W4A16-G128's model card compares it (docs/simulator-speed.md §1)
                        "qwen3.6-27b-fp8": 29 * 2**30,
                        # the public checkpoints' safetensors files' bytes (gpt-oss-20b: MXFP4 experts)
                        "gpt-oss-20b": 13_761_316_904, "gemma-3-270m": 536_223_056,
                        # the public checkpoints' model.safetensors.index.json metadata.total_size
                        "qwen3-30b-a3b": 61_064_245_248, "mixtral-8x7b": 93_405_585_408,
                        "llama3.2-3b": 6_425_499_648, "qwen3-4b": 8_044_936_192,
                        # DeepSeek-V3 (FP8 block-quantized, MTP layer included): its safetensors files' bytes
                        "deepseek-v3": 688_586_727_753,
                        # BF16 checkpoints at 2 bytes per parameter: Llama-4-Scout-17B-16E-Instruct's
                        # published 108,641,793,536; Mistral-Small-3.1-24B-Instruct-2503's 24,011,361,280
                        # (its config's text and Pixtral tower shapes)
                        "llama4-scout": 217_283_587_072, "mistral-small-3.1-24b": 48_022_722_560}
# Public checkpoints' bytes for the quantized and single-file presets: the index's metadata.total_size, or the
# single model.safetensors file's size.
PRESET_WEIGHTS_BYTES.update({"llama3.2-1b": 2_471_645_608,        # Llama-3.2-1B-Instruct model.safetensors
                             "gemma-3-4b-it": 8_600_158_944,
                             "llama3.3-70b-nvfp4": 42_709_045_632,  # nvidia Llama-3.3-70B-Instruct NVFP4
                             # tensor bytes of the checkpoints' own layouts: AWQ / GPTQ 4-bit (int32-packed weights
                             # and zeros, fp16 scales per 128 inputs, GPTQ's int32 g_idx; embeddings, lm_head, biases
                             # and norms fp16), FP8 (fp8 Linear weights with float32 weight/input scales, ModelOpt's
                             # k/v scales, bf16 embeddings, lm_head and norms)
                             "qwen2.5-7b-awq": 5_570_747_392, "qwen2.5-7b-gptq-int4": 5_575_277_568,
                             "llama3.1-8b-fp8-compressed": 9_081_202_432, "llama3.1-8b-fp8-modelopt": 9_081_202_688,
                             # nvidia/Qwen3.6-35B-A3B-NVFP4 revision 491c2f1: its index's tensor bytes
                             # (the model-card review in github.com/r0b0tlab/qwen36-35b-a3b-nvfp4-sm121-vllm)
                             "qwen3.6-35b-a3b-nvfp4": 23_407_580_856,
                             # computed from the shapes: MiniMax-M2.5's 228,703,644,928 parameters (the Hub's
                             # count) as stored: FP8 attention and experts with float32 scales per 128x128 block,
                             # float32 router and bias, bf16 embeddings, lm_head and norms
                             "minimax-m2.5": 230_121_630_720,
                             # computed from the shapes, every tensor bf16 (65.8 GB, the size published for the
                             # release): NVIDIA-Nemotron-3.5-Lightning-30B-A3B, its 2-layer MTP block included
                             "nemotron-3.5-lightning-30b-a3b": 65_826_532_480})
# State-cache families (docs/sglang-memory-model.md §2.3), bf16 checkpoints, computed from their config's shapes at
# 2 bytes a parameter, each tensor as the model code lays it out: ibm-granite/granite-4.0-h-small (32,207,337,984
# parameters: 36 Mamba2 and 4 attention layers, each with 72 experts and a shared expert; tied embeddings),
# moonshotai/Kimi-Linear-48B-A3B-Instruct (49,122,681,728: SGLang's models/kimi_linear.py, 20 KDA and 7 MLA layers,
# one dense and 26 MoE MLPs of 256 experts), LFM2.5-2.6B (2,697,198,592: the 266 tensors a public audit of the
# official checkpoint lists) and jet-ai/Jet-Nemotron-2B (1,964,806,208: NVlabs/Jet-Nemotron's jet_block.py and
# dynamic_conv.py for the 24 JetBlocks, Qwen2 attention with q/k/v biases for the other 4 layers).
# LiquidAI/LFM2-8B-A1B (8,339,930,560: 18 short-conv and 6 GQA layers, 2 dense and 22 MoE MLPs of 32 experts,
# tied embeddings as transformers' Lfm2MoeConfig defaults). Pure Mamba, as transformers' Mamba and Mamba2 layouts
# hold them: tiiuae/falcon-mamba-7b (7,272,665,088: 64 layers of in_proj, conv1d, x_proj, dt_proj, A_log, D,
# out_proj; untied embeddings) and mistralai/Mamba-Codestral-7B-v0.1 (7,285,403,648: 64 Mamba2 mixers with 8
# groups; untied embeddings).
PRESET_WEIGHTS_BYTES.update({"granite-4.0-h-small": 64_414_675_968, "kimi-linear-48b-a3b": 98_245_363_456,
                             "lfm2.5-2.6b": 5_394_397_184, "jet-nemotron-2b": 3_929_612_416,
                             "lfm2-8b-a1b": 16_679_861_120, "falcon-mamba-7b": 14_545_330_176,
                             "mamba-codestral-7b": 14_570_807_296})
# Presets whose public checkpoint is a single model.safetensors without an index.
SINGLE_FILE_PRESETS = frozenset({"llama3.2-1b"})
SINGLE_FILE = "model.safetensors"
SHARD_BYTES = 5_000_000_000


def preset_names() -> list[str]:
    root = resources.files("sglang_sim").joinpath("models")
    return sorted(p.name for p in root.iterdir() if p.joinpath("config.json").is_file())


def preset_config(preset: str) -> dict:
    if preset not in preset_names():
        raise SimConfigError(f"unknown model preset {preset!r}", hint=f"presets: {preset_names()}")
    text = resources.files("sglang_sim").joinpath("models", preset, "config.json").read_text()
    return json.loads(text)


def default_weights_bytes(preset: str, shape: ModelShape) -> int:
    return PRESET_WEIGHTS_BYTES.get(preset, shape.param_count() * shape.dtype_bytes)


def _layer_tensors(shape: ModelShape, prefix: str, index: int, full_attention: bool) -> list[str]:
    base = f"{prefix}.layers.{index}"
    names = [f"{base}.input_layernorm.weight", f"{base}.post_attention_layernorm.weight"]
    if not full_attention:
        names += [f"{base}.linear_attn.{t}" for t in
                  ("in_proj_qkvz.weight", "in_proj_ba.weight", "conv1d.weight", "A_log", "dt_bias",
                   "norm.weight", "out_proj.weight")]
    elif shape.is_mla:
        names += [f"{base}.self_attn.{t}.weight" for t in
                  ("q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm",
                   "kv_b_proj", "o_proj")]
    else:
        names += [f"{base}.self_attn.{t}.weight" for t in ("q_proj", "k_proj", "v_proj", "o_proj")]
    is_moe = shape.num_experts and index >= shape.num_layers - shape.moe_layers
    if is_moe:
        names.append(f"{base}.mlp.gate.weight")
        for e in range(shape.num_experts):
            names += [f"{base}.mlp.experts.{e}.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")]
        if shape.shared_ffn_size:
            names += [f"{base}.mlp.shared_expert.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")]
    else:
        names += [f"{base}.mlp.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")]
    return names


def safetensors_index(shape: ModelShape, weights_bytes: int) -> dict:
    """``{"metadata": {"total_size": N}, "weight_map": {tensor: shard file}}``."""
    if weights_bytes <= 0:
        raise SimConfigError(f"weights_bytes must be > 0, got {weights_bytes}")
    shards = max(1, math.ceil(weights_bytes / SHARD_BYTES))

    def shard(position: float) -> str:
        number = min(shards, 1 + int(position * shards))
        return f"model-{number:05d}-of-{shards:05d}.safetensors"

    prefix = "model.language_model" if shape.architecture.endswith("ConditionalGeneration") else "model"
    interval_full = {i for i in range(shape.num_layers)
                     if not shape.is_hybrid or _is_full(shape, i)}
    weight_map = {f"{prefix}.embed_tokens.weight": shard(0.0)}
    for i in range(shape.num_layers):
        for name in _layer_tensors(shape, prefix, i, i in interval_full):
            weight_map[name] = shard(i / shape.num_layers)
    weight_map[f"{prefix}.norm.weight"] = shard(0.999)
    if not shape.tie_word_embeddings:
        weight_map["lm_head.weight"] = shard(0.999)
    for m in range(shape.mtp_layers):
        for name in _layer_tensors(shape, "mtp", m, True):
            weight_map[name] = shard(0.999)
        weight_map["mtp.fc.weight"] = shard(0.999)
    return {"metadata": {"total_size": int(weights_bytes)}, "weight_map": weight_map}


def _is_full(shape: ModelShape, index: int) -> bool:
    # spread the full-attention layers evenly, as an interval does (every k-th layer)
    if not shape.full_attention_layers:  # pure Mamba
        return False
    interval = shape.num_layers // shape.full_attention_layers
    return (index + 1) % interval == 0


def _byte_alphabet() -> list[str]:
    """GPT-2's byte-to-unicode table: the 256 symbols a byte-level BPE vocabulary starts from."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


def tokenizer_files(shape: ModelShape) -> dict[str, dict]:
    """``tokenizer.json`` (a byte-level BPE over the 256 byte symbols, the end-of-sequence token added at the
    model's id) and ``tokenizer_config.json``: what a client or SGLang's router loads from a model folder."""
    eos_id = shape.eos_token_id if shape.eos_token_id is not None else 256
    eos = "<|endoftext|>"
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": eos_id, "content": eos, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  # byte symbols take the ids below 257 that the end-of-sequence token leaves free
                  "vocab": {**{symbol: index + (index >= eos_id) for index, symbol in enumerate(_byte_alphabet())},
                            eos: eos_id},
                  "merges": []},
    }
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos, "pad_token": eos, "bos_token": None,
              "model_max_length": shape.derived_context_length, "clean_up_tokenization_spaces": False,
              "chat_template": "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                               "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"}
    return {"tokenizer.json": tokenizer, "tokenizer_config.json": config}


def write_single_file(path: Path, shape: ModelShape, weights_bytes: int) -> None:
    """A sparse ``model.safetensors``: the 8-byte little-endian header length, a header whose tensors (the
    index's names, as raw bytes) span ``weights_bytes``, then a hole of that size."""
    names = list(safetensors_index(shape, weights_bytes)["weight_map"])
    share, start, header = weights_bytes // len(names), 0, {}
    for position, name in enumerate(names):
        size = weights_bytes - start if position == len(names) - 1 else share
        header[name] = {"dtype": "U8", "shape": [size], "data_offsets": [start, start + size]}
        start += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # safetensors pads the header to 8 bytes
    with open(path, "wb") as handle:
        handle.write(len(encoded).to_bytes(8, "little") + encoded)
        handle.truncate(8 + len(encoded) + weights_bytes)


def install_model(dest_dir: str | os.PathLike, preset: str = "qwen3.6-27b",
                  weights_bytes: int | None = None) -> Path:
    """Write ``config.json``, the weights' file layout (``model.safetensors.index.json``, or a sparse
    ``model.safetensors`` for a single-file preset), ``hf_quant_config.json`` where the preset has one, and the
    tokenizer files of ``preset`` into ``dest_dir``."""
    config = preset_config(preset)
    shape = from_config(config, path=f"preset {preset}")
    dest = Path(dest_dir)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    size = default_weights_bytes(preset, shape) if weights_bytes is None else int(weights_bytes)
    if preset in SINGLE_FILE_PRESETS:
        write_single_file(dest / SINGLE_FILE, shape, size)
    else:
        (dest / INDEX_FILE).write_text(json.dumps(safetensors_index(shape, size)) + "\n")
    quant = resources.files("sglang_sim").joinpath("models", preset, QUANT_CONFIG_FILE)
    if quant.is_file():
        (dest / QUANT_CONFIG_FILE).write_text(quant.read_text())
    for name, content in tokenizer_files(shape).items():
        (dest / name).write_text(json.dumps(content, indent=1, ensure_ascii=False) + "\n")
    return dest
