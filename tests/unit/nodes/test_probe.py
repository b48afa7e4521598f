import os
import subprocess
import sys

import pytest

from fleetgen.nodes import probe
from fleetgen.nodes import remote
from fleetgen.errors import ProbeError
from sglang_sim.node import create_node

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


def test_a_process_carrying_our_launch_marker_is_ours_though_the_pid_file_names_its_parent():
    # SGLang's scheduler, a child of the server the pid file names, holds the GPU memory
    output = _output() + (f"{remote.SECTION_MARKER}marked\nmarked port=30001 pid=9000\nmarked port=30001 pid=5151\n"
                          f"{remote.SECTION_MARKER}rc=0\n")
    inventory = probe.parse_probe_output(output, host="node0")
    assert [(p["pid"], p["ours"], p["port"]) for gpu in inventory["gpus"] for p in gpu["processes"]] == [
        (4242, True, 30000), (5151, True, 30001)]


def test_the_probe_asks_which_processes_carry_our_marker():
    command = probe.probe_command(run_dir="/r", module="m", ports=[30000])
    assert remote.marked_pids_command(run_dir="/r", ports=[30000]) in command


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


# Two GPUs listed out of index order, three processes on GPU 0 (two of ours, one foreign) listed out of pid
# order, one on GPU 1, and one (second) on a GPU the query did not list.
SEVERAL_GPUS = """1, GPU-b, NVIDIA H200, 143771, 100512, 43259
0, GPU-a, NVIDIA H200, 143771, 120300, 23471
"""
SEVERAL_APPS = """GPU-a, 9001, python3, 60000
GPU-z, 1234, elsewhere, 5
GPU-a, 4242, /opt/sglang/bin/python, 50000
GPU-b, 7000, python3, 100000
GPU-a, 5151, foreign-trainer, 10000
"""
SEVERAL_OURS = "ours port=30000 pid=4242\nours port=30001 pid=7000\nours port=30002 pid=9001\n"


def test_several_processes_on_several_gpus_each_land_on_their_own_gpu_in_pid_order():
    inventory = probe.parse_probe_output(_output(gpus=SEVERAL_GPUS, apps=SEVERAL_APPS, ours=SEVERAL_OURS), host="n")
    assert inventory["host"] == "n" and [gpu["index"] for gpu in inventory["gpus"]] == [0, 1]
    gpu0, gpu1 = inventory["gpus"]
    assert gpu0["processes"] == [
        {"pid": 4242, "process_name": "/opt/sglang/bin/python", "used_mib": 50000, "ours": True, "port": 30000},
        {"pid": 5151, "process_name": "foreign-trainer", "used_mib": 10000, "ours": False, "port": None},
        {"pid": 9001, "process_name": "python3", "used_mib": 60000, "ours": True, "port": 30002}]
    assert gpu1["processes"] == [{"pid": 7000, "process_name": "python3", "used_mib": 100000, "ours": True,
                                  "port": 30001}]
    assert (gpu1["uuid"], gpu1["name"], gpu1["total_mib"], gpu1["used_mib"], gpu1["free_mib"]) == (
        "GPU-b", "NVIDIA H200", 143771, 100512, 43259)


def test_memory_stays_in_mib_with_or_without_the_unit():
    gpus = probe.parse_gpu_csv("0, GPU-a, NVIDIA H100, 81559 MiB, 4 MiB, 81075MiB\n", host="h")
    assert (gpus[0]["total_mib"], gpus[0]["used_mib"], gpus[0]["free_mib"]) == (81559, 4, 81075)
    apps = probe.parse_apps_csv("GPU-a, 77, python3, 1024 MiB\n", host="h")
    assert apps == [{"gpu_uuid": "GPU-a", "pid": 77, "process_name": "python3", "used_mib": 1024}]


@pytest.mark.parametrize("apps", ["No running processes found\n", "no running compute processes found\n", "\n"])
def test_no_running_processes_is_an_empty_list(apps):
    assert probe.parse_apps_csv(apps, host="h") == []


def test_the_no_running_processes_line_is_skipped_not_taken_for_the_end():
    assert [app["pid"] for app in probe.parse_apps_csv("No running processes found\nGPU-a, 5, python3, 10\n",
                                                       host="h")] == [5]


def test_empty_csv_rows_are_skipped():
    assert [gpu["index"] for gpu in probe.parse_gpu_csv("0, GPU-a, B200, 10, 1, 9\n,,,,,\n\n1, GPU-b, B200, 10, 1, 9\n",
                                                        host="h")] == [0, 1]


@pytest.mark.parametrize("gpus, message, line", [
    ("0, GPU-a, B200, 183359, 1, 183358\n1, GPU-b, B200, 183359, 1\n", "expected 6 fields", 2),
    ("0, GPU-a, B200, 183359, 1, 183358\n1, GPU-b, B200, 183359, lots, 183358\n",
     "cannot read memory.used from 'lots'", 2),
    ("0, GPU-a, B200, many, 1, 183358\n", "cannot read memory.total from 'many'", 1),
    ("0, GPU-a, B200, 183359, 1, 1.5\n", "cannot read memory.free from '1.5'", 1),
    ("0, GPU-a, B200, [183359, 1, 2\n", "cannot read memory.total from '[183359'", 1),
    ("0, GPU-a, B200, 183359, 1, 2\nx, GPU-b, B200, 183359, 1, 2\n", "GPU index 'x' is not an integer", 2),
])
def test_an_unreadable_gpu_line_is_named_by_its_line_number(gpus, message, line):
    with pytest.raises(ProbeError) as error:
        probe.parse_gpu_csv(gpus, host="node3")
    assert message in error.value.message and error.value.line == line and error.value.host == "node3"


def test_a_gpu_line_with_too_few_fields_lists_what_was_expected_and_what_came():
    with pytest.raises(ProbeError) as error:
        probe.parse_gpu_csv("0, GPU-a, B200\n", host="h")
    assert error.value.message == ("expected 6 fields (index, uuid, name, memory.total, memory.used, memory.free), "
                                   "got 3: 0, GPU-a, B200")


@pytest.mark.parametrize("apps, message, line", [
    ("GPU-a, 1, python3, 10\nGPU-a, 2, python3\n", "expected 4 fields (gpu_uuid, pid, process_name, used_memory), "
                                                   "got 3", 2),
    ("GPU-a, x1, python3, 10\n", "pid 'x1' is not an integer", 1),
    ("GPU-a, 1, python3, 10\nGPU-a, 2, python3, ten\n", "cannot read used_memory from 'ten'", 2),
    ("GPU-a, 1, python3, 100]\n", "cannot read used_memory from '100]'", 1),
    ("nvidia-smi: warning\n", "expected 4 fields (gpu_uuid, pid, process_name, used_memory), got 1", 1),
])
def test_an_unreadable_process_line_is_named_by_its_line_number(apps, message, line):
    with pytest.raises(ProbeError) as error:
        probe.parse_probe_output(_output(apps=apps), host="node4")
    assert error.value.message == message and error.value.line == line and error.value.host == "node4"


def test_no_gpus_at_all_asks_whether_the_driver_is_loaded():
    with pytest.raises(ProbeError) as error:
        probe.parse_gpu_csv("\n", host="node5")
    assert error.value.message == "nvidia-smi listed no GPUs" and error.value.host == "node5"
    assert error.value.hint == "is the driver loaded? run nvidia-smi on the node"


@pytest.mark.parametrize("value", ["[N/A]", "[Insufficient Permissions]", "N/A", " [N/A] "])
def test_a_process_whose_memory_nvidia_smi_cannot_read_counts_zero(value):
    assert probe.parse_apps_csv(f"GPU-a, 5, python3, {value}\n", host="h")[0]["used_mib"] == 0


@pytest.mark.parametrize("row, field", [
    ("183359, 1, [N/A]", "memory.free"),
    ("[Not Supported], 1, 2", "memory.total"),
    ("183359, N/A, [N/A]", "memory.used"),
])
def test_the_first_memory_field_nvidia_smi_cannot_read_is_the_one_reported(row, field):
    gpu = probe.parse_gpu_csv(f"0, GPU-a, B200, {row}\n", host="h")[0]
    assert gpu["unreadable"]["field"] == field
    assert (gpu["total_mib"], gpu["used_mib"], gpu["free_mib"]) == (None, None, None)


def test_a_bracketed_name_is_not_an_unreadable_gpu():
    gpu = probe.parse_gpu_csv("0, GPU-a, [Unknown Board], 100, 1, 99\n", host="h")[0]
    assert "unreadable" not in gpu and gpu["name"] == "[Unknown Board]"


def test_an_unreadable_gpu_0_is_refused_when_the_fleet_uses_it():
    gpus = "0, GPU-a, B200, [GPU requires reset], [GPU requires reset], [GPU requires reset]\n" \
           "1, GPU-b, B200, 183359, 1, 183358\n"
    inventory = probe.parse_probe_output(_output(gpus=gpus, apps=""), host="node0")
    assert [gpu["index"] for gpu in probe.select_gpus(inventory, [1])] == [1]
    with pytest.raises(ProbeError, match=r"GPU 0 \(GPU-a\): nvidia-smi reports memory.total") as error:
        probe.select_gpus(inventory, [1, 0])
    assert "`nvidia-smi --gpu-reset -i 0`" in error.value.hint


def test_gpu_0_missing_from_the_inventory_is_named():
    inventory = probe.parse_probe_output(_output(gpus="1, GPU-b, B200, 183359, 1, 183358\n", apps=""), host="n")
    with pytest.raises(ProbeError) as error:
        probe.select_gpus(inventory, [0, 1])
    assert error.value.message == "the fleet names GPU(s) [0] but nvidia-smi lists only [1]"
    assert error.value.host == "n" and error.value.hint == "fix nodes[].gpus in the fleet description"


def test_the_selected_gpus_come_in_the_fleets_order():
    inventory = probe.parse_probe_output(_output(gpus=SEVERAL_GPUS, apps=""), host="n")
    assert [gpu["uuid"] for gpu in probe.select_gpus(inventory, [1, 0])] == ["GPU-b", "GPU-a"]


def test_unreadable_memory_gets_the_advice_for_its_cause():
    assert probe._unreadable_hint(" [GPU requires reset] ", 3, "node9").startswith(
        "reset it (as root, with no process on it: `nvidia-smi --gpu-reset -i 3`) or reboot node9, or leave GPU 3 out")
    assert probe._unreadable_hint("N/A", 2, "node9") == (
        "the probe needs per-GPU memory: check the driver and MIG mode (`nvidia-smi -q -i 2`), or leave GPU 2 out of "
        "the node's gpus / tp_groups in the fleet file until it is fixed")
    assert probe._unreadable_hint("[Unknown Error]", 1, "node9") == (
        "check the driver on node9 (`nvidia-smi -q -i 1`, Xid errors in `dmesg`); reset the GPU or reboot if it "
        "persists, or leave GPU 1 out of the node's gpus / tp_groups in the fleet file until it is fixed")


@pytest.mark.parametrize("missing", ["gpus", "apps"])
def test_a_probe_output_without_a_section_is_refused(missing):
    output = _output()
    start = output.index(f"{remote.SECTION_MARKER}{missing}\n")
    end = output.index(f"{remote.SECTION_MARKER}rc=0\n", start) + len(f"{remote.SECTION_MARKER}rc=0\n")
    with pytest.raises(ProbeError) as error:
        probe.parse_probe_output(output[:start] + output[end:], host="node2")
    assert error.value.message == f"the probe printed no '{missing}' section" and error.value.host == "node2"
    assert error.value.hint == "the remote shell must be bash; check the output of the probe command"


def test_a_failed_process_query_is_refused_too_and_the_message_is_cut_short():
    output = _output().replace(f"{APPS}{remote.SECTION_MARKER}rc=0", f"{'x' * 600}\n{remote.SECTION_MARKER}rc=6")
    with pytest.raises(ProbeError) as error:
        probe.parse_probe_output(output, host="n")
    assert error.value.message == f"nvidia-smi failed (exit 6): {'x' * 500}" and error.value.host == "n"
    assert error.value.hint == "is nvidia-smi on the remote PATH and does it work when run by hand?"


def test_without_an_ours_section_every_process_is_foreign():
    output = _output()
    output = output[:output.index(f"{remote.SECTION_MARKER}ours")]
    inventory = probe.parse_probe_output(output, host="n")
    assert all(not p["ours"] and p["port"] is None for gpu in inventory["gpus"] for p in gpu["processes"])


def test_our_pids_need_both_a_pid_and_a_port():
    text = "ours port=30000 pid=11\nours port=30001\nours pid=13\nnoise pid=14 port=30003\nours pid=15 port=30004\n"
    assert probe.parse_our_pids(text) == {11: 30000, 15: 30004}


def test_the_probe_command_run_by_bash_on_a_simulated_node_tells_our_server_from_a_foreign_process(tmp_path):
    node = create_node(tmp_path / "node", name="gpu-node", gpus=2)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # A live process whose command line is our module on port 30001, with its pid file, as a launch leaves it.
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "-m", "sglang_sim.server",
                               "--port", "30001", "--host", "0.0.0.0"])
    try:
        (run_dir / "sglang-30001.pid").write_text(f"{server.pid}\n")
        node.set_holder(1, server.pid, "python3", 40000)
        node.set_holder(1, os.getpid(), "trainer", 1000)  # alive, but not one of ours
        command = probe.probe_command(run_dir=str(run_dir), module="sglang_sim.server", ports=[30000, 30001])
        ran = subprocess.run(["bash", "-c", command], capture_output=True, text=True,
                             env={**os.environ, **node.env()}, timeout=60)
    finally:
        server.kill()
        server.wait()
    inventory = probe.parse_probe_output(ran.stdout, host="gpu-node")
    gpu0, gpu1 = inventory["gpus"]
    assert (gpu0["index"], gpu0["total_mib"], gpu0["processes"]) == (0, 183359, [])
    assert gpu1["used_mib"] == gpu0["used_mib"] + 41000
    assert sorted((p["process_name"], p["used_mib"], p["ours"], p["port"]) for p in gpu1["processes"]) == [
        ("python3", 40000, True, 30001), ("trainer", 1000, False, None)]


def test_the_inventory_reads_as_one_line_per_gpu_with_its_holders():
    inventory = probe.parse_probe_output(_output(gpus=SEVERAL_GPUS, apps=SEVERAL_APPS, ours=SEVERAL_OURS), host="n")
    assert probe.format_inventory(inventory) == (
        "n: 2 GPU(s)\n"
        "  GPU 0 NVIDIA H200: total 143771 MiB, used 120300, free 23471 (/opt/sglang/bin/python[4242 ours] 50000 MiB, "
        "foreign-trainer[5151] 10000 MiB, python3[9001 ours] 60000 MiB)\n"
        "  GPU 1 NVIDIA H200: total 143771 MiB, used 100512, free 43259 (python3[7000 ours] 100000 MiB)")
    idle = probe.parse_probe_output(_output(gpus=SEVERAL_GPUS, apps=""), host="n")
    assert probe.format_inventory(idle).splitlines()[1].endswith("free 23471 (no processes)")


def test_an_unusable_gpu_0_does_not_hide_the_gpus_after_it():
    gpus = "0, GPU-a, H200, [Unknown Error], 1, 2\n1, GPU-b, H200, 143771, 512, 143259\n"
    inventory = probe.parse_probe_output(_output(gpus=gpus, apps=""), host="n")
    assert probe.format_inventory(inventory).splitlines() == [
        "n: 2 GPU(s)", "  GPU 0 H200: unusable, nvidia-smi reports memory.total as [Unknown Error]",
        "  GPU 1 H200: total 143771 MiB, used 512, free 143259 (no processes)"]


def test_the_probe_command_run_by_bash_counts_a_process_carrying_our_launch_marker_as_ours(tmp_path):
    # SGLang's scheduler: its command line is not our module's, but it inherited the marker from the server.
    node = create_node(tmp_path / "node", name="gpu-node", gpus=1)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    marker = {remote.SERVER_MARKER_ENV: remote.pid_file(str(run_dir), 30002)}
    scheduler = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env={**os.environ, **marker})
    try:
        node.set_holder(0, scheduler.pid, "sglang::scheduler", 70000)
        command = probe.probe_command(run_dir=str(run_dir), module="sglang_sim.server", ports=[30002])
        ran = subprocess.run(["bash", "-c", command], capture_output=True, text=True,
                             env={**os.environ, **node.env()}, timeout=60)
    finally:
        scheduler.kill()
        scheduler.wait()
    [gpu0] = probe.parse_probe_output(ran.stdout, host="gpu-node")["gpus"]
    assert [(p["pid"], p["ours"], p["port"]) for p in gpu0["processes"]] == [(scheduler.pid, True, 30002)], ran.stdout
