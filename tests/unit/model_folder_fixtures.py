"""A single-file model checkpoint for the tests of tuning/model_files.py (test_model_files.py, test_model_identity.py)."""

import json
import struct
from pathlib import Path

import pytest

from fleetgen.tuning.model_files import WEIGHT_SAMPLE_BYTES, WEIGHT_SAMPLES

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
