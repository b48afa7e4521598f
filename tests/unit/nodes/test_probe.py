import pytest

from fleetgen.nodes import probe
from fleetgen.nodes import remote
from fleetgen.errors import ProbeError

# nvidia-smi --query-gpu=index,uuid,name,memory.total,memory.used,memory.free --format=csv,noheader,nounits
GPUS = """0, GPU-3b8d1a2e-5c4f-4b0e-9d7a-1f2e3d4c5b6a, NVIDIA B200, 183359, 160012, 23347
1, GPU-7c6b5a49-3e2d-4f1c-8b0a-9e8d7c6b5a4f, NVIDIA B200, 183359, 21650, 161709
"""
# nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv,noheader,nounits
APPS = """GPU-3b8d1a2e-5c4f-4b0e-9d7a-1f2e3d4c5b6a, 4242, /opt/sglang/bin/python, 159500
GPU-7c6b5a49-3e2d-4f1c-8b0a-9e8d7c6b5a4f, 5151, python3, 21138
"""


def _output(gpus=GPUS, apps=APPS, ours="ours port=30000 pid=4242\n", gpu_rc=0):
    return (f"{remote.SECTION_MARKER}gpus\n{gpus}{remote.SECTION_MARKER}rc={gpu_rc}\n"
            f"{remote.SECTION_MARKER}apps\n{apps}{remote.SECTION_MARKER}rc=0\n"
            f"{remote.SECTION_MARKER}ours\n{ours}{remote.SECTION_MARKER}rc=0\n")


def test_inventory_marks_ours_and_foreign():
    inventory = probe.parse_probe_output(_output(), host="node0")
    gpu0, gpu1 = inventory["gpus"]
    assert (gpu0["total_mib"], gpu0["used_mib"], gpu0["free_mib"]) == (183359, 160012, 23347)
    assert gpu0["processes"] == [{"pid": 4242, "process_name": "/opt/sglang/bin/python", "used_mib": 159500,
                                  "ours": True, "port": 30000}]
    assert gpu1["processes"][0]["ours"] is False
    assert "GPU 1 NVIDIA B200" in probe.format_inventory(inventory)


def test_units_and_no_processes():
    gpus = probe.parse_gpu_csv("0, GPU-a, NVIDIA H100 80GB HBM3, 81559 MiB, 4 MiB, 81075 MiB\n", host="h")
    assert gpus[0]["free_mib"] == 81075
    assert probe.parse_apps_csv("", host="h") == []


@pytest.mark.parametrize("gpus, message", [
    ("0, GPU-a, NVIDIA B200, 183359, 1\n", "expected 6 fields"),
    ("x, GPU-a, NVIDIA B200, 183359, 1, 2\n", "GPU index 'x'"),
    ("", "listed no GPUs"),
])
def test_bad_gpu_csv_names_host_and_line(gpus, message):
    with pytest.raises(ProbeError) as error:
        probe.parse_probe_output(_output(gpus=gpus), host="node7")
    assert message in str(error.value) and "host node7" in str(error.value)


def test_nvidia_smi_failure():
    with pytest.raises(ProbeError, match="nvidia-smi failed .exit 9."):
        probe.parse_probe_output(_output(gpus="NVIDIA-SMI has failed\n", gpu_rc=9), host="n")


def test_select_gpus_missing_index():
    inventory = probe.parse_probe_output(_output(), host="n")
    with pytest.raises(ProbeError, match=r"names GPU\(s\) \[5\]"):
        probe.select_gpus(inventory, [0, 5])


BROKEN = GPUS.replace("21650, 161709", "[GPU requires reset], [GPU requires reset]").replace(
    "183359, [GPU", "[GPU requires reset], [GPU")


def test_a_gpu_that_requires_reset_is_refused_naming_host_and_gpu_with_what_to_do():
    with pytest.raises(ProbeError) as error:
        probe.select_gpus(probe.parse_probe_output(_output(gpus=BROKEN), host="node7"), [0, 1])
    assert str(error.value).startswith("[host node7] GPU 1 (GPU-7c6b5a49-3e2d-4f1c-8b0a-9e8d7c6b5a4f): nvidia-smi "
                                       "reports memory.total as '[GPU requires reset]'")
    assert "`nvidia-smi --gpu-reset -i 1`" in error.value.hint and "reboot node7" in error.value.hint
    assert "leave GPU 1 out of the node's gpus / tp_groups in the fleet file" in error.value.hint


def test_a_broken_gpu_the_fleet_leaves_out_does_not_stop_the_probe():
    inventory = probe.parse_probe_output(_output(gpus=BROKEN, apps=APPS.replace("21138", "[GPU requires reset]")),
                                         host="node7")
    assert [gpu["index"] for gpu in probe.select_gpus(inventory, [0])] == [0]
    assert inventory["gpus"][1]["processes"][0]["used_mib"] == 0
    assert "GPU 1 NVIDIA B200: unusable, nvidia-smi reports memory.total as [GPU requires reset]" in (
        probe.format_inventory(inventory))


@pytest.mark.parametrize("value, advice", [
    ("[N/A]", "check the driver and MIG mode"),
    ("[Not Supported]", "check the driver and MIG mode"),
    ("[Unknown Error]", "Xid errors in `dmesg`"),
])
def test_every_bracketed_nvidia_smi_value_names_the_gpu_and_says_what_to_do(value, advice):
    gpus = f"0, GPU-a, NVIDIA B200, 183359, {value}, {value}\n"
    with pytest.raises(ProbeError) as error:
        probe.select_gpus(probe.parse_probe_output(_output(gpus=gpus, apps=""), host="n"), [0])
    assert f"GPU 0 (GPU-a): nvidia-smi reports memory.used as '{value}'" in str(error.value)
    assert advice in error.value.hint and "leave GPU 0 out" in error.value.hint
