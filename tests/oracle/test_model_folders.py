"""Simulated model folders carry the tokenizer files real ones have, loadable by the transformers release
SGLang 0.5.23 pins (what SGLang's tokenizer manager and a router read from a model folder)."""

import json
import subprocess

from oracle_harness import ORACLE, VENV_PYTHON, require_venv
from sglang_sim.presets import install_model, preset_names

LOAD = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import sglang_oracle
sglang_oracle._install_stubs()
# what SGLang's own processes load a tokenizer with: its config classes registered with AutoConfig
# (utils/hf_transformers/common.py), so a model type only SGLang knows (jet_nemotron) is read by its class
import sglang.srt.utils.hf_transformers.common
from transformers import AutoConfig, AutoTokenizer
out = {}
for path in json.load(sys.stdin):
    tokenizer = AutoTokenizer.from_pretrained(path)
    ids = tokenizer("The capital city of France is").input_ids
    out[path] = {"eos": tokenizer.eos_token_id, "round_trip": tokenizer.decode(ids),
                 "chat": tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                                       add_generation_prompt=True)}
print(json.dumps(out))
"""


def test_every_preset_folder_has_a_loadable_tokenizer(tmp_path):
    require_venv()
    folders = {name: install_model(tmp_path / name, name, 10**9) for name in preset_names()}
    for folder in folders.values():
        assert (folder / "tokenizer.json").is_file() and (folder / "tokenizer_config.json").is_file()
    done = subprocess.run([str(VENV_PYTHON), "-c", LOAD, str(ORACLE.parent)], input=json.dumps([str(f) for f in folders.values()]),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    for name, folder in folders.items():
        config = json.loads((folder / "config.json").read_text())
        eos = config.get("eos_token_id", config.get("text_config", {}).get("eos_token_id"))
        result = loaded[str(folder)]
        assert result["round_trip"] == "The capital city of France is", name
        assert result["eos"] == (eos[0] if isinstance(eos, list) else eos if eos is not None else 256), name
        assert result["chat"].endswith("assistant\n"), name
