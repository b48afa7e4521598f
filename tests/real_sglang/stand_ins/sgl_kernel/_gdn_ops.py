"""Gated DeltaNet ops in plain torch, registered as ``torch.ops.sgl_kernel.*`` for SGLang's CPU path.

SGLang 0.5.23 looks these up once, at import time, with no AMX check and no fallback:
``torch.ops.sgl_kernel.fused_gdn_gating_cpu`` (``sglang/srt/layers/attention/linear/gdn_backend.py``) and
``torch.ops.sgl_kernel.fused_sigmoid_gating_delta_rule_update_cpu``
(``sglang/srt/layers/attention/linear/kernels/gdn_triton.py``). ``chunk_gated_delta_rule`` is the prefill
kernel behind ``sgl_kernel.mamba.chunk_gated_delta_rule_cpu``.

The math is the gated delta rule of Qwen3-Next, per value head, with the recurrent state ``S`` stored as
SGLang's pool stores it, ``[num_slots, HV, V, K]`` (``S^T`` of the usual ``[K, V]`` form)::

    S_t = exp(g_t) * S_{t-1}
    u_t = beta_t * (v_t - S_t k_t)          # S_t k_t: what the state recalls for k_t
    S_t = S_t + u_t k_t^T
    o_t = S_t q_t                           # q, k l2-normalised, q scaled by K ** -0.5

Query/key heads are shared by ``HV // HK`` consecutive value heads. Everything is computed in float32 and
written back in the caller's dtypes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_L2NORM_EPS = 1e-6  # the FLA kernels' eps: x / sqrt(sum(x^2) + eps)


def l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + _L2NORM_EPS)


def gdn_gating(A_log: torch.Tensor, a: torch.Tensor, b: torch.Tensor, dt_bias: torch.Tensor,
               softplus_beta: float = 1.0, softplus_threshold: float = 20.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``g = -exp(A_log) * softplus(a + dt_bias)`` (log decay) and ``beta = sigmoid(b)``, float32, shaped like ``a``."""
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias.float(), beta=softplus_beta,
                                          threshold=softplus_threshold)
    return g, b.float().sigmoid()


def _expand_heads(x: torch.Tensor, num_v_heads: int) -> torch.Tensor:
    """``[..., HK, D]`` to ``[..., HV, D]``: each q/k head serves ``HV // HK`` consecutive value heads."""
    return x.repeat_interleave(num_v_heads // x.shape[-2], dim=-2)


def _prepare_qk(q: torch.Tensor, k: torch.Tensor, num_v_heads: int, use_qk_l2norm: bool):
    q, k = q.float(), k.float()
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    q = q * q.shape[-1] ** -0.5
    return _expand_heads(q, num_v_heads), _expand_heads(k, num_v_heads)


def recurrent_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                               beta: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence, token by token. ``q``, ``k``: ``[T, HV, K]`` (prepared: normalised, scaled, expanded);
    ``v``: ``[T, HV, V]``; ``g``, ``beta``: ``[T, HV]``; ``state``: ``[HV, V, K]``. Returns float32
    ``(o [T, HV, V], final state [HV, V, K])``."""
    state = state.float().clone()
    out = torch.empty(v.shape, dtype=torch.float32)
    for t in range(v.shape[0]):
        state = state * g[t].exp()[:, None, None]
        recalled = torch.einsum("hvk,hk->hv", state, k[t])
        u = beta[t][:, None] * (v[t].float() - recalled)
        state = state + u[:, :, None] * k[t][:, None, :]
        out[t] = torch.einsum("hvk,hk->hv", state, q[t])
    return out, state


def chunked_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                             beta: torch.Tensor, state: torch.Tensor,
                             chunk_size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """The same result as ``recurrent_gated_delta_rule``, a chunk at a time as the prefill kernels do it.

    Within a chunk, with the state ``S0`` it starts from in ``[K, V]`` form, cumulative log decay ``G`` and
    ``D_ij = exp(G_i - G_j)`` for ``j <= i``, the updates ``U`` (rows ``u_t``) solve
    ``(I + L) U = beta*V - beta*exp(G)*(K S0)`` with ``L_ij = beta_i (k_i . k_j) D_ij`` for ``j < i``; then
    ``O = exp(G)*(Q S0) + (Q K^T * D) U`` and ``S = exp(G_last) S0 + (exp(G_last - G)*K)^T U``.
    """
    state = state.float().clone().transpose(-1, -2)  # [HV, K, V] for the matrix form
    # heads first: [HV, T, D]
    q, k, v = (x.transpose(0, 1).float() for x in (q, k, v))
    g, beta = g.transpose(0, 1).float(), beta.transpose(0, 1).float()
    out = torch.empty_like(v)
    for start in range(0, v.shape[1], chunk_size):
        end = min(start + chunk_size, v.shape[1])
        qc, kc, vc, bc = q[:, start:end], k[:, start:end], v[:, start:end], beta[:, start:end]
        G = g[:, start:end].cumsum(dim=-1)
        n = end - start
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        # mask before exp: G_i - G_j for j > i is positive and can overflow
        decay = (G[:, :, None] - G[:, None, :]).masked_fill(~causal, float("-inf")).exp()
        lower = (bc[:, :, None] * (kc @ kc.transpose(-1, -2)) * decay).tril(diagonal=-1)
        lhs = lower + torch.eye(n)
        rhs = bc[..., None] * vc - (bc * G.exp())[..., None] * (kc @ state)
        u = torch.linalg.solve_triangular(lhs, rhs, upper=False, unitriangular=True)
        out[:, start:end] = (G.exp()[..., None] * (qc @ state)
                             + ((qc @ kc.transpose(-1, -2)) * decay) @ u)
        last = G[:, -1:]
        state = (last.exp()[..., None] * state
                 + ((last - G).exp()[..., None] * kc).transpose(-1, -2) @ u)
    return out.transpose(0, 1), state.transpose(-1, -2)


def _spans(cu_seqlens: torch.Tensor):
    bounds = [int(x) for x in cu_seqlens.tolist()]
    return list(zip(bounds[:-1], bounds[1:]))


def chunk_gated_delta_rule(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor,
                           beta: torch.Tensor, initial_state: torch.Tensor, cu_seqlens: torch.Tensor,
                           use_qk_l2norm_in_kernel: bool,
                           initial_state_indices: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill (extend): ``query``/``key`` ``[1, T, HK, K]``, ``value`` ``[1, T, HV, V]``, ``g``/``beta``
    ``[1, T, HV]``, sequences packed along ``T`` by ``cu_seqlens``. Sequence ``i`` starts from
    ``initial_state[initial_state_indices[i]]`` (index ``i`` without indices; a negative index: a zero state,
    not written back) and its final state is written back there in place.
    Returns ``(o [1, T, HV, V] in value's dtype, final states [N, HV, V, K] float32)``."""
    num_v_heads = value.shape[2]
    q, k = _prepare_qk(query[0], key[0], num_v_heads, use_qk_l2norm_in_kernel)
    spans = _spans(cu_seqlens)
    out = torch.empty(value.shape[1:], dtype=torch.float32)
    finals = torch.empty((len(spans), *initial_state.shape[1:]), dtype=torch.float32)
    for i, (start, end) in enumerate(spans):
        slot = i if initial_state_indices is None else int(initial_state_indices[i])
        state = initial_state[slot] if slot >= 0 else initial_state.new_zeros(initial_state.shape[1:])
        out[start:end], finals[i] = chunked_gated_delta_rule(
            q[start:end], k[start:end], value[0, start:end], g[0, start:end], beta[0, start:end], state)
        if slot >= 0:
            initial_state[slot] = finals[i].to(initial_state.dtype)
    return out.unsqueeze(0).to(value.dtype), finals


@torch.library.custom_op("sgl_kernel::fused_gdn_gating_cpu", mutates_args=())
def fused_gdn_gating_cpu(A_log: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                         dt_bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill gates for ``chunk_gated_delta_rule`` (``GDNAttnBackend._prefill_gates`` in
    ``sglang/srt/layers/attention/linear/gdn_backend.py``): ``a``, ``b`` ``[T, HV]`` to float32
    ``g = -exp(A_log) * softplus(a + dt_bias)`` and ``beta = sigmoid(b)``, each ``[1, T, HV]``."""
    g, beta = gdn_gating(A_log, a, b, dt_bias)
    return g.unsqueeze(0), beta.unsqueeze(0)


@torch.library.custom_op("sgl_kernel::fused_sigmoid_gating_delta_rule_update_cpu",
                         mutates_args=("initial_state_source",))
def fused_sigmoid_gating_delta_rule_update_cpu(
        A_log: torch.Tensor, dt_bias: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        a: torch.Tensor, b: torch.Tensor, initial_state_source: torch.Tensor, initial_state_indices: torch.Tensor,
        cu_seqlens: torch.Tensor, use_qk_l2norm_in_kernel: bool, softplus_beta: float = 1.0,
        softplus_threshold: float = 20.0) -> torch.Tensor:
    """Decode (``TritonGDNKernel.decode`` in ``sglang/srt/layers/attention/linear/kernels/gdn_triton.py``):
    the gates from ``a``, ``b`` ``[T, HV]`` as in ``fused_gdn_gating_cpu``, then the recurrent update
    token by token. ``q``/``k`` ``[1, T, HK, K]``, ``v`` ``[1, T, HV, V]``; sequence ``i`` (``cu_seqlens``)
    reads and writes ``initial_state_source[initial_state_indices[i]]`` in place (a negative index: a
    zero state, not written back). Returns ``o [1, T, HV, V]`` in ``q``'s dtype."""
    num_v_heads = v.shape[2]
    qq, kk = _prepare_qk(q[0], k[0], num_v_heads, use_qk_l2norm_in_kernel)
    g, beta = gdn_gating(A_log, a.reshape(-1, num_v_heads), b.reshape(-1, num_v_heads), dt_bias,
                         softplus_beta, softplus_threshold)
    out = torch.zeros(v.shape[1:], dtype=torch.float32)
    for i, (start, end) in enumerate(_spans(cu_seqlens)):
        slot = int(initial_state_indices[i])
        state = (initial_state_source[slot] if slot >= 0
                 else initial_state_source.new_zeros(initial_state_source.shape[1:]))
        out[start:end], final = recurrent_gated_delta_rule(
            qq[start:end], kk[start:end], v[0, start:end], g[start:end], beta[start:end], state)
        if slot >= 0:
            initial_state_source[slot] = final.to(initial_state_source.dtype)
    return out.unsqueeze(0).to(q.dtype)
