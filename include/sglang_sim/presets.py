"""Model presets for simulated nodes: a config.json plus a generated safetensors index.

Presets live in ``sglang_sim/models/<name>/config.json`` (the seed, Llama-3.1 8B/70B, Qwen3-Next, a
DeepSeek-V2-Lite MLA model, Nemotron-H, Falcon-H1 and Qwen3-VL-8B), among them:
  qwen3.6-27b         the seed model: hybrid GatedDeltaNet, one MTP layer; weights 54e9 bytes
                      (the scenario's reported ~54 GB in bf16).
  llama3.1-8b         dense GQA (32 layers, 8 KV heads x 128); weights from the parameter estimate.
  qwen3-next-80b-a3b  hybrid MoE (512 experts, 10 active); weights from the parameter estimate.

Only ``metadata.total_size`` matters to the simulated server; the ``weight_map`` holds plausible
tensor names spread over ~5 GB shards so that tools reading the index see a normal checkpoint.
"""

from __future__ import annotations

import json
import math
import os
from importlib import resources
from pathlib import Path

from fleetgen.errors import ConfigError
from sglang_sim.modelcfg import ModelShape, from_config

PRESET_WEIGHTS_BYTES = {"qwen3.6-27b": 54_000_000_000}
SHARD_BYTES = 5_000_000_000


def preset_names() -> list[str]:
    root = resources.files("sglang_sim").joinpath("models")
    return sorted(p.name for p in root.iterdir() if p.joinpath("config.json").is_file())


def preset_config(preset: str) -> dict:
    if preset not in preset_names():
        raise ConfigError(f"unknown model preset {preset!r}", hint=f"presets: {preset_names()}")
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
        raise ConfigError(f"weights_bytes must be > 0, got {weights_bytes}")
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


def install_model(dest_dir: str | os.PathLike, preset: str = "qwen3.6-27b",
                  weights_bytes: int | None = None) -> Path:
    """Write ``config.json``, ``model.safetensors.index.json`` and the tokenizer files of ``preset`` into
    ``dest_dir``."""
    config = preset_config(preset)
    shape = from_config(config, path=f"preset {preset}")
    dest = Path(dest_dir)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    size = default_weights_bytes(preset, shape) if weights_bytes is None else int(weights_bytes)
    (dest / "model.safetensors.index.json").write_text(json.dumps(safetensors_index(shape, size)) + "\n")
    for name, content in tokenizer_files(shape).items():
        (dest / name).write_text(json.dumps(content, indent=1, ensure_ascii=False) + "\n")
    return dest
