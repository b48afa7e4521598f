"""The model folder as the tuner reads it (config, quantization, weight bytes) and the model's identity from what
the node prints. The identity read by real shell and Python on a folder is in test_model_identity.py."""

import hashlib
import json
import struct
import subprocess
from pathlib import Path

import pytest

from fleetgen.errors import ConfigError, ModelConfigError
from fleetgen.tuning.model_files import TOKENIZER_FILES, model_identity
from model_folder_fixtures import TENSOR_BYTES, model, write_safetensors  # noqa: F401 (model: a fixture)

FILES_HINT = "check the model directory named by model.path in the fleet description"


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


# ---- the weight bytes the safetensors headers declare, and the sections the command prints ----

def _header_line(name: str, header: dict) -> str:
    text = json.dumps(header)
    return f"{len(text)} {name}\n{text}\n"


def test_every_tensor_span_is_summed_and_the_metadata_entry_is_not_a_tensor():
    from fleetgen.tuning.model_files import weights_bytes_from_headers

    text = (_header_line("a.safetensors", {"__metadata__": {"format": "pt"}, "w": {"data_offsets": [0, 100]},
                                           "b": {"data_offsets": [100, 150]}})
            + "\n" + _header_line("b.safetensors", {"x": {"data_offsets": ["0", "7"]}}))
    assert weights_bytes_from_headers(text, "/models/m") == (157, 2)


@pytest.mark.parametrize("header, words", [
    ({"w": {"dtype": "BF16"}}, "a tensor without numeric data_offsets"),
    ({"w": {"data_offsets": [0]}}, "a tensor without numeric data_offsets"),
    ({"w": {"data_offsets": ["a", "b"]}}, "a tensor without numeric data_offsets"),
    ({"w": [0, 1]}, "a tensor without numeric data_offsets"),
    ({"w": {"data_offsets": [10, 4]}}, "a tensor whose data_offsets end before they start"),
    ({"__metadata__": {"format": "pt"}}, "the safetensors files declare no tensor bytes"),
    ({"w": {"data_offsets": [4, 4]}}, "the safetensors files declare no tensor bytes"),
])
def test_a_header_that_declares_no_sensible_bytes_is_refused_naming_the_file(header, words):
    from fleetgen.tuning.model_files import weights_bytes_from_headers

    with pytest.raises(ModelConfigError, match=words) as error:
        weights_bytes_from_headers(_header_line("shard.safetensors", header), "/models/m", host="node0")
    assert error.value.host == "node0" and error.value.path.startswith("/models/m/")
    assert error.value.message.startswith("the safetensors ") and error.value.message.endswith(words)
    assert error.value.hint == FILES_HINT


def test_a_header_line_without_its_header_is_cut_short():
    from fleetgen.tuning.model_files import weights_bytes_from_headers

    with pytest.raises(ModelConfigError, match="the safetensors header was cut short") as error:
        weights_bytes_from_headers("12 shard.safetensors", "/models/m")
    assert error.value.path == "/models/m/shard.safetensors"
    with pytest.raises(ModelConfigError, match="declare no tensor bytes"):
        weights_bytes_from_headers("", "/models/m")


def _sections(**sections) -> str:
    from fleetgen.nodes.remote import SECTION_MARKER

    return "".join(f"{SECTION_MARKER}{name}\n{text}\n{SECTION_MARKER}rc={status}\n"
                   for name, (status, text) in sections.items())


def test_the_sections_give_the_config_the_quantization_and_the_index():
    from fleetgen.tuning.model_files import parse_model_files

    output = _sections(config=(0, '{"hidden_size": 8}'), quant=(0, '{"quantization": {"quant_algo": "FP8"}}'),
                       index=(0, '{"metadata": {"total_size": 4096}, "weight_map": {}}'), headers=(100, ""))
    found = parse_model_files(output, "/models/m/", host="node0")
    assert found.config == {"hidden_size": 8} and found.hf_quant_config == {"quantization": {"quant_algo": "FP8"}}
    assert (found.weights_bytes, found.weights_source) == (4096, "model.safetensors.index.json")


def test_without_an_index_the_headers_are_summed_and_an_absent_quantization_file_is_none():
    from fleetgen.tuning.model_files import parse_model_files

    headers = _header_line("a.safetensors", {"w": {"data_offsets": [0, 10]}}) + \
        _header_line("b.safetensors", {"w": {"data_offsets": [0, 5]}})
    output = _sections(config=(0, '{"hidden_size": 8}'), quant=(100, ""), index=(100, ""), headers=(0, headers))
    found = parse_model_files(output, "/models/m", host=None)
    assert (found.weights_bytes, found.weights_source, found.hf_quant_config) == (15, "2 safetensors header(s)", None)


def test_a_section_that_failed_names_its_file_its_status_and_the_end_of_its_error():
    from fleetgen.tuning.model_files import parse_model_files

    output = _sections(config=(1, "x" * 600 + "cat: config.json: Permission denied"), quant=(100, ""),
                       index=(100, ""), headers=(100, ""))
    with pytest.raises(ConfigError) as error:
        parse_model_files(output, "/models/m", host="node0")
    assert error.value.path == "/models/m/config.json" and error.value.host == "node0"
    # the last 500 characters of what the section printed
    last = "x" * (500 - len("cat: config.json: Permission denied")) + "cat: config.json: Permission denied"
    assert f"cannot read /models/m/config.json (exit 1): {last}\n" in str(error.value)
    assert f"x{last}" not in str(error.value)
    missing = _sections(quant=(100, ""), index=(100, ""), headers=(100, ""))
    with pytest.raises(ConfigError) as error:
        parse_model_files(missing, "/models/m", host="node0")
    assert error.value.message == "cannot read /models/m/config.json (exit None): "


def test_an_unreadable_quantization_file_is_an_error_not_an_absence():
    from fleetgen.tuning.model_files import parse_model_files

    output = _sections(config=(0, "{}"), quant=(0, "{torn"), index=(100, ""), headers=(100, ""))
    with pytest.raises(ConfigError, match="not valid JSON") as error:
        parse_model_files(output, "/models/m", host="node0")
    assert error.value.path == "/models/m/hf_quant_config.json" and error.value.line == 1
    assert error.value.host == "node0" and error.value.hint == FILES_HINT


def test_the_model_files_are_named_under_the_model_folder_whatever_its_trailing_slash():
    from fleetgen.tuning.model_files import model_file_paths

    assert model_file_paths("/models/m/") == ("/models/m/config.json", "/models/m/model.safetensors.index.json")
    assert model_file_paths("/models/m") == model_file_paths("/models/m/")


def test_a_header_of_exactly_the_size_limit_is_read_and_one_byte_more_is_refused(model):
    """safetensors' own limit: a header may be 100,000,000 bytes, not one more (the command reads no further
    than the header declares, so a short file with a large declared length serves the test)."""
    from fleetgen.tuning.model_files import SAFETENSORS_HEADER_MAX_BYTES

    header = json.dumps({"w": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]}}).encode()
    (model / "model.safetensors").write_bytes(struct.pack("<Q", SAFETENSORS_HEADER_MAX_BYTES) + header)
    assert read_folder(model).weights_bytes == 8
    (model / "model.safetensors").write_bytes(struct.pack("<Q", SAFETENSORS_HEADER_MAX_BYTES + 1) + header)
    with pytest.raises(ConfigError, match="model.safetensors declares a header of 100000001 bytes"):
        read_folder(model)


@pytest.mark.parametrize("content, words", [(struct.pack("<Q", 0) + b"{}", "declares a header of 0 bytes"),
                                            (b"\x01\x02\x03", "model.safetensors is shorter than a safetensors header"),
                                            (struct.pack("<Q", 1 << 63) + b"{}", "declares a header of -")])
def test_a_weight_file_without_a_sensible_header_length_is_refused(model, content, words):
    (model / "model.safetensors").write_bytes(content)
    with pytest.raises(ConfigError, match=words):
        read_folder(model)


def test_a_header_length_is_read_little_endian_from_all_eight_bytes(model):
    header = json.dumps({"w": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 6]}}).encode()
    padded = header + b" " * (0x0102 - len(header))  # 258 bytes: both low bytes count
    (model / "model.safetensors").write_bytes(struct.pack("<Q", 0x0102) + padded + bytes(6))
    assert read_folder(model).weights_bytes == 6


def test_the_identity_refuses_an_unknown_weights_hash_before_reading_anything():
    from fleetgen.tuning.model_files import model_identity

    calls = []
    with pytest.raises(ConfigError, match=r"unknown weights hash 'md5'; expected one of \['full', 'header'\]"):
        model_identity(lambda command, timeout: calls.append(command), "/m", python="python", module="sglang",
                       weights_hash="md5")
    assert calls == []


def test_the_identity_waits_longer_for_a_full_hash():
    timeouts = []

    def run(command, timeout_s):
        timeouts.append(timeout_s)
        return ""  # nothing read: the identity is refused after the wait

    for weights_hash in ("full", "header"):
        with pytest.raises(ConfigError, match=r"cannot read the model's identity \(exit None\)"):
            model_identity(run, "/m", python="python", module="sglang", weights_hash=weights_hash)
    assert timeouts == [3600.0, 120.0]


def test_the_prompt_scans_config_read_names_the_file_and_the_host_when_it_fails():
    from fleetgen.tuning.model_files import read_model_config

    with pytest.raises(ConfigError, match="not valid JSON") as error:
        read_model_config(lambda path: "{torn", "/models/m", host="node0")
    assert (error.value.path, error.value.host) == ("/models/m/config.json", "node0")
    rejected = json.dumps({"model_type": "llama", "num_attention_heads": 3, "hidden_size": 64, "head_dim": None})
    with pytest.raises(ModelConfigError, match="cannot build LlamaConfig") as error:
        read_model_config(lambda path: rejected, "/models/m/", host="node0")
    assert (error.value.path, error.value.host) == ("/models/m/config.json", "node0")


# ---- the identity from what the node printed: a fake node answers, no shell runs ----

def _found(**changes) -> dict:
    """What the identity program prints for a two-shard checkpoint with an index and a generation config."""
    found = {"files": {"config.json": "c" * 64, "generation_config.json": "g" * 64,
                       "model.safetensors.index.json": "i" * 64},
             "tokenizer": {"files": {"tokenizer.json": "t" * 64}, "chat_template": "h" * 64},
             "weights": {"a.safetensors": {"bytes": 1000, "sampled_sha256": "a" * 64, "sha256": "A" * 64},
                         "b.safetensors": {"bytes": 24, "sampled_sha256": "b" * 64, "sha256": "B" * 64}},
             "template_file": None, "unreadable": {}}
    return {**found, **changes}


class FakeNode:
    """A node whose identity and version programs print canned answers: the sections command itself runs in bash
    (no Python starts), and the arguments the identity program was asked with are kept."""

    def __init__(self, monkeypatch, found=None, *, identity_status=0, identity_text=None, version=(0, "0.5.23\n")):
        from fleetgen.nodes import remote

        self.asked: list[dict] = []
        self.versions_asked: list[tuple[str, str]] = []
        self.timeouts: list[float] = []
        identity_text = identity_text if identity_text is not None else "some warning\n" + json.dumps(found or _found())

        def printing(text: str, status: int) -> str:
            return f"printf '%s\\n' {remote.quote(text)}; exit {status}"

        def identity_command(python, model_path, **spec):
            self.asked.append({"python": python, "model_path": model_path, **spec})
            return printing(identity_text, identity_status)

        def version_command(python, module):
            self.versions_asked.append((python, module))
            return printing(version[1], version[0])

        monkeypatch.setattr(remote, "model_identity_command", identity_command)
        monkeypatch.setattr(remote, "package_version_command", version_command)

    def run(self, command, timeout_s):
        self.timeouts.append(timeout_s)
        return subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=True).stdout

    def identity(self, model_path="/models/m", **kwargs):
        return model_identity(self.run, model_path, python="/venv/bin/python", module="sglang", host="node0",
                              **kwargs)


def _digest_of(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def test_the_parts_are_digests_of_what_the_node_hashed_so_earlier_runs_stay_comparable(monkeypatch):
    """The reuse index keeps these digests from earlier runs: the same files must give the same digest from one
    fleetgen version to the next, so the structure hashed is pinned here."""
    parts = FakeNode(monkeypatch).identity(extra_args=["--chat-template", "/t/c.jinja"])["parts"]
    assert parts["weights"] == _digest_of({"files": {"a.safetensors": [1000, "a" * 64], "b.safetensors": [24, "b" * 64]},
                                           "indexes": {"model.safetensors.index.json": "i" * 64}})
    assert parts["tokenizer"] == _digest_of({"root": "/models/m", "files": {"tokenizer.json": "t" * 64}})
    assert parts["chat_template"] == _digest_of({"tokenizer_config.json": "h" * 64, "chat_template.jinja": None,
                                                 "chat_template.json": None, "--chat-template": "/t/c.jinja"})
    assert parts["launch_args"] == _digest_of(["--chat-template", "/t/c.jinja"])


def test_the_version_is_asked_of_the_servers_python_and_module(monkeypatch):
    node = FakeNode(monkeypatch)
    node.identity()
    assert node.versions_asked == [("/venv/bin/python", "sglang")]


def test_a_node_that_printed_nothing_names_no_status():
    with pytest.raises(ConfigError) as error:
        model_identity(lambda command, timeout: "", "/m", python="python", module="sglang")
    assert error.value.message == "cannot read the model's identity (exit None): "


def test_a_node_that_printed_no_version_section_names_no_status(monkeypatch):
    identity_only = _sections(identity=(0, json.dumps(_found())))
    with pytest.raises(ConfigError) as error:
        model_identity(lambda command, timeout: identity_only, "/m", python="python", module="sglang")
    assert error.value.message == "cannot read the SGLang version for python (exit None)"


def test_the_identity_counts_every_weight_file_and_sums_their_bytes(monkeypatch):
    found = FakeNode(monkeypatch).identity()
    assert (found["weight_files"], found["weight_bytes"]) == (2, 1024)
    assert found["path"] == "/models/m" and found["weights_hash"] == "header"
    assert found["parts"]["path"] == "/models/m" and found["parts"]["config"] == "c" * 64
    assert found["parts"]["generation_config"] == "g" * 64 and found["parts"]["sglang"] == "0.5.23"
    assert "weights_content" not in found["parts"]


def test_the_identity_asks_the_node_for_the_model_files_and_sampled_blocks(monkeypatch):
    node = FakeNode(monkeypatch)
    node.identity()
    assert node.asked == [{"python": "/venv/bin/python", "model_path": "/models/m", "tokenizer_root": "/models/m",
                           "small_files": ("config.json", "generation_config.json", "chat_template.jinja",
                                           "chat_template.json"),
                           "tokenizer_files": TOKENIZER_FILES, "template_file": "", "full": False,
                           "samples": 16, "sample_bytes": 64 * 1024}]
    assert node.timeouts == [120.0]


def test_a_full_hash_reads_every_byte_and_adds_the_content_part(monkeypatch):
    node = FakeNode(monkeypatch)
    found = node.identity(weights_hash="full")
    assert node.asked[0]["full"] is True and node.timeouts == [3600.0]
    assert found["weights_hash"] == "full"
    header_only = FakeNode(monkeypatch).identity()
    assert found["parts"]["weights"] == header_only["parts"]["weights"]
    changed_content = _found(weights={**_found()["weights"],
                                      "b.safetensors": {"bytes": 24, "sampled_sha256": "b" * 64, "sha256": "C" * 64}})
    other = FakeNode(monkeypatch, changed_content).identity(weights_hash="full")
    assert other["parts"]["weights_content"] != found["parts"]["weights_content"]
    assert other["parts"]["weights"] == found["parts"]["weights"]


@pytest.mark.parametrize("extra_args, template, tokenizer_root", [
    (["--chat-template", "/t/chat.jinja"], "/t/chat.jinja", "/models/m"),
    (["--chat-template=/t/a=b.jinja"], "/t/a=b.jinja", "/models/m"),
    (["--tokenizer-path", "/tok", "--dtype", "bfloat16"], "", "/tok"),
    (["--tokenizer-path=/tok"], "", "/tok"),
    (["--chat-template"], "", "/models/m"),  # a flag without its value names nothing
    (["--chat-template-kwargs", "x", "--chat-template", "/t/second"], "/t/second", "/models/m"),
])
def test_the_launch_flags_name_the_template_file_and_the_tokenizer_folder(monkeypatch, extra_args, template,
                                                                          tokenizer_root):
    node = FakeNode(monkeypatch)
    node.identity(extra_args=extra_args)
    assert (node.asked[0]["template_file"], node.asked[0]["tokenizer_root"]) == (template, tokenizer_root)


def test_the_first_chat_template_flag_is_the_one_read(monkeypatch):
    node = FakeNode(monkeypatch)
    node.identity(extra_args=["--chat-template", "/first", "--chat-template", "/second"])
    assert node.asked[0]["template_file"] == "/first"


def test_a_tokenizer_folder_elsewhere_changes_the_tokenizer_part(monkeypatch):
    own = FakeNode(monkeypatch).identity()
    elsewhere = FakeNode(monkeypatch).identity(extra_args=["--tokenizer-path", "/tok"])
    assert own["parts"]["tokenizer"] != elsewhere["parts"]["tokenizer"]


@pytest.mark.parametrize("change, part", [
    (lambda f: f["weights"]["a.safetensors"].update(bytes=1001), "weights"),
    (lambda f: f["weights"]["b.safetensors"].update(sampled_sha256="x" * 64), "weights"),
    (lambda f: f["files"].update({"model.safetensors.index.json": "j" * 64}), "weights"),
    (lambda f: f["files"].update({"config.json": "d" * 64}), "config"),
    (lambda f: f["files"].update({"generation_config.json": "e" * 64}), "generation_config"),
    (lambda f: f["tokenizer"]["files"].update({"tokenizer.json": "u" * 64}), "tokenizer"),
    (lambda f: f["tokenizer"].update(chat_template="k" * 64), "chat_template"),
    (lambda f: f["files"].update({"chat_template.jinja": "l" * 64}), "chat_template"),
    (lambda f: f["files"].update({"chat_template.json": "l" * 64}), "chat_template"),
    (lambda f: f.update(template_file="m" * 64), "chat_template"),
])
def test_each_file_the_node_hashed_changes_only_its_own_part(monkeypatch, change, part):
    before = FakeNode(monkeypatch).identity()["parts"]
    found = json.loads(json.dumps(_found()))
    change(found)
    after = FakeNode(monkeypatch, found).identity()["parts"]
    assert [name for name in before if before[name] != after[name]] == [part]


def test_a_template_file_the_node_could_not_hash_is_identified_by_its_name(monkeypatch):
    first = FakeNode(monkeypatch).identity(extra_args=["--chat-template", "/t/a"])["parts"]
    second = FakeNode(monkeypatch).identity(extra_args=["--chat-template", "/t/b"])["parts"]
    assert first["chat_template"] != second["chat_template"]
    assert first["launch_args"] != second["launch_args"]
    hashed = _found(template_file="m" * 64)
    same_file = FakeNode(monkeypatch, hashed).identity(extra_args=["--chat-template", "/t/a"])["parts"]
    renamed = FakeNode(monkeypatch, hashed).identity(extra_args=["--chat-template", "/t/b"])["parts"]
    assert same_file["chat_template"] == renamed["chat_template"]  # the content, not the name, when hashed


def test_a_model_without_a_generation_config_says_absent(monkeypatch):
    files = {name: digest for name, digest in _found()["files"].items() if name != "generation_config.json"}
    assert FakeNode(monkeypatch, _found(files=files)).identity()["parts"]["generation_config"] == "absent"


def test_launch_args_given_as_numbers_are_the_same_as_their_text(monkeypatch):
    as_numbers = FakeNode(monkeypatch).identity(extra_args=["--tp", 2])["parts"]
    as_text = FakeNode(monkeypatch).identity(extra_args=["--tp", "2"])["parts"]
    assert as_numbers == as_text
    assert as_text["launch_args"] != FakeNode(monkeypatch).identity(extra_args=["--tp", "4"])["parts"]["launch_args"]


def test_the_sglang_version_is_the_last_line_the_node_printed(monkeypatch):
    found = FakeNode(monkeypatch, version=(0, "a warning\n0.5.24 \n\n")).identity()
    assert found["parts"]["sglang"] == "0.5.24"


@pytest.mark.parametrize("version, status", [((1, "ModuleNotFoundError"), "1"), ((0, "  \n"), "0")])
def test_an_sglang_version_not_read_names_the_python_and_the_status(monkeypatch, version, status):
    with pytest.raises(ConfigError) as error:
        FakeNode(monkeypatch, version=version).identity()
    assert error.value.message == f"cannot read the SGLang version for /venv/bin/python (exit {status})"
    assert error.value.host == "node0"
    assert error.value.hint == "check server.python and server.module in the fleet description"


@pytest.mark.parametrize("status, text", [(1, "Traceback\nPermissionError"), (0, ""), (0, "not json at all")])
def test_an_identity_not_printed_names_the_status_the_folder_and_the_end_of_the_output(monkeypatch, status, text):
    with pytest.raises(ConfigError) as error:
        FakeNode(monkeypatch, identity_status=status, identity_text=text).identity("/models/m/")
    assert error.value.message == f"cannot read the model's identity (exit {status}): {text.strip()}"
    assert (error.value.host, error.value.path) == ("node0", "/models/m/")
    assert error.value.hint == ("check the model directory named by model.path in the fleet description and "
                                "server.python")


def test_an_identity_error_keeps_the_last_500_characters():
    text = "x" * 600 + "the end"
    with pytest.raises(ConfigError) as error:
        model_identity(lambda command, timeout: _sections(identity=(1, text), sglang=(0, "1")), "/m",
                       python="python", module="sglang")
    assert error.value.message == f"cannot read the model's identity (exit 1): {text[-500:]}"


@pytest.mark.parametrize("unreadable, files, message, path", [
    ({"tokenizer.json": "PermissionError: denied"}, None,
     "cannot read tokenizer.json of the model: PermissionError: denied", "/models/m/tokenizer.json"),
    ({}, {"generation_config.json": "g" * 64}, "cannot read config.json of the model: missing", "/models/m/config.json"),
    ({"z.safetensors": "ValueError: short", "b.safetensors": "OSError: gone"}, None,
     "cannot read b.safetensors of the model: OSError: gone (and 1 more)", "/models/m/b.safetensors"),
    ({"a": "x", "b": "y"}, {}, "cannot read a of the model: x (and 2 more)", "/models/m/a"),
])
def test_unreadable_files_name_the_first_in_order_and_count_the_rest(monkeypatch, unreadable, files, message, path):
    found = _found(unreadable=unreadable, **({} if files is None else {"files": files}))
    with pytest.raises(ConfigError) as error:
        FakeNode(monkeypatch, found).identity("/models/m/")
    assert error.value.message == message
    assert (error.value.path, error.value.host) == (path, "node0")
    assert error.value.hint.endswith("and server.python")


def test_an_unreadable_file_is_named_under_a_folder_whose_name_ends_like_a_separator(monkeypatch):
    found = _found(unreadable={"tokenizer.json": "PermissionError: denied"})
    with pytest.raises(ConfigError) as error:
        FakeNode(monkeypatch, found).identity("/models/Qwen3-X//")
    assert error.value.path == "/models/Qwen3-X/tokenizer.json"


def test_a_cut_short_header_names_its_host_and_the_file_whose_name_has_spaces():
    from fleetgen.tuning.model_files import weights_bytes_from_headers

    with pytest.raises(ModelConfigError) as error:
        weights_bytes_from_headers("12 my shard.safetensors", "/models/m", host="node0")
    assert error.value.message == "the safetensors header was cut short"
    assert (error.value.path, error.value.host) == ("/models/m/my shard.safetensors", "node0")


def test_a_header_that_is_not_json_names_its_host_and_file():
    from fleetgen.tuning.model_files import weights_bytes_from_headers

    with pytest.raises(ConfigError, match="not valid JSON") as error:
        weights_bytes_from_headers("5 shard 1.safetensors\n{oops\n", "/models/m", host="node0")
    assert (error.value.path, error.value.host) == ("/models/m/shard 1.safetensors", "node0")


def test_a_single_tensor_byte_is_a_weight():
    from fleetgen.tuning.model_files import weights_bytes_from_headers

    assert weights_bytes_from_headers(_header_line("a.safetensors", {"w": {"data_offsets": [7, 8]}}), "/m") == (1, 1)


BASE_SECTIONS = {"config": (0, '{"hidden_size": 8}'), "quant": (100, ""), "index": (100, ""), "headers": (100, "")}


@pytest.mark.parametrize("sections, file, message", [
    ({"config": (0, "{torn")}, "config.json", "not valid JSON: Expecting property name enclosed in double quotes"),
    ({"quant": (1, "cat: Permission denied")}, "hf_quant_config.json",
     "cannot read /models/Qwen3-X/hf_quant_config.json (exit 1): cat: Permission denied"),
    ({"index": (1, "cat: Permission denied")}, "model.safetensors.index.json",
     "cannot read /models/Qwen3-X/model.safetensors.index.json (exit 1): cat: Permission denied"),
    ({"index": (0, "{torn")}, "model.safetensors.index.json",
     "not valid JSON: Expecting property name enclosed in double quotes"),
    ({"index": (0, '{"weight_map": {}}')}, "model.safetensors.index.json",
     "the safetensors index has no numeric metadata.total_size (found None)"),  # profile.py names no host
    ({"headers": (0, "")}, "*.safetensors", "the safetensors files declare no tensor bytes"),
    # no index and no headers either (a node that printed only part): nothing is weighed, not a cut-off header
    ({}, "*.safetensors", "the safetensors files declare no tensor bytes"),
])
def test_each_model_file_that_cannot_be_read_is_named_under_the_folder_whatever_its_trailing_slash(sections, file,
                                                                                                   message):
    """A folder whose name ends in X (as the slash is stripped, nothing else is), given with a trailing slash."""
    from fleetgen.tuning.model_files import parse_model_files

    with pytest.raises((ConfigError, ModelConfigError)) as error:
        parse_model_files(_sections(**{**BASE_SECTIONS, **sections}), "/models/Qwen3-X/", host="node0")
    assert error.value.message == message
    assert error.value.path == f"/models/Qwen3-X/{file}"
    assert error.value.host == (None if "total_size" in message else "node0")


def test_a_headers_error_names_the_host():
    from fleetgen.tuning.model_files import parse_model_files

    broken = _header_line("a.safetensors", {"w": {"data_offsets": [4, 0]}})
    with pytest.raises(ModelConfigError, match="end before they start") as error:
        parse_model_files(_sections(**{**BASE_SECTIONS, "headers": (0, broken)}), "/models/m", host="node0")
    assert (error.value.path, error.value.host) == ("/models/m/a.safetensors", "node0")


@pytest.mark.parametrize("name", ["Qwen3-X", "folder ending in a space "])
def test_a_model_folder_is_read_by_its_exact_name(tmp_path, name):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text('{"hidden_size": 8}')
    (folder / "hf_quant_config.json").write_text('{"quantization": {"quant_algo": "FP8"}}')
    write_safetensors(folder / "model.safetensors", bytes(64))
    found = read_folder(folder)
    assert (found.weights_bytes, found.hf_quant_config) == (64, {"quantization": {"quant_algo": "FP8"}})
    from fleetgen.tuning.model_files import model_file_paths

    assert model_file_paths(f"{folder}/") == (f"{folder}/config.json", f"{folder}/model.safetensors.index.json")
