"""``--config FILE`` (how fleetgen hands SGLang the API key) merged by the simulator exactly as by SGLang
0.5.23's own ``ConfigArgumentMerger`` (sglang/srt/utils/server_args_config_parser.py).

SGLang's full install brings PyYAML through its dependency tree; the CPU venv installs sglang without
dependencies, so this test lends it this environment's PyYAML (same interpreter version) on PYTHONPATH.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from fleetgen.nodes.remote import api_key_config
from sglang_sim.args import build_parser, merge_config_file

REPO = Path(__file__).resolve().parents[2]
VENV_PYTHON = Path(os.environ.get("FLEETGEN_SGLANG_VENV", REPO / ".sglang-venv")) / "bin" / "python"

# Runs inside the SGLang venv: merge each argv's --config like prepare_server_args, then parse.
MERGE_SCRIPT = r"""
import argparse, contextlib, io, json, sys
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger
results = []
for argv in json.load(sys.stdin):
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    try:
        merged = ConfigArgumentMerger(parser).merge_config_with_args(argv)
    except ValueError as error:
        results.append({"error": str(error)})
        continue
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            values = vars(parser.parse_args(merged))
        results.append({"merged": merged, "values": {k: values[k] for k in
                        ("api_key", "port", "disable_radix_cache", "mem_fraction_static", "cuda_graph_bs_decode")}})
    except SystemExit:
        results.append({"merged": merged, "parse_error": err.getvalue().strip().splitlines()[-1]})
print(json.dumps(results))
"""

KEY = "sk-9f: #not a comment 'q' \"d\" true"


def _cases(tmp_path: Path) -> list[list[str]]:
    def write(name: str, text: str) -> str:
        (tmp_path / name).write_text(text)
        return str(tmp_path / name)

    model = ["--model-path", "/models/m"]
    key_file = write("key.yaml", api_key_config(KEY))
    return [
        model + ["--port", "7", "--config", key_file],                      # the key, as fleetgen writes it
        ["--config", write("port.yml", "port: 5\napi-key: a\n")] + model + ["--port", "7"],  # the command line wins
        model + ["--config", write("snake.yaml", "api_key: x\n")],                       # keys are flags as written
        model + ["--config", write("switches.yaml", "disable-radix-cache: true\nmem-fraction-static: 0.81\n"
                                                     "cuda-graph-bs-decode: [1, 2, 4]\n")],
        model + ["--config", write("empty.yaml", "")],
        model + ["--config", write("list.yaml", "- a\n- b\n")],
        model + ["--config", write("key.txt", "port: 1\n")],
        model + ["--config", str(tmp_path / "absent.yaml")],
        model + ["--config", key_file, "--config", key_file],
        model + ["--config"],
    ]


def _with_sglang(argvs: list[list[str]], tmp_path: Path) -> list[dict]:
    if not VENV_PYTHON.exists():
        if os.environ.get("CI"):
            pytest.fail(f"no SGLang venv at {VENV_PYTHON.parent.parent}: scripts/sglang-venv.sh did not run")
        pytest.skip(f"no SGLang venv at {VENV_PYTHON.parent.parent}; build it with scripts/sglang-venv.sh")
    lent = tmp_path / "lent-site"
    lent.mkdir()
    site = Path(yaml.__file__).parent.parent
    for name in ("yaml", "_yaml"):
        if (site / name).exists():
            (lent / name).symlink_to(site / name)
    done = subprocess.run([str(VENV_PYTHON), "-c", MERGE_SCRIPT], input=json.dumps(argvs), capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(lent)})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _with_simulator(argv: list[str], capsys) -> dict:
    parser = build_parser()
    try:
        merged = merge_config_file(parser, argv)
    except ValueError as error:
        return {"error": str(error)}
    try:
        values = vars(parser.parse_args(merged))
    except SystemExit:
        return {"merged": merged, "parse_error": capsys.readouterr().err.strip().splitlines()[-1]}
    return {"merged": merged, "values": {k: values[k] for k in
                                         ("api_key", "port", "disable_radix_cache", "mem_fraction_static",
                                          "cuda_graph_bs_decode")}}


@pytest.mark.slow
def test_simulator_merges_config_files_like_sglang(tmp_path, capsys):
    argvs = _cases(tmp_path)
    sglang = _with_sglang(argvs, tmp_path)
    simulator = [_with_simulator(argv, capsys) for argv in argvs]
    for argv, real, ours in zip(argvs, sglang, simulator):
        assert ours == real, argv
    assert sglang[0]["values"]["api_key"] == KEY and sglang[0]["values"]["port"] == 7
    assert sglang[1]["values"]["port"] == 7 and sglang[1]["values"]["api_key"] == "a"
    assert "unrecognized arguments: --api_key x" in sglang[2]["parse_error"]
    assert [r.get("error", "")[:22] for r in sglang[5:]] == ["Config file must conta", "Config file must be YA",
                                                             "Config file not found:", "Multiple config files ",
                                                             "No config file specifi"]
