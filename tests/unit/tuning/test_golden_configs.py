"""config.json variants and what the tuner reads from each, or the error it gives: pinned.

Each error must name the file and say what to do; each shape must be the one SGLang 0.5.23 derives.
Regenerate with ``FLEETGEN_UPDATE_GOLDEN=1`` after a deliberate change and review the diff.
"""

import json
import os
import pathlib

from fleetgen.errors import FleetgenError
from fleetgen.tuning.geometry import model_geometry
from fleetgen.tuning.profile import LaunchOptions, profile_model, weights_bytes_from_index

GOLDEN = pathlib.Path(__file__).parent / "golden" / "configs.json"
CONFIGS = pathlib.Path(__file__).parent / "configs"


def _load(name):
    return json.loads((CONFIGS / name).read_text())


def _without(config, *keys):
    return {k: v for k, v in config.items() if k not in keys}


def _variants():
    nemotron, falcon = _load("nemotron-h-8b-style.json"), _load("falcon-h1-7b-style.json")
    qwen, llama, mla = _load("qwen3-next-80b-a3b.json"), _load("llama-3.1-8b-style.json"), _load("deepseek-v3-style.json")
    blocks = ["mamba", "attention", "mlp", "moe", "mamba"]
    return {
        "not-an-object": [1, 2],
        "nemotron-block-types": {**_without(nemotron, "hybrid_override_pattern"), "layers_block_type": blocks},
        "nemotron-unknown-block": {**_without(nemotron, "hybrid_override_pattern"), "layers_block_type": ["ssm"]},
        "nemotron-bad-pattern": {**nemotron, "hybrid_override_pattern": "M*X"},
        "nemotron-aliases": {**_without(nemotron, "n_groups", "conv_kernel"), "mamba_n_groups": 2, "mamba_d_conv": 3},
        "nemotron-missing": _without(nemotron, "n_groups", "conv_kernel"),
        "nemotron-missing-heads": _without(nemotron, "mamba_num_heads"),
        "blocks-without-nemotron": {**_without(llama, "architectures"), "architectures": ["Other"],
                                    "layers_block_type": blocks},
        "falcon-by-model-type": {**_without(falcon, "architectures"), "architectures": ["Custom"],
                                 "model_type": "falcon_h1"},
        "falcon-missing": _without(falcon, "mamba_d_state"),
        "mla-missing": _without(mla, "qk_rope_head_dim"),
        "dense-missing": _without(llama, "num_attention_heads"),
        "dense-no-head-dim": _without(llama, "head_dim"),
        "dense-no-head-dim-no-hidden": _without(llama, "head_dim", "hidden_size"),
        "architectures-in-text-config": {"text_config": llama},
        "sliding-window": {**llama, "layer_types": ["full_attention", "chunked_attention"]},
        "sliding-window-hybrid": {**qwen, "layer_types": ["sliding_attention"]},
        "dsa-index": {**llama, "index_topk": 2048},
        "stateful-key-in-outer-config": {"text_config": llama, "mamba_expand": 2},
        "stateful-key-in-text-config": {**llama, "ssm_cfg": {}},
        "hybrid-missing": _without(qwen, "linear_conv_kernel_dim"),
        "outer-keys-fill-text-config": {"architectures": ["X"], "text_config": _without(llama, "num_attention_heads"),
                                        "num_attention_heads": 16},
    }


def _read(name, config):
    try:
        geometry = model_geometry(config, config_path=f"/models/{name}/config.json").to_dict()
    except FleetgenError as exc:
        return {"error": str(exc), "path": exc.path, "hint": exc.hint}
    try:
        profile = profile_model(config, 10**10, LaunchOptions(), config_path=f"/models/{name}/config.json").to_dict()
    except FleetgenError as exc:
        profile = {"error": str(exc), "path": exc.path}
    return {"geometry": geometry, "profile": profile}


def _index_cases():
    out = {}
    for name, index in {"ok": {"metadata": {"total_size": "123"}}, "no-metadata": {}, "not-a-dict": [],
                        "no-size": {"metadata": {}}, "text-size": {"metadata": {"total_size": "big"}},
                        "zero": {"metadata": {"total_size": 0}}}.items():
        try:
            out[name] = weights_bytes_from_index(index, path=f"/models/{name}/index.json")
        except FleetgenError as exc:
            out[name] = {"error": str(exc), "path": exc.path}
    return out


def test_config_variants_read_as_pinned():
    snapshot = json.loads(json.dumps({"configs": {name: _read(name, config) for name, config in _variants().items()},
                                      "index": _index_cases()}))
    if os.environ.get("FLEETGEN_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(json.dumps(snapshot, indent=1, sort_keys=True) + "\n")
    golden = json.loads(GOLDEN.read_text())
    assert sorted(snapshot["configs"]) == sorted(golden["configs"])
    for name in golden["configs"]:
        assert snapshot["configs"][name] == golden["configs"][name], name
    assert snapshot["index"] == golden["index"]
