"""The architecture registry against SGLang 0.5.23's own state-cache config classes (run in the SGLang venv by
``sglang_state_families.py``): every class that defines ``mamba2_cache_params`` is planned by a registry entry or
refused with a stated reason, and on each public checkpoint the tuner's bytes per state slot, state layers and
attention layers are what that class itself computes, at several tp sizes."""

import dataclasses
import json
import re
import subprocess

import pytest

from fleetgen.tuning import LaunchOptions, profile_model
from fleetgen.tuning.architectures import ARCHITECTURES, STATE_CACHE_REFUSALS, architecture
from fleetgen.tuning.geometry import model_geometry
from fleetgen.tuning.hf_config import as_sglang_reads
from fleetgen.tuning.state_shapes import STATE_LAYER_RULES, STATE_SHAPE_RULES
from sglang_sim.presets import preset_config

from oracle_harness import ORACLE, VENV_PYTHON, require_venv

SCRIPT = ORACLE.with_name("sglang_state_families.py")
# The public checkpoint of each planned state-cache class (sglang_sim/models/<preset>, sources in presets.py).
FIXTURES = {"GraniteMoeHybridConfig": "granite-4.0-h-small", "KimiLinearConfig": "kimi-linear-48b-a3b",
            "Lfm2Config": "lfm2.5-2.6b", "JetNemotronConfig": "jet-nemotron-2b", "Qwen3NextConfig": "qwen3-next-80b-a3b",
            "Qwen3_5TextConfig": "qwen3.6-27b", "NemotronHConfig": "nemotron-h-8b", "FalconH1Config": "falcon-h1-7b",
            "Lfm2MoeConfig": "lfm2-8b-a1b", "FalconMambaConfig": "falcon-mamba-7b", "Mamba2Config": "mamba-codestral-7b"}
# Planned classes without a public config.json in the fixtures yet: their readers follow the class's source.
WITHOUT_FIXTURE = {"BailingHybridConfig", "GigaChat35Config", "InternS2MobiusTextConfig", "Lfm2VlConfig", "MambaConfig",
                   "MiniCPMHybridConfig", "NemotronHPuzzleConfig", "Qwen3_5MoeTextConfig", "ZayaConfig"}
TP_SIZES = (1, 2, 4)


def _class_config(name: str, config: dict) -> dict:
    """The dict SGLang builds ``name`` from: a text-config class reads the checkpoint's text_config."""
    return config["text_config"] if name.endswith("TextConfig") and "text_config" in config else config


@pytest.fixture(scope="module")
def sglang():
    require_venv()
    shapes = [{"id": f"{name}-tp{tp}", "config_class": name, "config": _class_config(name, preset_config(preset)),
               "tp": tp} for name, preset in FIXTURES.items() for tp in TP_SIZES]
    done = subprocess.run([str(VENV_PYTHON), str(SCRIPT)], input=json.dumps({"shapes": shapes}), capture_output=True,
                          text=True, timeout=600, cwd=SCRIPT.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _planned_classes() -> set[str]:
    return {entry.state_config for entry in ARCHITECTURES if entry.state_config} - set(STATE_CACHE_REFUSALS)


def test_every_state_cache_class_sglang_defines_is_planned_or_refused_with_sglangs_reason(sglang):
    classes = set(sglang["classes"])
    assert len(classes) >= 20
    unaccounted = classes - _planned_classes() - set(STATE_CACHE_REFUSALS)
    # JetVLMConfig wraps JetNemotronConfig, which the JetVLM entry reads through text_config
    assert unaccounted <= {"JetVLMConfig"}, f"state-cache classes neither planned nor refused: {sorted(unaccounted)}"
    assert (_planned_classes() | set(STATE_CACHE_REFUSALS)) <= classes, "names no SGLang class"
    for name, reason in STATE_CACHE_REFUSALS.items():
        assert re.search(r"[\w/]+\.py", reason), f"{name}: the reason cites no SGLang source"


def test_each_planned_class_has_a_public_fixture_or_is_listed_without_one():
    assert set(FIXTURES) | WITHOUT_FIXTURE == _planned_classes() and not set(FIXTURES) & WITHOUT_FIXTURE


def test_each_state_entry_names_a_known_rule():
    for entry in ARCHITECTURES:
        if entry.state_config and entry.state_config not in STATE_CACHE_REFUSALS:
            assert entry.state_shape in STATE_SHAPE_RULES and entry.state_layers[0] in STATE_LAYER_RULES, entry.name


@pytest.mark.parametrize("name, preset", sorted(FIXTURES.items()))
@pytest.mark.parametrize("tp", TP_SIZES)
def test_the_tuners_state_slot_is_what_sglangs_config_class_computes(sglang, name, preset, tp):
    answer = sglang["shapes"][f"{name}-tp{tp}"]
    config = as_sglang_reads(preset_config(preset))
    geometry = model_geometry(config)
    assert architecture(geometry.architecture).state_config == name
    assert geometry.state_rule == architecture(geometry.architecture).state_shape
    if not answer["ok"]:
        with pytest.raises(Exception, match="does not divide"):
            profile_model(config, 10**10, dataclasses.replace(LaunchOptions(), tp_size=tp))
        assert "divisible" in answer["error"], answer
        return
    profile = profile_model(config, 10**10, dataclasses.replace(LaunchOptions(), tp_size=tp))
    assert (profile.state_bytes_per_slot, geometry.state_layers, geometry.attention_layers) == (
        answer["per_slot"], answer["state_layers"], answer["attention_layers"])
