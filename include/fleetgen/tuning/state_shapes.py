"""Linear-attention / Mamba state per slot, for every state-cache family SGLang 0.5.23 sizes: one shape rule per
``*StateShape.create`` of ``configs/mamba_utils.py``, and one reader per SGLang config class that says which of its
config's keys feed that rule and which layers hold state (docs/sglang-memory-model.md §2.3).

Shape rules (``Architecture.state_shape``), per layer and TP rank, ``divide`` failing on a remainder:

- ``mamba2``: ``Mamba2StateShape.create``: groups not divisible by tp grow to tp; conv ``(intermediate + 2 *
  groups * state) / tp`` channels by ``kernel - 1``, temporal ``heads / tp x head_dim x state``. Shared by
  GatedDeltaNet (Qwen3-Next/3.5, Jet-Nemotron, GigaChat 3.5), Nemotron-H, Falcon-H1, Granite 4.0-H and Mamba-2;
  LFM2's short convolutions pass ``state_size 0`` (no temporal state; ``heads = tp``), the lightning attention of
  Bailing 2.5 and MiniCPM-SALA passes ``intermediate 0, groups 0, kernel 1`` (no conv state).
- ``mamba1``: ``create_full_rank`` (Mamba-1, Falcon-Mamba): conv ``intermediate / tp`` by ``kernel - 1``, temporal
  ``intermediate / tp x 1 x state``.
- ``kda``: ``KimiLinearStateShape.create`` (Kimi-Linear, Bailing 3): one conv of ``kernel - 1`` by
  ``3 x heads x head_dim / tp``, temporal ``heads / tp x head_dim x head_dim``.
- ``zaya_cca``: ``ZayaConfig.mamba2_cache_params``: conv ``(heads + kv_heads) x head_dim / tp`` by
  ``cca_time0 + cca_time1 - 2`` plus the full ``hidden_size`` by 1 on every rank, no temporal state.

Conv state is ``SGLANG_MAMBA_CONV_DTYPE`` (bfloat16); the temporal state's dtype follows profile.py.

Layer rules (``Architecture.state_layers``): ``interval`` (Qwen3-Next's ``full_attention_interval``), ``pattern``
(Nemotron-H), ``every_layer`` (Falcon-H1: attention and state in each layer), ``no_attention`` (pure Mamba: every
layer state, none keeps KV), ``layer_types`` with the names of state and attention layers, ``kda_layers``
(``linear_attn_config.kda_layers``, 1-based), ``layer_group_size`` (Bailing: every g-th layer attention),
``mixer_types`` (MiniCPM-SALA) and ``zaya_layers`` (each ``a`` layer keeps KV and a conv state).
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetgen.errors import ModelConfigError
from fleetgen.tuning.architectures import Architecture

STATE_SHAPE_RULES = ("mamba2", "mamba1", "kda", "zaya_cca")
STATE_LAYER_RULES = ("interval", "pattern", "every_layer", "no_attention", "layer_types", "kda_layers",
                     "layer_group_size", "mixer_types", "zaya_layers")
# configs/minicpm.py::_MIXER_TYPE_ALIASES
_MINICPM_MIXERS = {"minicpm4": "minicpm4", "minicpm": "minicpm4", "standard": "minicpm4", "attention": "minicpm4",
                   "attn": "minicpm4", "lightning": "lightning-attn", "lightning_attn": "lightning-attn",
                   "lightning-attn": "lightning-attn"}
# The config classes whose temporal dtype comes from mamba2_state_dtype(self) (config mamba_ssm_dtype, then the
# flag); every other class keeps the default factory, mamba2_state_dtype(None), which ignores the config.
READS_CONFIG_SSM_DTYPE = frozenset({"FalconH1Config", "GigaChat35Config", "JetNemotronConfig", "Lfm2Config",
                                    "NemotronHConfig", "NemotronHPuzzleConfig", "Qwen3NextConfig",
                                    "Qwen3_5TextConfig", "Qwen3_5MoeTextConfig", "InternS2MobiusTextConfig",
                                    "ZayaConfig"})


@dataclass(frozen=True)
class StateElements:
    """Elements of one state slot's conv and temporal tensors on one TP rank, per state layer."""

    conv: int
    temporal: int


def _check_divisible(geometry, tp: int, parts: list[tuple[str, int]], config_path: str) -> None:
    """``divide`` asserts each sharded dimension is a multiple of tp; SGLang fails to start otherwise."""
    if any(value % tp for _, value in parts):
        shapes = ", ".join(f"{what} {value}" if what != "heads" else f"{value} heads" for what, value in parts)
        raise ModelConfigError(f"{geometry.architecture}: tp {tp} does not divide the state shapes ({shapes}); "
                               "SGLang's divide() would fail", path=config_path,
                               hint="choose a tp size that divides the linear-attention head count")


def state_elements(geometry, tp: int, config_path: str = "config.json") -> StateElements:
    """One layer's state on one rank under ``geometry.state_rule`` (the rules above)."""
    rule = geometry.state_rule
    window = geometry.conv_kernel - 1
    if rule == "mamba2":
        groups = geometry.state_groups
        if groups % tp:
            groups = tp  # extra_groups_for_head_shards: tp - groups more
        conv_dim = geometry.state_intermediate + 2 * groups * geometry.state_size
        _check_divisible(geometry, tp, [("conv_dim", conv_dim), ("heads", geometry.state_heads)], config_path)
        return StateElements(conv_dim // tp * window,
                             geometry.state_heads // tp * geometry.state_head_dim * geometry.state_size)
    if rule == "mamba1":
        _check_divisible(geometry, tp, [("intermediate_size", geometry.state_intermediate)], config_path)
        channels = geometry.state_intermediate // tp
        return StateElements(channels * window, channels * geometry.state_size)
    if rule == "kda":
        projection = geometry.state_heads * geometry.state_head_dim
        _check_divisible(geometry, tp, [("projection", projection), ("heads", geometry.state_heads)], config_path)
        return StateElements(window * 3 * (projection // tp),
                             geometry.state_heads // tp * geometry.state_head_dim ** 2)
    if rule == "zaya_cca":
        _check_divisible(geometry, tp, [("CCA channels", geometry.state_intermediate)], config_path)
        return StateElements(geometry.state_intermediate // tp * window + geometry.state_unsharded_conv, 0)
    raise ModelConfigError(f"{geometry.architecture}: no state shape rule {rule!r}", path=config_path)


def _counts(flags: list[tuple[bool, bool]]) -> tuple[int, int]:
    return sum(1 for state, _ in flags if state), sum(1 for _, attention in flags if attention)


def layer_split(entry: Architecture, get, layers: int, config_path: str) -> tuple[int, int, int]:
    """(layers, state layers, attention layers) as the config class's ``linear_layer_ids`` /
    ``full_attention_layer_ids`` list them."""
    rule = entry.state_layers[0]
    if rule == "no_attention":
        return layers, layers, 0
    if rule == "every_layer":
        return layers, layers, layers
    if rule == "layer_types":
        _, state_names, attention_names = entry.state_layers
        types = get("layer_types")
        if types is None and entry.state_config == "GraniteMoeHybridConfig":
            # GraniteMoeHybridConfig.__init__ without layer_types: attention on every 6th layer
            types = ["attention" if (i + 1) % 6 == 0 else "mamba" for i in range(layers)]
        if entry.state_config == "GigaChat35Config" and types is None:
            full = set(get("full_attention_layers") or [])
            types = ["attention" if i in full else "linear_attention" for i in range(layers)]
        if not isinstance(types, list) or len(types) != layers:
            raise ModelConfigError(f"{entry.name}: {entry.state_config} needs layer_types, one per layer "
                                   f"({layers}); found {types!r}", path=config_path)
        return (layers, *_counts([(t in state_names, t in attention_names) for t in map(str, types)]))
    if rule == "kda_layers":
        kda = set((get("linear_attn_config") or {}).get("kda_layers") or [])
        state = sum(1 for i in range(layers) if i + 1 in kda)
        return layers, state, layers - state
    if rule == "layer_group_size":
        group = get("layer_group_size", 1)
        if isinstance(group, int):
            attention = sum(1 for i in range(layers) if (i + 1) % group == 0)
        else:
            attention = sum(1 for g in group[:layers] if g != 1)
        return layers, layers - attention, attention
    if rule == "mixer_types":
        mixers = [_MINICPM_MIXERS.get(str(m), "?") for m in (get("mixer_types") or ["minicpm4"])]
        if "?" in mixers:
            raise ModelConfigError(f"{entry.name}: mixer_types {get('mixer_types')!r} names a mixer MiniCPM's "
                                   "config does not know", path=config_path)
        mixers = (mixers * -(-layers // len(mixers)))[:layers]
        return (layers, *_counts([(m == "lightning-attn", m == "minicpm4") for m in mixers]))
    if rule == "zaya_layers":
        kinds = get("zaya_layers")
        attention = sum(1 for kind in kinds if kind == "a") if kinds else sum(1 for i in range(layers) if i % 2 == 0)
        return layers, attention, attention
    raise ModelConfigError(f"{entry.name}: no state layer rule {rule!r}", path=config_path)


def _need(get, architecture: str, config_path: str, *keys: str) -> list:
    missing = [key for key in keys if get(key) is None]
    if missing:
        raise ModelConfigError(f"{architecture}: a {architecture} config needs {', '.join(keys)}; missing: "
                               f"{', '.join(missing)}", path=config_path,
                               hint="check that this is the model's own config.json")
    return [get(key) for key in keys]


def state_fields(entry: Architecture, get, config_path: str) -> dict:
    """The shape rule's arguments as ``entry.state_config``'s ``mamba2_cache_params`` passes them (geometry
    field names), plus ``state_rule``."""
    arch, name = entry.name, entry.state_config

    def need(*keys: str) -> list:
        return _need(get, arch, config_path, *keys)

    if name == "GraniteMoeHybridConfig":
        hidden, expand, heads, head_dim, groups, state, kernel = (
            get("hidden_size", 2048), get("mamba_expand", 2), get("mamba_n_heads", 64), get("mamba_d_head", 64),
            get("mamba_n_groups", 1), get("mamba_d_state", 128), get("mamba_d_conv", 4))
        return _mamba2(expand * hidden, groups, heads, head_dim, state, kernel)
    if name in ("Lfm2Config", "Lfm2MoeConfig", "Lfm2VlConfig"):
        hidden, cache = need("hidden_size", "conv_L_cache")
        return _mamba2(int(hidden), 1, 0, int(hidden), 0, int(cache))
    if name == "Mamba2Config":
        if get("intermediate_size") is None:
            # configs/mamba2.py reads self.intermediate_size, which transformers' Mamba2Config never sets
            raise ModelConfigError(f"{arch}: SGLang 0.5.23 cannot size this model's state: "
                                   "AttributeError: 'Mamba2Config' object has no attribute 'intermediate_size' "
                                   "(configs/mamba2.py::Mamba2Config.mamba2_cache_params)", path=config_path,
                                   hint="the checkpoint's config.json needs intermediate_size for SGLang to serve it")
        return _mamba2(int(get("intermediate_size")), get("n_groups", 8), get("num_heads", 128),
                       get("head_dim", 64), get("state_size", 128), get("conv_kernel", 4))
    if name in ("MambaConfig", "FalconMambaConfig"):
        # transformers' __post_init__ derives int(expand * hidden_size), then config.json's own intermediate_size
        # (not a declared field) is set over it
        intermediate = get("intermediate_size")
        intermediate = int(intermediate if intermediate is not None else get("expand", 2) * get("hidden_size", 768))
        return {"state_rule": "mamba1", "state_intermediate": intermediate, "state_size": int(get("state_size", 16)),
                "conv_kernel": int(get("conv_kernel", 4))}
    if name in ("JetNemotronConfig",):
        jet = (get("efficient_attention_config") or {}).get("jet") or {}
        heads, head_k, expand_v, kernel = (jet.get(k) for k in ("num_heads", "head_dim", "expand_v", "conv_size"))
        if None in (heads, head_k, expand_v, kernel):
            raise ModelConfigError(f"{arch}: efficient_attention_config.jet needs num_heads, head_dim, expand_v and "
                                   "conv_size", path=config_path)
        head_v = int(head_k * expand_v)
        return _mamba2(heads * head_v, heads, heads, head_v, head_k, kernel)
    if name == "GigaChat35Config":
        kv_heads, k_heads, k_dim, v_dim, kernel = need("linear_num_value_heads", "linear_num_key_heads",
                                                       "linear_key_head_dim", "linear_value_head_dim",
                                                       "linear_conv_kernel_dim")
        return _mamba2(v_dim * kv_heads, k_heads, kv_heads, v_dim, k_dim, kernel)
    if name == "KimiLinearConfig":
        linear = get("linear_attn_config") or {}
        if any(linear.get(k) is None for k in ("num_heads", "head_dim", "short_conv_kernel_size")):
            raise ModelConfigError(f"{arch}: linear_attn_config needs num_heads, head_dim and short_conv_kernel_size",
                                   path=config_path)
        return _kda(linear["num_heads"], linear["head_dim"], linear["short_conv_kernel_size"])
    if name == "BailingHybridConfig":
        heads = get("num_attention_heads", 16)
        head_dim = get("head_dim") or get("hidden_size", 2048) // heads
        if get("short_conv_kernel_size") is not None:
            return _kda(heads, head_dim, get("short_conv_kernel_size"))
        return _mamba2(0, 0, heads, head_dim, head_dim, 1)  # lightning attention: num_linear_key_value_heads
    if name == "MiniCPMHybridConfig":
        heads = get("num_attention_heads")
        head_dim = get("lightning_head_dim") or get("head_dim") or get("hidden_size") // heads
        return _mamba2(0, 0, get("lightning_nkv") or get("num_key_value_heads"), head_dim, head_dim, 1)
    if name == "ZayaConfig":
        heads, kv_heads, head_dim = get("num_attention_heads", 8), get("num_key_value_heads", 2), get("head_dim", 128)
        window = (get("cca_time0", 2) - 1) + (get("cca_time1", 2) - 1)
        return {"state_rule": "zaya_cca", "state_intermediate": (heads + kv_heads) * head_dim,
                "conv_kernel": window + 1, "state_unsharded_conv": int(get("hidden_size", 2048))}
    raise ModelConfigError(f"{arch}: the tuner has no reader for {name}", path=config_path,
                           hint="plan this model by hand with explicit SGLang flags")


def _mamba2(intermediate, groups, heads, head_dim, state, kernel) -> dict:
    return {"state_rule": "mamba2", "state_intermediate": int(intermediate), "state_groups": int(groups),
            "state_heads": int(heads), "state_head_dim": int(head_dim), "state_size": int(state),
            "conv_kernel": int(kernel)}


def _kda(heads, head_dim, kernel) -> dict:
    return {"state_rule": "kda", "state_heads": int(heads), "state_head_dim": int(head_dim),
            "state_size": int(head_dim), "conv_kernel": int(kernel)}
