"""Cost of the model identity (``fleetgen.tuning.model_files.model_identity``): header hashes vs a full content hash.

The identity decides whether last night's completions may be reused (docs/output-formats.md §3.9). By default it
reads each safetensors file's size, its header and 16 sampled blocks of 64 KiB; ``weights_hash="full"`` also
reads every weight byte. Both run here side by side, through the same command the ``model_identity`` task runs on
the node (``bash -c``, the remote Python program, the SGLang version lookup), on two checkpoints shaped like real
public ones (tensor names, shapes and bf16 byte spans from their config.json; the tensor bytes match their
published checkpoints' exactly):

- ``Qwen2.5-0.5B-Instruct``: one ``model.safetensors`` of 988,065,536 tensor bytes and no index file, filled with
  random bytes (written to disk, so the full hash reads real data; it is then in the page cache: a warm read).
- ``Qwen2.5-3B-Instruct``: 6,171,877,376 tensor bytes (its index's ``total_size``) in two files of at most 4 GB
  plus ``model.safetensors.index.json``; the tensor bytes are a sparse hole, so the full hash measures SHA-256
  itself, not the disk (a cold read from disk is slower still: add the disk's read time).

``--smoke`` measures two tiny checkpoints of the same shape instead, one file and several (with an index).

Each measure is the median of ``--repeat`` runs.
Usage: ``python bench/model_identity.py [--repeat 3] [--keep] [--smoke]``
Last line: ``model_identity header_seconds=<x> full_seconds=<y> full_gib_per_s=<z> bytes=<n>`` (the 3B case).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import parse_args
from fleetgen.tuning.model_files import model_identity

# From the models' config.json (hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
# num_key_value_heads, vocab_size; tie_word_embeddings: true); bf16, 2 bytes a parameter.
QWEN25 = {"Qwen2.5-0.5B-Instruct": (896, 4864, 24, 14, 2, 151936),
          "Qwen2.5-3B-Instruct": (2048, 11008, 36, 16, 2, 151936)}
PUBLISHED_TENSOR_BYTES = {"Qwen2.5-0.5B-Instruct": 988_065_536, "Qwen2.5-3B-Instruct": 6_171_877_376}
MAX_FILE_BYTES = 4 * 1000**3
# The small mode's checkpoints: Qwen2-shaped, small enough for a second; the second one is split into files.
TINY = {"tiny-single": (64, 128, 2, 4, 2, 1024), "tiny-sharded": (64, 256, 4, 4, 2, 2048)}
TINY_MAX_FILE_BYTES = 512 << 10
# Each set: (checkpoint, real bytes) in order; the last line reports the last one.
CHECKPOINTS = {"qwen2.5": (("Qwen2.5-0.5B-Instruct", True), ("Qwen2.5-3B-Instruct", False)),
               "tiny": (("tiny-single", True), ("tiny-sharded", False))}
SMOKE = {"checkpoints": "tiny", "max_file_bytes": TINY_MAX_FILE_BYTES, "repeat": 1}


def tensors(hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int, vocab: int) -> list[tuple]:
    """(name, shape) of a Qwen2 checkpoint in the order save_pretrained writes them."""
    kv = kv_heads * (hidden // heads)
    out = [("model.embed_tokens.weight", [vocab, hidden])]
    for layer in range(layers):
        prefix = f"model.layers.{layer}."
        out += [(prefix + "input_layernorm.weight", [hidden]),
                (prefix + "self_attn.q_proj.weight", [hidden, hidden]), (prefix + "self_attn.q_proj.bias", [hidden]),
                (prefix + "self_attn.k_proj.weight", [kv, hidden]), (prefix + "self_attn.k_proj.bias", [kv]),
                (prefix + "self_attn.v_proj.weight", [kv, hidden]), (prefix + "self_attn.v_proj.bias", [kv]),
                (prefix + "self_attn.o_proj.weight", [hidden, hidden]),
                (prefix + "post_attention_layernorm.weight", [hidden]),
                (prefix + "mlp.gate_proj.weight", [intermediate, hidden]),
                (prefix + "mlp.up_proj.weight", [intermediate, hidden]),
                (prefix + "mlp.down_proj.weight", [hidden, intermediate])]
    return out + [("model.norm.weight", [hidden])]


def write_checkpoint(folder: Path, name: str, *, real_bytes: bool, max_file_bytes: int = MAX_FILE_BYTES) -> int:
    """The model folder: config.json, tokenizer files, the safetensors file(s) (and index when several)."""
    folder.mkdir(parents=True)
    shape = {**QWEN25, **TINY}[name]
    hidden, intermediate, layers, heads, kv_heads, vocab = shape
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["Qwen2ForCausalLM"], "hidden_size": hidden, "intermediate_size": intermediate,
        "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
        "vocab_size": vocab, "tie_word_embeddings": True, "torch_dtype": "bfloat16"}))
    (folder / "generation_config.json").write_text('{"temperature": 0.7, "top_p": 0.8}')
    (folder / "tokenizer_config.json").write_text('{"chat_template": "{{ messages }}"}')
    files: list[list[tuple]] = [[]]
    size = 0
    for tensor, dims in tensors(*shape):
        count = 2
        for dim in dims:
            count *= dim
        if size + count > max_file_bytes and files[-1]:
            files.append([])
            size = 0
        files[-1].append((tensor, dims, count))
        size += count
    names = ["model.safetensors"] if len(files) == 1 else \
        [f"model-{n + 1:05d}-of-{len(files):05d}.safetensors" for n in range(len(files))]
    weight_map, total = {}, 0
    for file_name, group in zip(names, files):
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        for tensor, shape, count in group:
            header[tensor] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + count]}
            weight_map[tensor] = file_name
            offset += count
        encoded = json.dumps(header, separators=(",", ":")).encode()
        encoded += b" " * (-len(encoded) % 8)  # safetensors pads its header to 8 bytes
        with (folder / file_name).open("wb") as handle:
            handle.write(struct.pack("<Q", len(encoded)) + encoded)
            if real_bytes:
                for _ in range(offset // (64 << 20)):
                    handle.write(os.urandom(64 << 20))
                handle.write(os.urandom(offset % (64 << 20)))
            else:
                handle.truncate(8 + len(encoded) + offset)
        total += offset
    if len(names) > 1:
        (folder / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": weight_map}))
    assert total == PUBLISHED_TENSOR_BYTES.get(name, total), (name, total)
    return total


def run_local(command: str, timeout_s: float) -> str:
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=True,
                          timeout=timeout_s).stdout


def measure(folder: Path, weights_hash: str, repeat: int) -> tuple[float, dict]:
    seconds, identity = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        identity = model_identity(run_local, str(folder), python=sys.executable, module="fleetgen",
                                  weights_hash=weights_hash)
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds), identity


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--checkpoints", choices=sorted(CHECKPOINTS), default="qwen2.5")
    parser.add_argument("--max-file-bytes", type=int, default=MAX_FILE_BYTES, help="the largest safetensors file")
    args = parse_args(parser, SMOKE)
    workdir = Path(tempfile.mkdtemp(prefix="fleetgen-identity-", dir=args.workdir))
    results = {}
    try:
        for name, real in CHECKPOINTS[args.checkpoints]:
            started = time.perf_counter()
            tensor_bytes = write_checkpoint(workdir / name, name, real_bytes=real, max_file_bytes=args.max_file_bytes)
            written = time.perf_counter() - started
            header_s, header = measure(workdir / name, "header", args.repeat)
            full_s, full = measure(workdir / name, "full", args.repeat)
            assert header["parts"]["weights"] == full["parts"]["weights"]
            rate = header["weight_bytes"] / full_s / 2**30
            results[name] = (header_s, full_s, rate, header["weight_bytes"])
            print(f"{name}: {header['weight_files']} file(s), {header['weight_bytes']:,} bytes "
                  f"({tensor_bytes:,} tensor bytes, {'random data, warm cache' if real else 'sparse'}; "
                  f"written in {written:.1f} s): header+samples {header_s:.3f} s, full {full_s:.2f} s "
                  f"({rate:.2f} GiB/s); full/header {full_s / header_s:.0f}x", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    header_s, full_s, rate, total = results[CHECKPOINTS[args.checkpoints][-1][0]]
    print(f"at {rate:.2f} GiB/s a 54 GB checkpoint takes {54e9 / rate / 2**30:.0f} s to hash in full "
          f"(plus its cold read from disk); header+samples stays {header_s:.2f} s")
    print(f"model_identity header_seconds={header_s:.3f} full_seconds={full_s:.2f} full_gib_per_s={rate:.2f} "
          f"bytes={total}")


if __name__ == "__main__":
    main()
