"""The model's identity, read on the node: what changes the text the servers write changes it, part by part."""

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from fleetgen.errors import ConfigError, ModelConfigError
from fleetgen.generate.reuse import changed_parts, generation_material
from fleetgen.tuning.model_files import WEIGHT_SAMPLE_BYTES, WEIGHT_SAMPLES, model_identity

SAMPLING = {"max_tokens": 64, "temperature": 0.6, "top_p": 0.95, "extra_body": {}}
TENSOR_BYTES = 2 * WEIGHT_SAMPLES * WEIGHT_SAMPLE_BYTES  # the samples cover half of the tensor bytes


def write_safetensors(path: Path, data: bytes, dtype: str = "BF16") -> None:
    """The safetensors layout: 8-byte little-endian header length, JSON header, tensor bytes."""
    header = json.dumps({"__metadata__": {"format": "pt"},
                         "w": {"dtype": dtype, "shape": [len(data) // 2], "data_offsets": [0, len(data)]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)


@pytest.fixture
def model(tmp_path) -> Path:
    """A single-file checkpoint (no model.safetensors.index.json), as small models ship."""
    folder = tmp_path / "my 'model' $HOME"  # a value reaching the shell is quoted
    folder.mkdir()
    (folder / "config.json").write_text('{"hidden_size": 8}')
    (folder / "tokenizer.json").write_text('{"model": {"type": "BPE"}}')
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<e>", "chat_template": "{{ messages }}"}))
    write_safetensors(folder / "model.safetensors", bytes(TENSOR_BYTES))
    return folder


def identity(folder: Path, **kwargs) -> dict:
    def run(command, timeout_s):
        return subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=True,
                              timeout=timeout_s, env={**os.environ, "PYTHONPATH": str(folder.parent)}).stdout

    return model_identity(run, str(folder), python=sys.executable, module=kwargs.pop("module", "fleetgen"),
                          host="node0", **kwargs)


def changed(before: dict, after: dict) -> list[str]:
    return changed_parts(generation_material(before, **SAMPLING), generation_material(after, **SAMPLING))


def test_a_single_file_checkpoint_has_an_identity(model):
    found = identity(model)
    assert found["weight_files"] == 1 and found["weight_bytes"] == (model / "model.safetensors").stat().st_size
    assert found["parts"]["generation_config"] == "absent" and found["weights_hash"] == "header"
    assert identity(model) == found


@pytest.mark.parametrize("edit, part", [
    (lambda m: write_safetensors(m / "model.safetensors", b"\x01" * TENSOR_BYTES), "model.weights"),
    (lambda m: write_safetensors(m / "model.safetensors", bytes(TENSOR_BYTES), dtype="F16"), "model.weights"),
    (lambda m: (m / "model.safetensors.index.json").write_text('{"weight_map": {}}'), "model.weights"),
    (lambda m: (m / "model-00002-of-00002.safetensors").write_bytes((m / "model.safetensors").read_bytes()),
     "model.weights"),
    (lambda m: (m / "config.json").write_text('{"hidden_size": 16}'), "model.config"),
    (lambda m: (m / "generation_config.json").write_text('{"temperature": 0.7}'), "model.generation_config"),
    (lambda m: (m / "tokenizer.json").write_text('{"model": {"type": "Unigram"}}'), "model.tokenizer"),
    (lambda m: (m / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<e>", "chat_template": "new"})),
     "model.chat_template"),
    (lambda m: (m / "chat_template.jinja").write_text("{{ messages }}!"), "model.chat_template")])
def test_new_files_in_the_same_model_folder_change_the_part_they_belong_to(model, edit, part):
    before = identity(model)
    edit(model)
    assert changed(before, identity(model)) == [part]


def test_new_values_of_the_same_shapes_change_the_weights_part_though_the_header_is_the_same(model):
    before = identity(model)
    data = bytearray(TENSOR_BYTES)
    data[::4096] = b"\x01" * len(data[::4096])  # a retrained checkpoint: every region of every tensor differs
    write_safetensors(model / "model.safetensors", bytes(data))
    assert changed(before, identity(model)) == ["model.weights"]


def test_the_full_hash_sees_a_byte_the_samples_do_not_read(model):
    before, before_full = identity(model), identity(model, weights_hash="full")
    data = bytearray(TENSOR_BYTES)
    data[WEIGHT_SAMPLE_BYTES + 10] = 1  # between the first two sampled blocks
    write_safetensors(model / "model.safetensors", bytes(data))
    assert changed(before, identity(model)) == []
    assert changed(before_full, identity(model, weights_hash="full")) == ["model.weights_content"]


def test_the_chat_template_flag_and_the_sglang_version_are_parts(model, tmp_path):
    template = tmp_path / "template.jinja"
    template.write_text("A")
    flags = ["--chat-template", str(template)]
    before = identity(model, extra_args=flags)
    template.write_text("B")
    assert changed(before, identity(model, extra_args=flags)) == ["model.chat_template"]
    assert changed(before, identity(model, extra_args=[*flags, "--dtype", "float16"])) == \
        ["model.chat_template", "model.launch_args"]
    (tmp_path / "fakesglang.py").write_text('__version__ = "0.5.24"')
    assert identity(model, module="fakesglang")["parts"]["sglang"] == "0.5.24"
    assert "model.sglang" in changed(before, identity(model, module="fakesglang", extra_args=flags))


@pytest.mark.parametrize("damage, named", [
    (lambda m: (m / "config.json").unlink(), "config.json"),
    (lambda m: (m / "model.safetensors").write_bytes(struct.pack("<Q", 10 ** 9) + b"{}"), "model.safetensors")])
def test_an_unreadable_model_folder_is_a_config_error_naming_the_file(model, damage, named):
    damage(model)
    with pytest.raises(ConfigError) as error:
        identity(model)
    assert named in str(error.value) and "node0" in str(error.value) and "model.path" in str(error.value)


# ---- the tuner's reading of the model folder: config as SGLang sees it, quantization, weight bytes ----

def read_folder(folder: Path):
    from fleetgen.tuning.model_files import read_model

    return read_model(lambda command: subprocess.run(["bash", "-c", command], capture_output=True, text=True,
                                                     check=True).stdout, str(folder), host="node0")


GEMMA3_4B = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "torch_dtype": "bfloat16",
             "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                             "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                             "sliding_window": 1024},
             "vision_config": {"hidden_size": 1152, "model_type": "siglip_vision_model", "num_hidden_layers": 27}}


def test_a_single_file_checkpoint_weighs_the_tensor_bytes_its_header_declares(model):
    found = read_folder(model)
    assert found.weights_bytes == TENSOR_BYTES and found.hf_quant_config is None
    assert found.weights_source == "1 safetensors header(s)"


def test_shards_without_an_index_add_up_every_header(model):
    write_safetensors(model / "model-00002-of-00002.safetensors", bytes(1000))
    assert read_folder(model).weights_bytes == TENSOR_BYTES + 1000


def test_the_index_wins_over_the_headers(model):
    (model / "model.safetensors.index.json").write_text('{"metadata": {"total_size": 1234}, "weight_map": {}}')
    found = read_folder(model)
    assert found.weights_bytes == 1234 and found.weights_source == "model.safetensors.index.json"


def test_a_folder_without_weights_names_what_is_missing(model):
    (model / "model.safetensors").unlink()
    with pytest.raises(ConfigError, match=r"no model\.safetensors\.index\.json and no \*\.safetensors file") as error:
        read_folder(model)
    assert error.value.host == "node0" and error.value.path.endswith("*.safetensors")


def test_a_broken_safetensors_header_names_the_file(model):
    (model / "model.safetensors").write_bytes(struct.pack("<Q", 5) + b"{oops")
    with pytest.raises(ConfigError, match="not valid JSON") as error:
        read_folder(model)
    assert error.value.path == f"{model}/model.safetensors"


def test_hf_quant_config_beside_config_json_is_read(model):
    quant = {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}
    (model / "hf_quant_config.json").write_text(json.dumps(quant))
    assert read_folder(model).hf_quant_config == quant


def test_a_text_config_takes_the_defaults_of_its_transformers_class(model):
    """Gemma-3's text_config names no max_position_embeddings: SGLang reads Gemma3TextConfig's 131,072 (and its
    head counts), not get_context_length's last resort of 2,048 tokens."""
    from fleetgen.tuning.geometry import context_length_of, model_geometry

    (model / "config.json").write_text(json.dumps(GEMMA3_4B))
    config = read_folder(model).config
    assert context_length_of(config) == 131_072
    geometry = model_geometry(config)
    assert (geometry.kv_heads, geometry.head_dim, geometry.num_layers) == (4, 256, 34)


def test_a_config_its_transformers_class_rejects_is_an_error_naming_the_file(model):
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "num_attention_heads": 3,
                                                   "hidden_size": 64, "head_dim": None}))
    with pytest.raises(ModelConfigError, match=r"cannot build LlamaConfig from config.json: (.|\n)*not a multiple") \
            as error:
        read_folder(model)
    assert error.value.path == f"{model}/config.json" and error.value.host == "node0"


def test_the_prompt_scan_reads_the_context_length_sglang_sees(model):
    from fleetgen.tuning.geometry import context_length_of
    from fleetgen.tuning.model_files import read_model_config

    (model / "config.json").write_text(json.dumps(GEMMA3_4B))
    config = read_model_config(lambda path: Path(path).read_text(), str(model), host="node0")
    assert context_length_of(config) == 131_072
