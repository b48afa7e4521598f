"""Checks of the torch stand-ins for the Gated DeltaNet ops against naive step-by-step references.

Run with the SGLang venv's interpreter and the stand-ins on the path (tests/real_sglang/test_hybrid_server.py
does)::

    PYTHONPATH=tests/real_sglang/stand_ins .sglang-venv/bin/python tests/real_sglang/stand_in_checks.py

prints one JSON object, ``{check name: null or the failure}``. The references below loop over tokens, heads
and channels one scalar formula at a time, in the ``[K, V]`` state form, so they share no code and no layout
trick with the ops (``sgl_kernel/mamba.py``, ``sgl_kernel/_gdn_ops.py``) they check. Each op is called as
SGLang 0.5.23 calls it (keywords, shapes, a state pool indexed by slot).
"""

from __future__ import annotations

import json
import math
import sys
import traceback

import torch

HK, HV, DK, DV = 2, 4, 8, 6  # q/k heads, value heads (two per q/k head), head dims
SLOTS = 7
ATOL = 2e-5


def _softplus(x: float) -> float:
    return x if x > 20.0 else math.log1p(math.exp(x))


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def _l2n(x: torch.Tensor) -> torch.Tensor:
    return x / math.sqrt(float((x * x).sum()) + 1e-6)


def naive_delta_rule(q, k, v, g, beta, state_vk):
    """One sequence: q, k ``[T, HK, DK]``, v ``[T, HV, DV]``, g, beta ``[T, HV]``, state ``[HV, DV, DK]``
    (the pool's layout). Returns o ``[T, HV, DV]`` and the final state in the pool's layout."""
    T = v.shape[0]
    group = HV // HK
    S = [state_vk[h].double().T.clone() for h in range(HV)]  # [DK, DV] per head
    o = torch.zeros(T, HV, DV, dtype=torch.float64)
    for t in range(T):
        for h in range(HV):
            qt = _l2n(q[t, h // group].double()) * DK ** -0.5
            kt = _l2n(k[t, h // group].double())
            S[h] = S[h] * math.exp(float(g[t, h]))
            recalled = torch.zeros(DV, dtype=torch.float64)
            for i in range(DK):
                recalled += kt[i] * S[h][i]
            u = float(beta[t, h]) * (v[t, h].double() - recalled)
            for i in range(DK):
                S[h][i] += kt[i] * u
            for j in range(DV):
                o[t, h, j] = sum(float(qt[i]) * float(S[h][i, j]) for i in range(DK))
    return o, torch.stack([s.T for s in S])


def naive_conv(prefix, x, weight, bias, silu):
    """prefix ``[dim, W-1]`` (the inputs before x), x ``[dim, L]``: output ``[dim, L]``, one sum at a time."""
    dim, width = weight.shape
    window = torch.cat([prefix, x], dim=1).double()
    out = torch.zeros(dim, x.shape[1], dtype=torch.float64)
    for c in range(dim):
        for t in range(x.shape[1]):
            acc = float(bias[c]) if bias is not None else 0.0
            for w in range(width):
                acc += float(weight[c, w]) * float(window[c, t + w])
            out[c, t] = acc * _sigmoid(acc) if silu else acc
    return out


def _close(name, actual, expected, atol=ATOL):
    actual, expected = actual.double(), expected.double()
    if actual.shape != expected.shape:
        raise AssertionError(f"{name}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}")
    err = float((actual - expected).abs().max()) if actual.numel() else 0.0
    if not err <= atol:
        raise AssertionError(f"{name}: max abs error {err:.3g} > {atol}")


def _gdn_inputs(T, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, T, HK, DK, generator=gen)
    k = torch.randn(1, T, HK, DK, generator=gen)
    v = torch.randn(1, T, HV, DV, generator=gen)
    a = torch.randn(T, HV, generator=gen)
    b = torch.randn(T, HV, generator=gen)
    A_log = torch.rand(HV, generator=gen)
    dt_bias = torch.rand(HV, generator=gen)
    pool = torch.randn(SLOTS, HV, DV, DK, generator=gen)
    return q, k, v, a, b, A_log, dt_bias, pool


def _naive_gates(A_log, a, b, dt_bias):
    g = torch.tensor([[-math.exp(float(A_log[h])) * _softplus(float(a[t, h]) + float(dt_bias[h]))
                       for h in range(HV)] for t in range(a.shape[0])], dtype=torch.float64)
    beta = torch.tensor([[_sigmoid(float(b[t, h])) for h in range(HV)] for t in range(b.shape[0])],
                        dtype=torch.float64)
    return g, beta


def check_fused_gdn_gating():
    _, _, _, a, b, A_log, dt_bias, _ = _gdn_inputs(5, seed=1)
    a[0, 0] = 30.0  # past softplus's threshold: softplus(x) = x there
    g, beta = torch.ops.sgl_kernel.fused_gdn_gating_cpu(A_log, a, b, dt_bias)
    g_ref, beta_ref = _naive_gates(A_log, a, b, dt_bias)
    _close("g", g, g_ref.unsqueeze(0), atol=1e-4)
    _close("beta", beta, beta_ref.unsqueeze(0))
    assert g.dtype == beta.dtype == torch.float32, (g.dtype, beta.dtype)


def check_chunk_gated_delta_rule():
    from sgl_kernel.mamba import chunk_gated_delta_rule_cpu

    lengths, slots = [70, 1, 9], [5, 0, 2]  # 70 > one 64-token chunk
    T = sum(lengths)
    q, k, v, a, b, A_log, dt_bias, pool = _gdn_inputs(T, seed=2)
    g, beta = torch.ops.sgl_kernel.fused_gdn_gating_cpu(A_log, a, b, dt_bias)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    before = pool.clone()
    out, final, per_chunk = chunk_gated_delta_rule_cpu(
        q=q, k=k, v=v, g=g, beta=beta, initial_state=pool, cu_seqlens=cu, head_first=False,
        use_qk_l2norm_in_kernel=True, initial_state_indices=torch.tensor(slots, dtype=torch.int32))
    assert per_chunk is None
    for i, (start, end) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        o_ref, s_ref = naive_delta_rule(q[0, start:end], k[0, start:end], v[0, start:end],
                                        g[0, start:end], beta[0, start:end], before[slots[i]])
        _close(f"o of sequence {i}", out[0, start:end], o_ref)
        _close(f"state in slot {slots[i]}", pool[slots[i]], s_ref)
        _close(f"returned state {i}", final[i], s_ref)
    untouched = [s for s in range(SLOTS) if s not in slots]
    _close("slots not named", pool[untouched], before[untouched], atol=0.0)


def check_fused_sigmoid_gating_delta_rule_update():
    q, k, v, a, b, A_log, dt_bias, pool = _gdn_inputs(3, seed=3)
    slots = torch.tensor([4, -1, 1], dtype=torch.int32)  # -1: a padded row, zero state, not written
    before = pool.clone()
    out = torch.ops.sgl_kernel.fused_sigmoid_gating_delta_rule_update_cpu(
        A_log=A_log, dt_bias=dt_bias, q=q, k=k, v=v, a=a, b=b, initial_state_source=pool,
        initial_state_indices=slots, cu_seqlens=torch.arange(4, dtype=torch.int32), use_qk_l2norm_in_kernel=True,
        softplus_beta=1.0, softplus_threshold=20.0)
    assert out.shape == (1, 3, HV, DV), out.shape
    g, beta = _naive_gates(A_log, a, b, dt_bias)
    for row, slot in enumerate(slots.tolist()):
        start = before[slot] if slot >= 0 else torch.zeros(HV, DV, DK)
        o_ref, s_ref = naive_delta_rule(q[0, row:row + 1], k[0, row:row + 1], v[0, row:row + 1],
                                        g[row:row + 1], beta[row:row + 1], start)
        _close(f"o of row {row}", out[0, row:row + 1], o_ref)
        if slot >= 0:
            _close(f"state in slot {slot}", pool[slot], s_ref)
    untouched = [0, 2, 3, 5, 6]
    _close("slots not named", pool[untouched], before[untouched], atol=0.0)


def check_prefill_then_decode():
    """Prefill (chunk) of T tokens then one decode step equals the recurrence over T + 1 tokens."""
    from sgl_kernel.mamba import chunk_gated_delta_rule_cpu

    q, k, v, a, b, A_log, dt_bias, pool = _gdn_inputs(12, seed=4)
    pool[3] = 0.0  # a new sequence's slot
    g, beta = torch.ops.sgl_kernel.fused_gdn_gating_cpu(A_log, a[:11], b[:11], dt_bias)
    slot = torch.tensor([3], dtype=torch.int32)
    chunk_gated_delta_rule_cpu(q=q[:, :11], k=k[:, :11], v=v[:, :11], g=g, beta=beta, initial_state=pool,
                               cu_seqlens=torch.tensor([0, 11], dtype=torch.int32), head_first=False,
                               use_qk_l2norm_in_kernel=True, initial_state_indices=slot)
    out = torch.ops.sgl_kernel.fused_sigmoid_gating_delta_rule_update_cpu(
        A_log=A_log, dt_bias=dt_bias, q=q[:, 11:], k=k[:, 11:], v=v[:, 11:], a=a[11:], b=b[11:],
        initial_state_source=pool, initial_state_indices=slot, cu_seqlens=torch.tensor([0, 1], dtype=torch.int32),
        use_qk_l2norm_in_kernel=True)
    g_all, beta_all = _naive_gates(A_log, a, b, dt_bias)
    o_ref, s_ref = naive_delta_rule(q[0], k[0], v[0], g_all, beta_all, torch.zeros(HV, DV, DK))
    _close("decode output", out[0], o_ref[11:])
    _close("state after decode", pool[3], s_ref)


def _conv_inputs(dim, T, width, seed):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(dim, T, generator=gen), torch.randn(dim, width, generator=gen),
            torch.randn(dim, generator=gen), torch.randn(SLOTS, dim, width - 1, generator=gen))


def check_causal_conv1d_fn():
    from sgl_kernel.mamba import causal_conv1d_fn_cpu

    dim, width, lengths = 5, 4, [6, 2, 3]  # 2 < width - 1: the new state keeps one old input
    x, weight, bias, pool = _conv_inputs(dim, sum(lengths), width, seed=5)
    slots, has_initial = [2, 6, 0], [True, True, False]
    cu = [0, 6, 8, 11]
    before = pool.clone()
    out = causal_conv1d_fn_cpu(x, weight, bias, activation="silu", conv_states=pool,
                               has_initial_state=torch.tensor(has_initial),
                               cache_indices=torch.tensor(slots, dtype=torch.int32),
                               query_start_loc=torch.tensor(cu, dtype=torch.int32), seq_lens_cpu=lengths)
    for i, slot in enumerate(slots):
        xs = x[:, cu[i]:cu[i + 1]]
        prefix = before[slot] if has_initial[i] else torch.zeros(dim, width - 1)
        _close(f"output of sequence {i}", out[:, cu[i]:cu[i + 1]], naive_conv(prefix, xs, weight, bias, True))
        _close(f"conv state in slot {slot}", pool[slot], torch.cat([prefix, xs], dim=1)[:, -(width - 1):])


def check_causal_conv1d_update():
    from sgl_kernel.mamba import causal_conv1d_fn_cpu, causal_conv1d_update_cpu

    dim, width = 5, 4
    x, weight, bias, pool = _conv_inputs(dim, 8, width, seed=6)
    before = pool.clone()
    step = x[:, :3].T.contiguous()  # three rows, one token each: [B, dim]
    slots = torch.tensor([1, -1, 4], dtype=torch.int32)
    out = causal_conv1d_update_cpu(step, pool, weight, bias, "silu", conv_state_indices=slots)
    assert out.shape == step.shape, out.shape
    for row, slot in ((0, 1), (2, 4)):
        ref = naive_conv(before[slot], step[row][:, None], weight, bias, True)[:, 0]
        _close(f"output of row {row}", out[row], ref)
        _close(f"conv state in slot {slot}", pool[slot], torch.cat([before[slot][:, 1:], step[row][:, None]], dim=1))
    _close("padded row", out[1], torch.zeros(dim), atol=0.0)
    _close("slots not named", pool[[0, 2, 3, 5, 6]], before[[0, 2, 3, 5, 6]], atol=0.0)
    # A prefill of seven tokens then one decode step equals the convolution of all eight.
    pool[3] = 0.0
    causal_conv1d_fn_cpu(x[:, :7], weight, bias, activation="silu", conv_states=pool,
                         has_initial_state=torch.tensor([False]), cache_indices=torch.tensor([3], dtype=torch.int32),
                         query_start_loc=torch.tensor([0, 7], dtype=torch.int32), seq_lens_cpu=[7])
    last = causal_conv1d_update_cpu(x[:, 7:].T.contiguous(), pool, weight, bias, "silu",
                                    conv_state_indices=torch.tensor([3], dtype=torch.int32))
    full = naive_conv(torch.zeros(dim, width - 1), x, weight, bias, True)
    _close("decode after prefill", last[0], full[:, 7])


CHECKS = {name[len("check_"):]: fn for name, fn in sorted(globals().items()) if name.startswith("check_")}


def main(argv: list[str]) -> int:
    import sgl_kernel  # noqa: F401  registers torch.ops.sgl_kernel.*

    torch.set_default_dtype(torch.float32)
    results = {}
    for name in argv or CHECKS:
        try:
            with torch.inference_mode():  # as SGLang runs the model
                CHECKS[name]()
            results[name] = None
        except Exception:  # noqa: BLE001  reported per check
            results[name] = traceback.format_exc(limit=3)
    print(json.dumps(results))
    return 0 if all(result is None for result in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
