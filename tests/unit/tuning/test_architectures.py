"""The architecture registry: one entry per architecture, each trait a known rule, and the lists SGLang 0.5.23
keeps in its source equal to the registry's views of them."""

import ast
import os
from pathlib import Path

import pytest

from fleetgen.tuning.architectures import (ARCHITECTURES, ATTENTION_BACKEND_RULES, REGISTRY, SWA_LAYER_RULES,
                                           architecture, names_with)

SGLANG = Path(os.environ.get("FLEETGEN_SGLANG_VENV", Path(__file__).resolve().parents[3] / ".sglang-venv")) / \
    "lib" / "python3.11" / "site-packages" / "sglang" / "srt"


def test_each_architecture_has_one_entry_and_each_rule_is_one_the_tuner_knows():
    assert len(REGISTRY) == len(ARCHITECTURES)
    assert {entry.swa_layers for entry in ARCHITECTURES} <= {None, *SWA_LAYER_RULES}
    assert {entry.attention_backend for entry in ARCHITECTURES} <= {None, *ATTENTION_BACKEND_RULES}
    assert all(entry.swa_layers is None or entry.hybrid_swa for entry in ARCHITECTURES)
    assert all(not entry.multimodal_off_by_default or entry.multimodal or entry.name.startswith("Inkling")
               for entry in ARCHITECTURES)


def test_an_architecture_without_an_entry_is_plain_and_an_unknown_trait_is_refused():
    plain = architecture("SomeNewForCausalLM")
    assert (plain.multimodal, plain.hybrid_swa, plain.attention_backend, plain.eagle_defaults) == (
        False, False, None, None)
    assert architecture("GptOssForCausalLM").swa_layers == "layer_types"
    with pytest.raises(ValueError, match="no architecture trait 'multimodel'"):
        names_with("multimodel")


def _literal_lists(path: Path) -> dict[str, frozenset[str]]:
    """Module- and function-level names bound to literal collections of strings in ``path``, ``*NAME`` entries
    resolved through the names bound before them."""
    found: dict[str, frozenset[str]] = {}

    def strings(node) -> frozenset[str] | None:
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("frozenset", "set", "tuple", "list") \
                and node.args:
            return strings(node.args[0])
        if isinstance(node, (ast.List, ast.Set, ast.Tuple)):
            values = set()
            for element in node.elts:
                if isinstance(element, ast.Constant) and isinstance(element.value, str):
                    values.add(element.value)
                elif isinstance(element, ast.Starred) and getattr(element.value, "id", None) in found:
                    values |= found[element.value.id]
                else:
                    return None
            return frozenset(values)
        return None

    for node in ast.walk(ast.parse(path.read_text())):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) and node.value is not None else []
        for target in targets:
            if isinstance(target, ast.Name) and (values := strings(node.value)) is not None:
                found[target.id] = values
    return found


@pytest.fixture(scope="module")
def sglang_lists():
    if not SGLANG.is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"no SGLang source at {SGLANG}: scripts/sglang-venv.sh did not run")
        pytest.skip(f"no SGLang source at {SGLANG}; build it with scripts/sglang-venv.sh")
    return {**_literal_lists(SGLANG / "configs" / "model_config.py"), **_literal_lists(SGLANG / "server_args.py")}


@pytest.mark.parametrize("trait, sglang_name", [
    ("multimodal", "multimodal_model_archs"),
    ("multimodal_off_by_default", "mm_disabled_models"),
    ("keeps_multimodal_prefill_graph", "multimodal_breakable_cuda_graph_supported_model_archs"),
    ("language_model_only", "LANGUAGE_MODEL_ONLY_ARCHITECTURES"),
    ("hybrid_swa", "hybrid_swa_archs"),
])
def test_the_registry_holds_exactly_the_architectures_sglang_lists(sglang_lists, trait, sglang_name):
    assert names_with(trait) == sglang_lists[sglang_name]


def test_the_layer_types_split_covers_sglangs_sink_architectures_that_serve(sglang_lists):
    # SWA_SINK_ARCHS also names MTP draft heads (IQuestQ1MTP), which are never served on their own.
    served = {name for name in sglang_lists["SWA_SINK_ARCHS"] if not name.endswith("MTP")}
    assert names_with("swa_layers", "layer_types") == served


def _mtp_draft_rewrites(path: Path, lists: dict[str, frozenset[str]]) -> frozenset[str]:
    """The architectures whose draft-mode config SGLang rewrites to one MTP layer: every ``if is_draft_model and
    architectures[0] ...`` branch of ``model_config.py`` that sets ``num_nextn_predict_layers = 1``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.If) or "is_draft_model" not in {n.id for n in ast.walk(node.test)
                                                                     if isinstance(n, ast.Name)}:
            continue
        sets_one_layer = any(isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant) and n.value.value == 1
                             and any(getattr(t, "attr", None) == "num_nextn_predict_layers" for t in n.targets)
                             for statement in node.body for n in ast.walk(statement))
        if sets_one_layer:
            found |= {n.value for n in ast.walk(node.test) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
            found |= {name for n in ast.walk(node.test) if isinstance(n, ast.Name) for name in lists.get(n.id, ())}
    return frozenset(found)


def test_the_mtp_draft_rewrite_covers_every_architecture_sglang_rewrites(sglang_lists):
    rewritten = _mtp_draft_rewrites(SGLANG / "configs" / "model_config.py", sglang_lists)
    assert len(rewritten) > 10 and names_with("mtp_draft_rewrite") == rewritten


def _eagle_defaults(path: Path) -> dict[str, tuple[int, int, int]]:
    """``_auto_choose_speculative_params``: each ``model_arch in [...]`` branch's literal (steps, topk, drafts)."""
    function = next(node for node in ast.walk(ast.parse(path.read_text()))
                    if isinstance(node, ast.FunctionDef) and node.name == "_auto_choose_speculative_params")
    found = {}
    for node in ast.walk(function):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare) \
                and getattr(node.test.left, "id", None) == "model_arch":
            value = ast.literal_eval(node.body[0].value)
            found.update({element.value: value for element in node.test.comparators[0].elts})
    return found


def test_the_eagle_defaults_are_sglangs_for_every_architecture_that_departs_from_three_one_four():
    path = SGLANG / "arg_groups" / "speculative_hook.py"
    if not path.is_file():
        pytest.skip(f"no SGLang source at {SGLANG}; build it with scripts/sglang-venv.sh")
    departing = {name: value for name, value in _eagle_defaults(path).items() if value != (3, 1, 4)}
    assert departing and {name: REGISTRY[name].eagle_defaults for name in departing} == departing
    assert {entry.name for entry in ARCHITECTURES if entry.eagle_defaults is not None} == set(departing)


@pytest.mark.parametrize("rule, names", [
    # model_overrides/qwen3_5.py, interns2_mobius.py
    ("qwen3_5", {"InternS2MobiusForConditionalGeneration", "InternS2PreviewForConditionalGeneration",
                 "Qwen3NextForCausalLM", "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration"}),
    # model_overrides/falcon_h1.py and the Jet models' triton on SM100
    ("triton_on_sm100", {"FalconH1ForCausalLM", "JetNemotronForCausalLM", "JetVLMForConditionalGeneration"}),
    # model_overrides/gpt_oss.py, llama4.py
    ("pinned", {"GptOssForCausalLM", "Llama4ForCausalLM", "Llama4ForConditionalGeneration"}),
    # model_overrides/granitemoehybrid.py (with a Mamba layer), lfm2.py
    ("flashinfer_on_sm100", {"GraniteMoeHybridForCausalLM", "Lfm2ForCausalLM", "Lfm2MoeForCausalLM"}),
    # model_overrides/deepseek_v2.py::_deepseek_family_overrides, kimi_k3.py
    ("trtllm_mla_on_sm100", {"DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM", "Dots3NoteForCausalLM",
                             "Glm5NextForConditionalGeneration", "GlmMoeDsaForCausalLM", "HYV4ForCausalLM",
                             "HYV4ForCausalLMNextN", "KimiK25ForConditionalGeneration", "LongcatFlashForCausalLM",
                             "LongcatFlashForCausalLMNextN", "MistralLarge3ForCausalLM",
                             "PixtralForConditionalGeneration"}),
])
def test_each_attention_backend_rule_names_the_architectures_sglang_overrides(rule, names):
    assert names_with("attention_backend", rule) == names


def test_the_traits_no_sglang_list_holds_are_on_their_architectures_only():
    assert names_with("mxfp4_bf16") == {"GptOssForCausalLM"}
    assert names_with("swa_layers", "llama4") == {"Llama4ForConditionalGeneration"}
    assert names_with("default_vision_hidden_size", 1152) == {"Qwen3_5ForConditionalGeneration",
                                                              "Qwen3_5MoeForConditionalGeneration"}
    assert {entry.default_vision_hidden_size for entry in ARCHITECTURES} == {None, 1152}


def test_an_entry_is_found_by_its_exact_name_and_a_trait_by_its_value():
    assert architecture("LlamaForCausalLM").eagle_defaults == (5, 4, 8)
    assert architecture("LlamaForCausalLM") is REGISTRY["LlamaForCausalLM"]
    assert architecture("llamaforcausallm") == architecture("SomethingElse").__class__("llamaforcausallm")
    # False is a value too: every entry without the trait
    assert names_with("mxfp4_bf16", False) == {entry.name for entry in ARCHITECTURES} - {"GptOssForCausalLM"}
    assert names_with("swa_layers", None) >= {"LlamaForCausalLM"}


@pytest.fixture(scope="module")
def sglang_radix_lists():
    path = SGLANG / "arg_groups" / "overrides.py"
    if not path.is_file():
        if os.environ.get("CI"):
            pytest.fail(f"no SGLang source at {SGLANG}: scripts/sglang-venv.sh did not run")
        pytest.skip(f"no SGLang source at {SGLANG}; build it with scripts/sglang-venv.sh")
    return _literal_lists(path)


def test_the_radix_strategy_traits_are_sglangs_lists(sglang_radix_lists):
    # GigaChat 3.5 joins the resolution through its linear_attn_model_registry spec (uses_mamba_radix_cache,
    # configs/gigachat35.py; extra buffers off), Granite 4.0-H through the layer_types probe beside the list
    assert names_with("mamba_radix") == sglang_radix_lists["_MAMBA_RADIX_CACHE_ARCHS"] | {
        "GigaChat35ForCausalLM", "GraniteMoeHybridForCausalLM"}
    assert names_with("mamba_extra_buffer") == sglang_radix_lists["_MAMBA_EXTRA_BUFFER_ARCHS"]


def test_a_state_entry_names_its_config_class_shape_and_layers_together():
    for entry in ARCHITECTURES:
        assert (entry.state_shape is None) == (entry.state_layers is None), entry.name
        assert entry.state_shape is None or entry.state_config, entry.name
    assert architecture("MiniCPMSALAForCausalLM").radix_cache_off
    assert names_with("radix_cache_off", None) >= {"Qwen3NextForCausalLM", "LlamaForCausalLM"}
