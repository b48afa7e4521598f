"""What CUDA-graph capture and activations take outside the static pools: the simulator's own model.

SGLang leaves ``pre_load_free * (1 - mem_fraction_static)`` unallocated after the pools, less any
draft KV pool the budget did not count (pools.py); capture fails with a CUDA OOM when what the
runtime then needs does not fit. The simulator charges:

* runtime workspaces: ``sim.runtime_workspace_mib`` (cuBLAS/attention-backend/NCCL buffers, sampler);
* the prefill graph pool (breakable graphs capture chunks up to chunked_prefill_size tokens), sized
  by the activations of that many tokens: ``tokens x act_bytes x (6 hidden + 3 ffn/tp + attn/tp)``
  (residual stream copies, gate/up/down projections, q/k/v/o or linear-attention projections),
  times 1.25 for allocator fragmentation, plus 2 MiB per captured bucket;
* the decode graph pool, shared by all captured batch sizes, sized by the largest one: activations
  of ``bs x tokens_per_request`` tokens (draft tokens when speculative decoding verifies) plus their
  fp32 logits ``bs x tokens x vocab/tp x 4``, plus 8 MiB per captured graph (target verify, draft
  and draft-extend graphs under EAGLE). Decode batch sizes are clipped to the request pool (the
  effective max_running_requests), as SGLang 0.5.23 clips them.

Seed calibration (B200 183,359 MiB, Qwen3.6-27B, chunked prefill 16384): ~5.1-5.3 GiB needed at
defaults, so the automatic ``--mem-fraction-static`` (~0.79) and 0.93 start; 0.96 (~7.2 GiB left,
~3.0 GiB after the ~4.3 GiB MTP draft KV pool) fails, and fits with ``--chunked-prefill-size 4096
--cuda-graph-max-bs-decode 64``; at 0.98 the draft KV pool itself no longer fits.
"""

from __future__ import annotations

from dataclasses import dataclass

from sglang_sim.modelcfg import ModelShape
from sglang_sim.resolve import Launch

MIB = 1 << 20
FRAGMENTATION = 1.25
DECODE_GRAPH_OVERHEAD = 8 * MIB
PREFILL_BUCKET_OVERHEAD = 2 * MIB

POSSIBLE_SOLUTIONS = (
    "Possible solutions:\n"
    "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
    "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)\n"
    "3. disable decode CUDA graph by --cuda-graph-backend-decode=disabled. "
    "(Not recommended. Huge performance loss)\n"
    "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n"
)


@dataclass(frozen=True)
class GraphMemory:
    workspace_bytes: int
    prefill_bytes: int
    decode_bytes: int
    decode_batch_sizes: tuple[int, ...]

    @property
    def total_bytes(self) -> int:
        return self.workspace_bytes + self.prefill_bytes + self.decode_bytes


def decode_capture_sizes(launch: Launch, request_pool: int) -> tuple[int, ...]:
    """Decode batch sizes captured (``cuda_graph_hook.generate_decode_cuda_graph_batch_sizes``, then
    ``base_cuda_graph_runner.get_batch_sizes_to_capture``): the explicit list, else SGLang's list up to
    the decode max_bs (finer steps under speculative decoding) with max_bs itself; then clipped to the
    request pool, which is added when the list reaches past it."""
    if launch.decode_bs:
        sizes = list(launch.decode_bs)
    else:
        top = launch.decode_max_bs
        if launch.spec_algorithm:
            sizes = [*range(1, 9), *range(10, 33, 2), *range(40, 65, 4), *range(72, 257, 8), *range(272, top + 1, 16)]
        else:
            sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, top + 1, 32)]
        sizes = [bs for bs in sizes if bs <= top]
        if top not in sizes:
            sizes.append(top)
    if max(sizes) > request_pool:
        sizes.append(request_pool)
    picked = tuple(sorted({bs for bs in sizes if 0 < bs <= request_pool}))
    return picked or (1,)


def activation_bytes_per_token(model: ModelShape, tp: int) -> int:
    ffn = model.dense_ffn_size
    if model.num_experts:
        ffn = max(ffn, model.experts_per_token * model.moe_ffn_size + model.shared_ffn_size)
    attn = model.num_heads * model.head_dim * 2 + 2 * model.num_kv_heads * model.head_dim
    if model.linear:
        lin = model.linear
        attn = max(attn, 2 * lin.num_key_heads * lin.key_head_dim + 2 * lin.num_value_heads * lin.value_head_dim)
    return model.dtype_bytes * (6 * model.hidden_size + (3 * ffn + attn) // tp)


def graph_memory(model: ModelShape, launch: Launch, request_pool: int, workspace_mib: int) -> GraphMemory:
    per_token = activation_bytes_per_token(model, launch.tp)
    prefill = 0
    if launch.prefill_graph:
        tokens = launch.chunked_prefill_size if launch.chunked_prefill_size != -1 else launch.max_prefill_tokens
        tokens = min(tokens, max(launch.prefill_bs))
        prefill = int(tokens * per_token * FRAGMENTATION) + PREFILL_BUCKET_OVERHEAD * len(launch.prefill_bs)
    sizes = decode_capture_sizes(launch, request_pool)
    decode = 0
    if launch.decode_graph:
        tokens_per_request = launch.spec_draft_tokens if launch.spec_algorithm else 1
        tokens = max(sizes) * tokens_per_request
        logits = tokens * (model.vocab_size // launch.tp) * 4
        graphs = len(sizes) * (3 if launch.spec_algorithm else 1)
        decode = int(tokens * per_token * FRAGMENTATION) + logits + DECODE_GRAPH_OVERHEAD * graphs
    return GraphMemory(workspace_mib * MIB, prefill, decode, sizes)


def capture_failure(need: GraphMemory, free_bytes: int, total_bytes: int, process_bytes: int) -> str | None:
    """SGLang's capture failure text if ``need`` does not fit in ``free_bytes``, else None."""
    if need.total_bytes <= free_bytes:
        return None
    allocated = 0
    tried = need.total_bytes
    for piece in (need.workspace_bytes, need.prefill_bytes, need.decode_bytes):
        if allocated + piece > free_bytes:
            tried = piece
            break
        allocated += piece
    gib = 1 << 30
    oom = (f"CUDA out of memory. Tried to allocate {tried / gib:.2f} GiB. GPU 0 has a total capacity of "
           f"{total_bytes / gib:.2f} GiB of which {(free_bytes - allocated) / MIB:.2f} MiB is free. "
           f"Including non-PyTorch memory, this process has {(process_bytes + allocated) / gib:.2f} GiB "
           f"memory in use. Of the allocated memory {(process_bytes + allocated) / gib:.2f} GiB is "
           f"allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated. If reserved but "
           f"unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
           f"to avoid fragmentation.  See documentation for Memory Management  "
           f"(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")
    return f"Capture cuda graph failed: {oom}\n{POSSIBLE_SOLUTIONS}"
