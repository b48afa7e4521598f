"""The fake nvidia-smi: CSV formats, id filters, invalid fields, memory of dead processes."""

import os
import subprocess
import sys
import time

import pytest

from sglang_sim.node import create_node, pid_alive
from sglang_sim.nvidia_smi import render


@pytest.fixture
def node(tmp_path):
    node = create_node(tmp_path / "node", name="node0", gpus=2)
    node.set_holder(1, os.getpid(), "python", 70000)
    return node


def test_query_gpu_noheader_nounits(node):
    text, code = render(node, ["--query-gpu=index,uuid,name,memory.total,memory.used,memory.free",
                               "--format=csv,noheader,nounits"])
    assert code == 0
    uuid0, uuid1 = node.gpus[0].uuid, node.gpus[1].uuid
    assert text == (f"0, {uuid0}, NVIDIA B200, 183359, 512, 182847\n"
                    f"1, {uuid1}, NVIDIA B200, 183359, 70512, 112847\n")


def test_query_gpu_with_header_and_units(node):
    text, code = render(node, ["--query-gpu=memory.free,index", "--format=csv"])
    assert code == 0
    assert text.splitlines() == ["memory.free [MiB], index", "182847 MiB, 0", "112847 MiB, 1"]
    text, _ = render(node, ["--query-gpu=memory.total", "--format=csv,nounits"])
    assert text.splitlines() == ["memory.total [MiB]", "183359", "183359"]


def test_id_filter_and_separate_value_forms(node):
    text, _ = render(node, ["--query-gpu", "index,memory.used", "--format", "csv,noheader", "-i", "1"])
    assert text == "1, 70512 MiB\n"
    text, _ = render(node, ["--query-gpu=index", "--format=csv,noheader", f"--id={node.gpus[0].uuid}"])
    assert text == "0\n"
    text, code = render(node, ["--query-gpu=index", "--format=csv", "-i", "7"])
    assert (text, code) == ("No devices were found\n", 6)


def test_invalid_field(node):
    text, code = render(node, ["--query-gpu=index,xyz", "--format=csv"])
    assert (text, code) == ('Field "xyz" is not a valid field to query.\n', 2)


def test_compute_apps(node):
    text, _ = render(node, ["--query-compute-apps=gpu_uuid,pid,process_name,used_memory",
                            "--format=csv,noheader,nounits"])
    assert text == f"{node.gpus[1].uuid}, {os.getpid()}, python, 70000\n"
    text, _ = render(node, ["--query-compute-apps=pid,used_gpu_memory", "--format=csv", "-i", "1"])
    assert text.splitlines() == ["pid, used_gpu_memory [MiB]", f"{os.getpid()}, 70000 MiB"]
    text, _ = render(node, ["--query-compute-apps=pid,used_memory", "--format=csv,noheader", "-i", "0"])
    assert text == ""


def test_killed_process_frees_its_memory(node):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    node.set_holder(0, child.pid, "python", 50000)
    assert node.used_mib(0) == 50512
    child.kill()  # not reaped yet: a zombie holds no GPU memory either
    try:
        deadline = time.monotonic() + 5
        while pid_alive(child.pid) and time.monotonic() < deadline:
            time.sleep(0.01)  # the signal is delivered asynchronously
        assert node.used_mib(0) == 512
        assert not (node.path / "state" / "gpu0" / f"{child.pid}.json").exists()
    finally:
        child.wait()


def test_script_runs_against_its_node(node):
    out = subprocess.run([str(node.path / "bin" / "nvidia-smi"), "-L"], capture_output=True, text=True,
                         env={"PATH": os.environ["PATH"]}, timeout=30)
    assert out.returncode == 0
    assert out.stdout.splitlines()[0] == f"GPU 0: NVIDIA B200 (UUID: {node.gpus[0].uuid})"


def test_bare_call_prints_a_memory_table(node):
    text, code = render(node, [])
    assert code == 0
    assert "70512MiB / 183359MiB" in text and f"{os.getpid()}  python" in text
    text, _ = render(node, ["-i", "0"])
    assert "No running processes found" in text and "70512MiB" not in text
    assert render(node, ["--bogus"]) == ("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n", 2)


def test_utilization_and_power_follow_the_servers_load(node, tools):
    from sglang_sim.gpu_load import current_load, write_load

    query = ["--query-gpu=index,utilization.gpu,power.draw,memory.used", "--format=csv,noheader,nounits"]
    idle, _ = render(node, query)
    assert idle.splitlines() == ["0, 0, 140.00, 512", "1, 0, 140.00, 70512"]  # B200 idle draw, no server
    text, _ = render(node, ["--query-gpu=utilization.gpu,power.draw", "--format=csv", "-i", "0"])
    assert text.splitlines() == ["utilization.gpu [%], power.draw [W]", "0 %, 140.00 W"]

    service = tools.make_service(tools.AFTER)
    loads = {}

    async def measure():
        import asyncio

        service.start_engines(asyncio.get_running_loop())
        loads["idle"] = current_load(service)
        for batch in (1, service.plan.max_running_requests):
            engine = service.engines[0]
            jobs = [engine.submit(10, 100_000) for _ in range(batch - engine.running)]
            # the prefill's end lasts (the jobs decode far longer than any wait); capped, failing with what it saw
            deadline = asyncio.get_running_loop().time() + 60
            while engine.prefilling():
                assert asyncio.get_running_loop().time() < deadline, \
                    f"still prefilling {batch} requests: {engine.running} running, {engine.waiting} waiting"
                await asyncio.sleep(0.0005)
            loads[batch] = current_load(service)
        for job in jobs:
            job.cancel()

    import asyncio
    asyncio.run(measure())
    full = service.plan.max_running_requests
    assert loads["idle"] == (0.0, 0.0)
    assert 50 < loads[1][0] < loads[full][0] < 100  # the per-step launch gap weighs less in a big batch
    assert loads[1][1] < loads[full][1] < 1
    write_load(node, os.getpid(), [1], *loads[full])
    busy, _ = render(node, query)
    utilization, power = busy.splitlines()[1].split(", ")[1:3]
    assert int(utilization) == round(loads[full][0]) and 140 < float(power) < 1000
    assert busy.splitlines()[0] == idle.splitlines()[0]  # the other GPU stays idle


@pytest.mark.parametrize("gpu, power, speed", [("NVIDIA L4", (16, 72), (0.3e12, 0.121e15, 0.242e15)),
                                               ("NVIDIA L40S", (35, 350), (0.864e12, 0.362e15, 0.733e15)),
                                               ("NVIDIA A10G", (25, 150), (0.6e12, 0.125e15, None))])
def test_small_gpus_draw_and_run_at_their_own_rates(gpu, power, speed):
    """An L4 is neither an L40S nor the H100 that unknown GPUs read as."""
    from sglang_sim.gpu_load import gpu_power
    from sglang_sim.perf import gpu_speed

    assert (gpu_power(gpu), gpu_speed(gpu)) == (power, speed)
