"""The model's identity, read on a node by real shell and Python: what changes the text the servers write changes
it, part by part. (The identity from canned node output, and the tuner's reading of the folder, are in
test_model_files.py.)"""

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from fleetgen.errors import ConfigError
from fleetgen.generate.reuse import changed_parts, generation_material
from fleetgen.tuning.model_files import WEIGHT_SAMPLE_BYTES, model_identity
from model_folder_fixtures import TENSOR_BYTES, model, write_safetensors  # noqa: F401 (model: a fixture)

SAMPLING = {"max_tokens": 64, "temperature": 0.6, "top_p": 0.95, "extra_body": {}}


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


def test_an_unreadable_sglang_version_names_the_python(model):
    with pytest.raises(ConfigError, match=r"cannot read the SGLang version for .* \(exit 1\)") as error:
        identity(model, module="no_such_module_here")
    assert "server.module" in error.value.hint


def test_several_unreadable_files_are_counted_after_the_first(model):
    (model / "config.json").unlink()
    (model / "tokenizer.json").chmod(0)
    if os.access(model / "tokenizer.json", os.R_OK):
        pytest.skip("running as a user who reads every file")
    with pytest.raises(ConfigError, match=r"cannot read config.json of the model: missing \(and 1 more\)") as error:
        identity(model)
    assert error.value.path == f"{model}/config.json"
