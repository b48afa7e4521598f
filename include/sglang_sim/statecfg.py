"""Recurrent-state families the simulated server sizes beyond GatedDeltaNet, Nemotron-H and Falcon-H1
(``modelcfg.py`` keeps those): Granite 4.0-H, LFM2 (dense, MoE and VL), Kimi-Linear, Jet-Nemotron, Mamba-1,
Falcon-Mamba, Mamba-2, Zaya, Bailing 2.5/3, MiniCPM-SALA and GigaChat 3.5.

For each architecture, what its SGLang 0.5.23 config class (``configs/<family>.py``) hands to the state shapes of
``configs/mamba_utils.py``, read off config.json as that class does, and which layers keep a KV cache. The shapes
are this module's own restatement of ``Mamba2StateShape.create``, ``create_full_rank`` and
``KimiLinearStateShape.create``.
"""

from __future__ import annotations

from dataclasses import dataclass

from sglang_sim.errors import SimModelConfigError

CONV_BYTES = 2  # SGLANG_MAMBA_CONV_DTYPE's default, bfloat16


@dataclass(frozen=True)
class RecurrentState:
    """One layer's state, by how SGLang lays it out.

    ``mamba2``: conv over ``inner + 2 * groups * state`` channels (groups widened to tp when they do not divide),
    temporal heads x head_dim x state. ``full_rank`` (Mamba-1): conv over ``inner``, temporal ``inner`` x state.
    ``kda``: conv over q, k and v (3 x ``inner``), temporal heads x head_dim x head_dim. ``cca`` (Zaya): conv over
    ``inner`` plus ``whole`` channels every rank keeps unsharded (window 1), no temporal state.
    """

    kind: str
    inner: int
    kernel: int
    ssm_dtype: str = "float32"
    groups: int = 0
    heads: int = 0
    head_dim: int = 0
    state: int = 0
    whole: int = 0

    def conv_bytes(self, tp: int, conv_dtype_bytes: int = CONV_BYTES) -> int:
        window = self.kernel - 1
        if self.kind == "mamba2":
            groups = self.groups if self.groups % tp == 0 else tp
            return (self.inner + 2 * groups * self.state) // tp * window * conv_dtype_bytes
        if self.kind == "full_rank":
            return self.inner // tp * window * conv_dtype_bytes
        if self.kind == "kda":
            return window * 3 * (self.inner // tp) * conv_dtype_bytes
        return (self.inner // tp * window + self.whole) * conv_dtype_bytes

    def ssm_bytes(self, tp: int, ssm_dtype_bytes: int) -> int:
        if self.kind == "mamba2":
            return self.heads // tp * self.head_dim * self.state * ssm_dtype_bytes
        if self.kind == "full_rank":
            return self.inner // tp * self.state * ssm_dtype_bytes
        if self.kind == "kda":
            return self.heads // tp * self.head_dim * self.head_dim * ssm_dtype_bytes
        return 0

    # ---- projection widths, for the speed and activation estimates only ----
    @property
    def num_key_heads(self) -> int:
        return max(1, self.groups or self.heads)

    @property
    def num_value_heads(self) -> int:
        return max(1, self.heads)

    @property
    def key_head_dim(self) -> int:
        return self.state or self.head_dim or 1

    @property
    def value_head_dim(self) -> int:
        return self.head_dim or max(1, self.inner // max(1, self.heads))

    @property
    def conv_kernel(self) -> int:
        return self.kernel

    def conv_dim(self, tp: int) -> int:
        return self.inner // tp


def _count(values, names) -> int:
    return sum(1 for value in values if str(value) in names)


def _layer_types(text: dict, layers: int, path: str | None, default=None) -> list:
    types = text.get("layer_types") or default
    if not isinstance(types, list) or len(types) != layers:
        raise SimModelConfigError(f"layer_types must list one type per layer ({layers})", path=path)
    return types


def _ssm(text: dict, reads_config: bool) -> str:
    # mamba2_state_dtype(self) reads the config's mamba_ssm_dtype; the default factory does not
    return str(text.get("mamba_ssm_dtype") or "float32") if reads_config else "float32"


def read_state(architecture: str, text: dict, *, path: str | None = None
               ) -> tuple[RecurrentState, int, int] | None:
    """(state per layer, layers keeping KV, layers keeping state) for the families above; None for any other
    architecture, or when the config has no state layer (SGLang then sizes it as a plain model)."""
    layers = int(text["num_hidden_layers"])
    hidden = int(text.get("hidden_size") or 0)
    if architecture == "GraniteMoeHybridForCausalLM":
        types = _layer_types(text, layers, path, ["attention" if (i + 1) % 6 == 0 else "mamba" for i in range(layers)])
        state = RecurrentState("mamba2", int(text.get("mamba_expand", 2)) * hidden, int(text.get("mamba_d_conv", 4)),
                               groups=int(text.get("mamba_n_groups", 1)), heads=int(text.get("mamba_n_heads", 64)),
                               head_dim=int(text.get("mamba_d_head", 64)), state=int(text.get("mamba_d_state", 128)))
        found = state, _count(types, {"attention", "full_attention"}), _count(types, {"mamba", "linear_attention"})
    elif architecture in ("Lfm2ForCausalLM", "Lfm2MoeForCausalLM", "Lfm2VlForConditionalGeneration"):
        types = _layer_types(text, layers, path)
        state = RecurrentState("mamba2", hidden, int(text["conv_L_cache"]), groups=1, head_dim=hidden,
                               ssm_dtype=_ssm(text, architecture == "Lfm2ForCausalLM"))
        found = state, _count(types, {"full_attention"}), _count(types, {"conv", "short_conv"})
    elif architecture == "KimiLinearForCausalLM":
        linear = text.get("linear_attn_config") or {}
        kda = {int(i) for i in linear.get("kda_layers") or []}
        heads, head_dim = int(linear["num_heads"]), int(linear["head_dim"])
        state = RecurrentState("kda", heads * head_dim, int(linear["short_conv_kernel_size"]), heads=heads,
                               head_dim=head_dim)
        state_layers = sum(1 for i in range(1, layers + 1) if i in kda)
        found = state, layers - state_layers, state_layers
    elif architecture in ("JetNemotronForCausalLM", "JetVLMForConditionalGeneration"):
        jet = (text.get("efficient_attention_config") or {}).get("jet") or {}
        heads, key_dim = int(jet["num_heads"]), int(jet["head_dim"])
        value_dim = int(key_dim * float(jet["expand_v"]))
        types = _layer_types(text, layers, path)
        state = RecurrentState("mamba2", heads * value_dim, int(jet["conv_size"]), ssm_dtype=_ssm(text, True),
                               groups=heads, heads=heads, head_dim=value_dim, state=key_dim)
        found = state, _count(types, {"attn", "swa"}), _count(types, {"jet"})
    elif architecture in ("MambaForCausalLM", "FalconMambaForCausalLM"):
        # the transformers class derives expand x hidden_size unless the file names intermediate_size itself
        inner = text.get("intermediate_size") or int(float(text.get("expand", 2)) * hidden)
        state = RecurrentState("full_rank", int(inner), int(text.get("conv_kernel", 4)), state=int(text.get("state_size", 16)))
        found = state, 0, layers
    elif architecture == "Mamba2ForCausalLM":
        if text.get("intermediate_size") is None:
            raise SimModelConfigError("AttributeError: 'Mamba2Config' object has no attribute 'intermediate_size'",
                                      path=path)
        state = RecurrentState("mamba2", int(text["intermediate_size"]), int(text.get("conv_kernel", 4)),
                               groups=int(text.get("n_groups", 8)), heads=int(text.get("num_heads", 128)),
                               head_dim=int(text.get("head_dim", 64)), state=int(text.get("state_size", 128)))
        found = state, 0, layers
    elif architecture == "ZayaForCausalLM":
        kinds = text.get("zaya_layers")
        cca = _count(kinds, {"a"}) if kinds else (layers + 1) // 2
        heads, kv_heads = int(text.get("num_attention_heads", 8)), int(text.get("num_key_value_heads", 2))
        window = int(text.get("cca_time0", 2)) + int(text.get("cca_time1", 2)) - 2
        state = RecurrentState("cca", (heads + kv_heads) * int(text.get("head_dim", 128)), window + 1,
                               ssm_dtype=_ssm(text, True), whole=hidden or 2048)
        found = state, cca, cca
    elif architecture.startswith("BailingMoeV"):
        heads = int(text.get("num_attention_heads", 16))
        head_dim = int(text.get("head_dim") or (hidden or 2048) // heads)
        group = text.get("layer_group_size", 1)
        full = sum(1 for i in range(layers) if (i + 1) % group == 0) if isinstance(group, int) else \
            sum(1 for g in group if g != 1)
        if text.get("short_conv_kernel_size") is not None:
            state = RecurrentState("kda", heads * head_dim, int(text["short_conv_kernel_size"]), heads=heads,
                                   head_dim=head_dim)
        else:  # lightning attention: no conv window, one heads x head_dim x head_dim state
            state = RecurrentState("mamba2", 0, 1, heads=heads, head_dim=head_dim, state=head_dim)
        found = state, full, layers - full
    else:
        return None
    return found if found[2] else None
