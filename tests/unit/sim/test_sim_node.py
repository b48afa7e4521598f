"""Node directory contract, settings validation, model presets and fault files."""

import json
import os

import pytest

from sglang_sim.errors import SimConfigError
from sglang_sim.faults import Faults, read_faults
from sglang_sim.node import NODE_ENV, SimNode, SimSettings, create_node, write_faults
from sglang_sim.presets import install_model, preset_names


def test_create_node_layout_and_reload(tmp_path):
    node = create_node(tmp_path / "n", name="node3", gpus=[("NVIDIA H100 80GB HBM3", 81559)] * 2,
                       sim={"time_scale": 50})
    data = json.loads((tmp_path / "n" / "node.json").read_text())
    assert data["name"] == "node3"
    assert data["gpus"][1] == {"index": 1, "name": "NVIDIA H100 80GB HBM3", "total_mib": 81559,
                               "uuid": node.gpus[1].uuid}
    assert data["sim"]["time_scale"] == 50 and data["sim"]["load_seconds"] == SimSettings().load_seconds
    assert node.gpus[0].uuid.startswith("GPU-") and node.gpus[0].uuid != node.gpus[1].uuid
    assert os.access(tmp_path / "n" / "bin" / "nvidia-smi", os.X_OK)
    assert (tmp_path / "n" / "state" / "gpu1").is_dir() and (tmp_path / "n" / "faults").is_dir()
    assert SimNode.load(tmp_path / "n") == node
    # the same name gives the same UUIDs: a recreated node looks like the same machine
    assert create_node(tmp_path / "again", name="node3", gpus=2).gpus[0].uuid == node.gpus[0].uuid


def test_env_puts_the_node_first(tmp_path):
    node = create_node(tmp_path / "n", name="n", gpus=1)
    env = node.env()
    assert env[NODE_ENV] == str(node.path)
    assert env["PATH"].split(os.pathsep)[0] == str(node.path / "bin")


def test_gpu_memory_report(tmp_path):
    node = create_node(tmp_path / "n", name="n", gpus=2, total_mib=1000, sim={"driver_baseline_mib": 10})
    node.set_holder(0, os.getpid(), "python", 300)
    report = node.gpu_memory()
    assert report[0]["used_mib"] == 310 and report[0]["free_mib"] == 690
    assert report[0]["processes"] == [{"pid": os.getpid(), "process_name": "python", "used_mib": 300}]
    assert report[1]["used_mib"] == 10 and report[1]["processes"] == []


def test_settings_are_validated(tmp_path):
    with pytest.raises(SimConfigError, match="unknown sim settings"):
        create_node(tmp_path / "n", name="n", gpus=1, sim={"time_scael": 2})
    with pytest.raises(SimConfigError, match="time_scale"):
        SimSettings.from_dict({"time_scale": 0})
    with pytest.raises(SimConfigError, match="not a simulated node"):
        SimNode.load(tmp_path / "missing")


def test_faults_round_trip_and_validation(tmp_path):
    node = create_node(tmp_path / "n", name="n", gpus=1)
    path = write_faults(node, 30001, {"speed": 0.7, "crash_after_requests": 3})
    assert path == node.faults_path(30001)
    assert read_faults(node.path, 30001) == Faults(speed=0.7, crash_after_requests=3)
    assert read_faults(node.path, 30002) == Faults()
    with pytest.raises(SimConfigError, match="unknown fault keys"):
        write_faults(node, 30001, {"crash_after": 3})
    with pytest.raises(SimConfigError, match="fail_at_launch"):
        write_faults(node, 30001, {"fail_at_launch": "segfault"})
    path.write_text("{not json")
    with pytest.raises(SimConfigError) as err:
        read_faults(node.path, 30001)
    assert err.value.path == str(path) and err.value.line == 1


def test_install_model_writes_config_and_index(tmp_path):
    assert {"qwen3.6-27b", "llama3.1-8b", "qwen3-next-80b-a3b"} <= set(preset_names())
    dest = install_model(tmp_path / "m")
    index = json.loads((dest / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == 54_000_000_000
    shards = set(index["weight_map"].values())
    assert len(shards) == 11 and "model-00011-of-00011.safetensors" in shards
    assert any(name.startswith("mtp.") for name in index["weight_map"])
    config = json.loads((dest / "config.json").read_text())
    assert config["text_config"]["full_attention_interval"] == 4
    llama = install_model(tmp_path / "l", "llama3.1-8b", weights_bytes=16_060_522_496)
    assert json.loads((llama / "model.safetensors.index.json").read_text())["metadata"]["total_size"] \
        == 16_060_522_496
    with pytest.raises(SimConfigError, match="unknown model preset"):
        install_model(tmp_path / "x", "gpt-9")


def test_cuda_visible_devices_pick_the_server_gpus(tmp_path, monkeypatch, tools):
    from sglang_sim.args import parse_args
    from sglang_sim.resolve import LaunchError, resolve_launch
    from sglang_sim.server import _visible_gpus

    node = create_node(tmp_path / "n", name="n", gpus=4)
    model = tools.preset("qwen3.6-27b")

    def gpus(visible, *flags):
        launch = resolve_launch(parse_args(["--model-path", "m", *flags]), model, [tools.B200_MIB] * 4)
        if visible is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        return _visible_gpus(node, launch, 0, 1)

    assert gpus("2") == [2]
    assert gpus("3,1", "--tp", "2") == [3, 1]
    assert gpus(node.gpus[2].uuid) == [2]
    assert gpus(None, "--tp", "4") == [0, 1, 2, 3]
    assert gpus("0,1,2") == [0]  # more visible than needed: the first ones, as CUDA numbers them
    with pytest.raises(LaunchError, match="invalid device ordinal"):
        gpus("1", "--tp", "2")
