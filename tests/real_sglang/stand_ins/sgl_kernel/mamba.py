"""``sgl_kernel.mamba`` in plain torch: the ops SGLang 0.5.23 imports from it on CPU, with no fallback.

``sglang/srt/layers/attention/linear/gdn_backend.py`` imports ``causal_conv1d_fn_cpu`` and
``causal_conv1d_update_cpu``; ``sglang/srt/layers/attention/linear/kernels/gdn_triton.py`` imports
``chunk_gated_delta_rule_cpu``. The signatures are those call sites'.

The short causal convolution of the Gated DeltaNet layers, per channel ``c`` with kernel width ``W``::

    out[c, t] = act(bias[c] + sum_w weight[c, w] * x[c, t - W + 1 + w])

where the ``W - 1`` inputs before a sequence's first token come from its conv state (zeros for a new
sequence), ``act`` is SiLU or nothing, and afterwards the conv state holds the last inputs seen. The conv
state pool is ``[num_slots, dim, state_len]`` (``state_len >= W - 1``, oldest input first), read and
written in place at the given slot indices; a negative index (a padded row) is neither read nor written.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sgl_kernel._gdn_ops import chunk_gated_delta_rule


def _uses_silu(activation) -> bool:
    if activation in (None, False):
        return False
    if activation in ("silu", "swish", True):
        return True
    raise ValueError(f"unsupported causal_conv1d activation {activation!r}")


def _convolve(prefix: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
              silu: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``prefix`` ``[..., dim, state_len]`` (float32) before ``x`` ``[..., dim, L]``: the float32 output
    ``[..., dim, L]`` and the window ``[..., dim, state_len + L]`` whose tail is the next conv state."""
    width = weight.shape[-1]
    window = torch.cat([prefix, x.float()], dim=-1)
    taps = window[..., prefix.shape[-1] - (width - 1):].unfold(-1, width, 1)  # [..., dim, L, W]
    out = (taps * weight.float()[:, None, :]).sum(dim=-1)
    if bias is not None:
        out = out + bias.float()[:, None]
    return (F.silu(out) if silu else out), window


def causal_conv1d_fn_cpu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                         activation=None, conv_states: torch.Tensor, has_initial_state: torch.Tensor,
                         cache_indices: torch.Tensor, query_start_loc: torch.Tensor, seq_lens_cpu=None,
                         block_table: torch.Tensor | None = None) -> torch.Tensor:
    """Prefill (``GDNAttnBackend._convolve_prefill``): ``x`` ``[dim, T]`` holds the sequences packed by
    ``query_start_loc``; sequence ``i`` starts from ``conv_states[cache_indices[i]]`` if
    ``has_initial_state[i]`` (else zeros) and leaves its last inputs there. Returns ``[dim, T]`` in ``x``'s
    dtype."""
    if block_table is not None:
        raise NotImplementedError("causal_conv1d_fn_cpu stand-in: a paged conv state (block_table) is not supported")
    silu = _uses_silu(activation)
    state_len = conv_states.shape[-1]
    out = torch.zeros(x.shape, dtype=torch.float32)
    bounds = [int(v) for v in query_start_loc.tolist()]
    for i, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        if end == start:
            continue
        slot = int(cache_indices[i])
        if slot >= 0 and bool(has_initial_state[i]):
            prefix = conv_states[slot].float()
        else:
            prefix = torch.zeros(x.shape[0], state_len)
        out[:, start:end], window = _convolve(prefix, x[:, start:end], weight, bias, silu)
        if slot >= 0:
            conv_states[slot] = window[:, -state_len:].to(conv_states.dtype)
    return out.to(x.dtype)


def causal_conv1d_update_cpu(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor,
                             bias: torch.Tensor | None = None, activation=None, conv_state_indices=None,
                             intermediate_conv_window=None, intermediate_state_indices=None, **unused_tree_args):
    """Decode (``GDNAttnBackend.forward_decode``): ``x`` ``[B, dim]`` (one token per row) or
    ``[B, dim, L]``; row ``b`` continues from ``conv_state[conv_state_indices[b]]`` (row ``b`` without
    indices) and shifts its inputs in. Returns ``x``'s shape and dtype."""
    if intermediate_conv_window is not None:
        raise NotImplementedError("causal_conv1d_update_cpu stand-in: speculative verify windows are not supported")
    single = x.dim() == 2
    xs = x.unsqueeze(-1) if single else x
    batch, state_len = xs.shape[0], conv_state.shape[-1]
    slots = (torch.arange(batch) if conv_state_indices is None else conv_state_indices.to(torch.long))
    live = slots >= 0
    prefix = torch.zeros(batch, xs.shape[1], state_len)
    prefix[live] = conv_state[slots[live]].float()
    out, window = _convolve(prefix, xs, weight, bias, _uses_silu(activation))
    out[~live] = 0.0
    conv_state[slots[live]] = window[live][..., -state_len:].to(conv_state.dtype)
    out = out.to(x.dtype)
    return out.squeeze(-1) if single else out


def chunk_gated_delta_rule_cpu(q, k, v, g, beta, initial_state, cu_seqlens, head_first=False,
                               use_qk_l2norm_in_kernel=False, initial_state_indices=None):
    """Prefill gated delta rule (``TritonGDNKernel.extend``): see ``sgl_kernel._gdn_ops.chunk_gated_delta_rule``.
    Returns ``(o, final states, None)``; the ``None`` stands for the per-chunk states, which SGLang only
    asks for when it snapshots Mamba state mid-prefill (not with ``no_buffer``)."""
    if head_first:
        raise NotImplementedError("chunk_gated_delta_rule_cpu stand-in: head_first=True is not supported")
    out, final = chunk_gated_delta_rule(q, k, v, g, beta, initial_state, cu_seqlens, use_qk_l2norm_in_kernel,
                                        initial_state_indices)
    return out, final, None
