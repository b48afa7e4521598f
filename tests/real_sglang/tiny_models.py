"""Tiny model folders the real SGLang server loads with ``--load-format dummy`` (random weights, no weight files).

Run with the SGLang venv's interpreter (it needs ``tokenizers``)::

    .sglang-venv/bin/python tests/real_sglang/tiny_models.py DEST_DIR

writes ``DEST_DIR/dense`` (LlamaForCausalLM) and ``DEST_DIR/hybrid`` (Qwen3NextForCausalLM: Gated DeltaNet
layers, one full-attention layer, MoE). Each folder holds what SGLang reads: ``config.json``,
``generation_config.json``, a byte-level BPE ``tokenizer.json`` trained here on a fixed text (so it is the
same every time) and ``tokenizer_config.json`` with a ChatML chat template (eos ``<|im_end|>``), and a
one-shard checkpoint with its index (what the tuner reads for the weights' size).
The shapes are the smallest SGLang accepts; the architectures are real ones (docs/real-sglang.md).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
VOCAB_SIZE = 512
CONTEXT_LENGTH = 2048
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# A fixed training text: the tokenizer (and so every token count) is the same on every machine.
_CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 4,
    "Tune a fleet of inference servers to the memory they have, then generate and validate. " * 4,
    "Explain step by step why the sum of two even numbers is even. Think before you answer. " * 4,
    "0123456789 + - * / = ( ) [ ] { } < > , . ; : ! ? ' \" " * 4,
]

DENSE_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "hidden_act": "silu", "max_position_embeddings": CONTEXT_LENGTH, "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": VOCAB_SIZE,
    "bos_token_id": 0, "eos_token_id": 2,
}

HYBRID_CONFIG = {
    "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 4, "full_attention_interval": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "hidden_act": "silu",
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
    "decoder_sparse_step": 1, "norm_topk_prob": True, "mlp_only_layers": [], "partial_rotary_factor": 0.25,
    "max_position_embeddings": CONTEXT_LENGTH, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": VOCAB_SIZE,
    "bos_token_id": 0, "eos_token_id": 2,
}

MODELS = {"dense": DENSE_CONFIG, "hybrid": HYBRID_CONFIG}


def write_tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(_CORPUS, trainer=trainer)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|endoftext|>", "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "unk_token": None, "model_max_length": CONTEXT_LENGTH,
        "chat_template": CHAT_TEMPLATE, "clean_up_tokenization_spaces": False,
    }, indent=1))


def write_weights(folder: Path, seed: int = 0) -> None:
    """A one-shard checkpoint as the tuner reads one: ``model.safetensors`` with every tensor of the architecture
    (names and shapes from transformers' own class for the config, random bf16 values) and
    ``model.safetensors.index.json`` whose ``total_size`` is those tensors' bytes. The servers load with
    ``--load-format dummy`` and never read it; the plan sizes the weights from it."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(folder)
    with torch.device("meta"):
        shapes = {name: tensor.shape for name, tensor in AutoModelForCausalLM.from_config(config).state_dict().items()}
    generator = torch.Generator().manual_seed(seed)
    tensors = {name: (torch.randn(shape, generator=generator) * 0.02).to(torch.bfloat16) for name, shape in shapes.items()}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    total = sum(tensor.numel() * tensor.element_size() for tensor in tensors.values())
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": {name: "model.safetensors" for name in sorted(tensors)}},
        indent=1))


def write_model(folder: Path, config: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}))
    write_tokenizer(folder)
    write_weights(folder)
    return folder


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    dest = Path(argv[0])
    for name, config in MODELS.items():
        write_model(dest / name, config)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
