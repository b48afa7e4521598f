"""SGLang 0.5.23's own state-cache config classes, run in the SGLang venv (``scripts/sglang-venv.sh``).

Reads one JSON object from stdin, ``{"shapes": [{"id", "config_class", "config", "tp"}]}``, and prints one JSON
line: ``{"classes": [...], "shapes": {id: {...}}}``:

- ``classes``: every config class under ``sglang.srt.configs`` that defines ``mamba2_cache_params`` (the
  property the KV-cache configurator sizes the state pool from), by class name;
- ``shapes``: for each input, the named class built from the config dict (``from_dict``, as ``AutoConfig`` does
  with config.json) with SGLang's attention TP size set to ``tp``: its ``mamba_cache_per_req`` (bytes of one
  state slot over all state layers, conv and temporal), the number of state layers and of full-attention layers,
  or the exception SGLang raises.
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import pkgutil
import sys
import types

from sglang_oracle import _install_stubs, _cuda_before_import, _patch_everywhere


def state_cache_classes() -> dict[str, type]:
    import sglang.srt.configs as configs

    found: dict[str, type] = {}
    for module_info in pkgutil.iter_modules(configs.__path__):
        module = importlib.import_module(f"{configs.__name__}.{module_info.name}")
        for value in vars(module).values():
            if inspect.isclass(value) and value.__module__ == module.__name__ \
                    and "mamba2_cache_params" in dir(value):
                found[value.__name__] = value
    return found


def _set_tp(tp: int) -> None:
    """What ``get_parallel()`` answers once a server of ``tp`` ranks (no attention DP) is published."""
    from sglang.srt import runtime_context

    parallel = types.SimpleNamespace(attn_tp_size=tp, tp_size=tp, attn_dp_size=1)
    for accessor, value in (("get_parallel", lambda: parallel), ("linear_attn_tp_size", lambda: tp)):
        setattr(runtime_context, accessor, value)
        _patch_everywhere(accessor, value)


def shape(classes: dict[str, type], item: dict) -> dict:
    _set_tp(int(item["tp"]))
    try:
        config = classes[item["config_class"]].from_dict(dict(item["config"]))
        params = config.mamba2_cache_params
        if params is None:
            return {"ok": True, "per_slot": None}
        return {"ok": True, "per_slot": int(params.mamba_cache_per_req), "state_layers": len(list(params.layers)),
                "attention_layers": len(list(config.full_attention_layer_ids))}
    except Exception as error:  # noqa: BLE001  (SGLang's refusal is the answer)
        return {"ok": False, "error": f"{type(error).__name__}: {error}"}


def main() -> int:
    request = json.load(sys.stdin)
    logging.disable(logging.WARNING)
    _install_stubs()
    _cuda_before_import()
    classes = state_cache_classes()
    shapes = {item["id"]: shape(classes, item) for item in request.get("shapes", [])}
    print(json.dumps({"classes": sorted(classes), "shapes": shapes}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
