"""The model directory on the node: ``config.json`` and the safetensors index, read over SSH.

The tuner needs the model's shape (config) and the size of its weights (index metadata); both are
read on the first node, where the servers will load them, so the plan sizes what will really run.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from fleetgen.errors import ConfigError
from fleetgen.nodes import remote
from fleetgen.tuning.profile import weights_bytes_from_index


def model_file_paths(model_path: str) -> tuple[str, str]:
    root = model_path.rstrip("/")
    return f"{root}/config.json", f"{root}/model.safetensors.index.json"


def read_model(read_text: Callable[[str], str], model_path: str, *, host: str) -> tuple[dict, int]:
    """(config, weights bytes) from the model directory; ``read_text(path)`` returns a file's text."""
    index_path = model_file_paths(model_path)[1]
    config = read_model_config(read_text, model_path, host=host)
    return config, weights_bytes_from_index(_read_json(read_text, index_path, host), path=index_path)


def read_model_config(read_text: Callable[[str], str], model_path: str, *, host: str) -> dict:
    """The model's ``config.json`` (all the prompt scan needs: the model's context length)."""
    return _read_json(read_text, model_file_paths(model_path)[0], host)


def _read_json(read_text: Callable[[str], str], path: str, host: str):
    try:
        return json.loads(read_text(path))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"not valid JSON: {exc.msg}", host=host, path=path, line=exc.lineno,
                          hint="check the model directory named by model.path in the fleet description") from None


def model_identity(run: Callable[[str], str], model_path: str) -> dict:
    """What identifies the model the servers load: its path and the SHA-256 of its config and index,
    computed on the node (``run(command)`` returns a remote command's output)."""
    config_path, index_path = model_file_paths(model_path)
    config_sha256, index_sha256 = remote.parse_sha256(run(remote.sha256_command([config_path, index_path])))
    return {"path": model_path, "config_sha256": config_sha256, "index_sha256": index_sha256}
