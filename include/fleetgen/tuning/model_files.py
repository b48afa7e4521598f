"""The model directory on the node: its config, quantization and weight bytes, read over SSH in one round trip.

The tuner needs the model's shape (config.json, as SGLang's transformers config class completes it), the
checkpoint's quantization (``quantization_config`` in config.json, or ModelOpt's ``hf_quant_config.json``) and the
size of its weights: the safetensors index's ``metadata.total_size`` or, for a checkpoint without an index (a
single ``model.safetensors``, or shards shipped without one), the tensor bytes its safetensors headers declare.
All of it is read on the first node, where the servers will load it; no weight byte crosses the network.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass

from fleetgen.errors import ConfigError, ModelConfigError
from fleetgen.nodes import remote
from fleetgen.tuning.hf_config import as_sglang_reads
from fleetgen.tuning.profile import weights_bytes_from_index

INDEX_FILE = "model.safetensors.index.json"
# ModelOpt exports keep their quantization beside config.json (configs/model_config.py::_parse_quant_hf_config).
QUANT_CONFIG_FILE = "hf_quant_config.json"
# A safetensors header is at most 100 MB (the format's own limit in the safetensors library).
SAFETENSORS_HEADER_MAX_BYTES = 100_000_000
_ABSENT = 100  # exit status of a section whose file does not exist
_FILES_HINT = "check the model directory named by model.path in the fleet description"


@dataclass(frozen=True)
class ModelFiles:
    """What the tuner reads from the model directory."""

    config: dict                  # config.json with the defaults SGLang's config class fills in
    weights_bytes: int
    hf_quant_config: dict | None  # hf_quant_config.json, None when the checkpoint has none
    weights_source: str           # the index file, or how many safetensors headers were summed


def model_file_paths(model_path: str) -> tuple[str, str]:
    root = model_path.rstrip("/")
    return f"{root}/config.json", f"{root}/{INDEX_FILE}"


def model_files_command(model_path: str) -> str:
    """One command printing config.json, hf_quant_config.json, the index and, when there is no index, every
    ``*.safetensors`` header (a ``<header bytes> <file name>`` line, then the header): parse with
    :func:`parse_model_files`."""
    root = model_path.rstrip("/")
    config_path, index_path = model_file_paths(model_path)
    quant_path = f"{root}/{QUANT_CONFIG_FILE}"

    def optional(path: str) -> str:
        return f"[ -e {remote.quote_path(path)} ] || exit {_ABSENT}; {remote.read_file_command(path)}"

    # The 8-byte little-endian header length, read byte by byte (od prints them in file order), then the header;
    # tail -c +9 seeks on a regular file, so only the header is read.
    headers = (f"[ -e {remote.quote_path(index_path)} ] && exit {_ABSENT}; cd -- {remote.quote_path(root)} || exit 4; "
               "found=0; for f in *.safetensors; do [ -f \"$f\" ] || continue; found=1; "
               "set -- $(od -An -tu1 -N8 -- \"$f\"); "
               "if [ $# -ne 8 ]; then printf '%s is shorter than a safetensors header\\n' \"$f\"; exit 6; fi; "
               "n=$(( $1 | $2 << 8 | $3 << 16 | $4 << 24 | $5 << 32 | $6 << 40 | $7 << 48 | $8 << 56 )); "
               f"if [ \"$n\" -le 0 ] || [ \"$n\" -gt {SAFETENSORS_HEADER_MAX_BYTES} ]; then "
               "printf '%s declares a header of %s bytes\\n' \"$f\" \"$n\"; exit 6; fi; "
               "printf '%s %s\\n' \"$n\" \"$f\"; tail -c +9 -- \"$f\" | head -c \"$n\"; printf '\\n'; done; "
               "if [ $found = 0 ]; then printf 'no %s and no *.safetensors file\\n' "
               f"{remote.quote(INDEX_FILE)}; exit 7; fi")
    def captured(command: str) -> str:
        # errors join the section's text; a file without a final newline still ends before the status marker
        return f"{{ {command}; }} 2>&1; status=$?; echo; exit $status"

    return remote.sections_command({"config": captured(remote.read_file_command(config_path)),
                                    "quant": captured(optional(quant_path)), "index": captured(optional(index_path)),
                                    "headers": captured(headers)})


def parse_model_files(output: str, model_path: str, *, host: str | None) -> ModelFiles:
    """The :class:`ModelFiles` in the output of :func:`model_files_command`."""
    root = model_path.rstrip("/")
    config_path, index_path = model_file_paths(model_path)
    sections = remote.split_sections(output)

    def section(name: str, path: str) -> str | None:
        status, text = sections.get(name, (None, ""))
        if status == _ABSENT:
            return None
        if status != 0:
            raise ConfigError(f"cannot read {path} (exit {status}): {text.strip()[-500:]}", host=host, path=path,
                              hint=_FILES_HINT)
        return text

    config = as_sglang_reads(_parse_json(section("config", config_path), config_path, host), path=config_path,
                             host=host)
    quant_path = f"{root}/{QUANT_CONFIG_FILE}"
    quant_text = section("quant", quant_path)
    quant = _parse_json(quant_text, quant_path, host) if quant_text is not None else None
    index_text = section("index", index_path)
    if index_text is not None:
        weights = weights_bytes_from_index(_parse_json(index_text, index_path, host), path=index_path)
        return ModelFiles(config, weights, quant, INDEX_FILE)
    headers = section("headers", f"{root}/*.safetensors")
    total, files = weights_bytes_from_headers(headers or "", root, host=host)
    return ModelFiles(config, total, quant, f"{files} safetensors header(s)")


def weights_bytes_from_headers(text: str, root: str, *, host: str | None = None) -> tuple[int, int]:
    """(tensor bytes, files) from the headers the command printed: each tensor's ``data_offsets`` span, which
    safetensors checks against its dtype and shape; the ``__metadata__`` entry holds none."""
    lines = text.split("\n")
    total = files = 0
    position = 0
    while position < len(lines):
        line = lines[position]
        position += 1
        if not line.strip():
            continue
        length, _, name = line.partition(" ")
        path = f"{root}/{name}"
        if position >= len(lines):
            raise ModelConfigError("the safetensors header was cut short", path=path, host=host)
        header = _parse_json(lines[position], path, host)
        position += 1
        try:
            spans = [int(entry["data_offsets"][1]) - int(entry["data_offsets"][0])
                     for key, entry in header.items() if key != "__metadata__"]
        except (AttributeError, KeyError, IndexError, TypeError, ValueError):
            raise ModelConfigError("the safetensors header has a tensor without numeric data_offsets",
                                   path=path, host=host, hint=_FILES_HINT) from None
        if any(span < 0 for span in spans):
            raise ModelConfigError("the safetensors header has a tensor whose data_offsets end before they start",
                                   path=path, host=host, hint=_FILES_HINT)
        total += sum(spans)
        files += 1
    if total <= 0:
        raise ModelConfigError("the safetensors files declare no tensor bytes", path=f"{root}/*.safetensors",
                               host=host, hint=_FILES_HINT)
    return total, files


def read_model(run: Callable[[str], str], model_path: str, *, host: str | None) -> ModelFiles:
    """The model directory's :class:`ModelFiles`; ``run(command)`` returns a command's output on the node."""
    return parse_model_files(run(model_files_command(model_path)), model_path, host=host)


def read_model_config(read_text: Callable[[str], str], model_path: str, *, host: str) -> dict:
    """The model's config as SGLang reads it (all the prompt scan needs: the model's context length)."""
    path = model_file_paths(model_path)[0]
    return as_sglang_reads(_read_json(read_text, path, host), path=path, host=host)


def _parse_json(text: str, path: str, host: str | None):
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"not valid JSON: {exc.msg}", host=host, path=path, line=exc.lineno,
                          hint=_FILES_HINT) from None


def _read_json(read_text: Callable[[str], str], path: str, host: str):
    return _parse_json(read_text(path), path, host)


# What identifies the model, beside its weights (docs/output-formats.md §3.9): the files that change the text it
# writes, as Hugging Face checkpoints name them. tokenizer_config.json's chat template counts as the chat template.
CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
                   "added_tokens.json", "vocab.json", "vocab.txt", "merges.txt", "tiktoken.model")
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
# How the identity reads the weights (the weights_hash DAG parameter): reading every byte takes minutes on a large
# checkpoint (bench/model_identity.py), headers and samples well under a second.
WEIGHTS_HASHES = ("header", "full")
IDENTITY_TIMEOUT_S = dict(zip(WEIGHTS_HASHES, (120.0, 3600.0)))
# Besides its header, 16 blocks of 64 KiB of each safetensors file's tensors (1 MiB a file) are hashed: weights
# retrained to the same shapes have the same header, and change (nearly) every block.
WEIGHT_SAMPLES, WEIGHT_SAMPLE_BYTES = 16, 64 * 1024


def _flag_value(extra_args, flag: str) -> str | None:
    args = [str(arg) for arg in extra_args]
    for position, arg in enumerate(args):
        if arg == flag and position + 1 < len(args):
            return args[position + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def model_identity(run: Callable[[str, float], str], model_path: str, *, python: str, module: str,
                   extra_args=(), weights_hash: str = "header", host: str | None = None) -> dict:
    """What identifies the text the servers will write, read on the node in one SSH round trip (no weight
    crosses the network): ``{"path", "weights_hash", "weight_files", "weight_bytes", "parts"}``; ``parts`` holds
    one digest per thing a change of which stops reuse: ``path``, ``weights`` (each safetensors file's size,
    header and sampled blocks of its tensors, and the index; with ``weights_hash="full"`` also
    ``weights_content``, every byte), ``config``, ``generation_config``, ``tokenizer``, ``chat_template``
    (tokenizer_config.json's, the template files, a ``--chat-template`` file), ``launch_args`` (the fleet's
    extra SGLang flags) and ``sglang`` (its version).
    ``run(command, timeout_s)`` returns a remote command's output."""
    if weights_hash not in IDENTITY_TIMEOUT_S:
        raise ConfigError(f"unknown weights hash {weights_hash!r}; expected one of {sorted(IDENTITY_TIMEOUT_S)}")
    template_arg = _flag_value(extra_args, "--chat-template")
    tokenizer_root = _flag_value(extra_args, "--tokenizer-path") or model_path
    command = remote.sections_command({
        "identity": remote.model_identity_command(
            python, model_path, tokenizer_root=tokenizer_root,
            small_files=(CONFIG_FILE, GENERATION_CONFIG_FILE, *CHAT_TEMPLATE_FILES),
            tokenizer_files=TOKENIZER_FILES, template_file=template_arg or "", full=weights_hash == "full",
            samples=WEIGHT_SAMPLES, sample_bytes=WEIGHT_SAMPLE_BYTES),
        "sglang": remote.package_version_command(python, module)})
    sections = remote.split_sections(run(command, IDENTITY_TIMEOUT_S[weights_hash]))
    hint = "check the model directory named by model.path in the fleet description and server.python"
    status, output = sections.get("identity", (None, ""))
    try:
        found = json.loads(output.strip().splitlines()[-1]) if status == 0 and output.strip() else None
    except ValueError:
        found = None
    if found is None:
        raise ConfigError(f"cannot read the model's identity (exit {status}): {output.strip()[-500:]}",
                          host=host, path=model_path, hint=hint)
    problems = {**found["unreadable"], **({CONFIG_FILE: "missing"} if CONFIG_FILE not in found["files"] else {})}
    if problems:
        first = sorted(problems)[0]
        raise ConfigError(f"cannot read {first} of the model: {problems[first]}"
                          + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""),
                          host=host, path=f"{model_path.rstrip('/')}/{first}", hint=hint)
    version_status, version = sections.get("sglang", (None, ""))
    if version_status != 0 or not version.strip():
        raise ConfigError(f"cannot read the SGLang version for {python} (exit {version_status})", host=host,
                          hint="check server.python and server.module in the fleet description")
    files, tokenizer, weights = found["files"], found["tokenizer"], found["weights"]
    parts = {"path": model_path,
             "weights": _digest({"files": {name: [entry["bytes"], entry["sampled_sha256"]]
                                           for name, entry in weights.items()},
                                 "indexes": {name: digest for name, digest in files.items()
                                             if name.endswith(".safetensors.index.json")}}),
             "config": files[CONFIG_FILE],
             "generation_config": files.get(GENERATION_CONFIG_FILE, "absent"),
             "tokenizer": _digest({"root": tokenizer_root, "files": tokenizer["files"]}),
             "chat_template": _digest({"tokenizer_config.json": tokenizer["chat_template"],
                                       **{name: files.get(name) for name in CHAT_TEMPLATE_FILES},
                                       "--chat-template": found["template_file"] or template_arg}),
             "launch_args": _digest([str(arg) for arg in extra_args]),
             "sglang": version.strip().splitlines()[-1]}
    if weights_hash == "full":
        parts["weights_content"] = _digest({name: entry["sha256"] for name, entry in weights.items()})
    return {"path": model_path, "weights_hash": weights_hash, "weight_files": len(weights),
            "weight_bytes": sum(entry["bytes"] for entry in weights.values()), "parts": parts}
