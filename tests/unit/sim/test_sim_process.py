"""Real processes: the server on a temp node and port, fatal start-ups, the memory-holder CLI."""

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
from devstack.local_fleet import wait_healthy
from sglang_sim.node import create_node, write_faults
from sglang_sim.presets import install_model

pytestmark = pytest.mark.slow


@pytest.fixture
def node(tmp_path):
    return create_node(tmp_path / "node", name="node0", gpus=2, sim={"load_seconds": 0.3, "time_scale": 1000})


@pytest.fixture
def model_dir(tmp_path):
    return install_model(tmp_path / "model")


def _launch(node, model_dir, args, *, gpu="1"):
    env = dict(os.environ, **node.env(), CUDA_VISIBLE_DEVICES=gpu)
    return subprocess.Popen([sys.executable, "-m", "sglang_sim.server", "--model-path", str(model_dir), *args],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _smi(node, *args):
    out = subprocess.run([str(node.path / "bin" / "nvidia-smi"), *args], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stdout
    return out.stdout


# caps on waits that end with their event: a simulated server's start (imports and pool sizing, in a fresh
# interpreter on a busy machine) and a request reaching its decode
START_CAP_S = 120.0


def _wait_healthy(proc, url, timeout=START_CAP_S):
    try:
        wait_healthy(proc, url, timeout)
    except RuntimeError as error:
        raise AssertionError(f"{error}: {proc.stdout.read() if proc.poll() is not None else ''}") from None


def test_server_serves_and_releases_its_memory(tools, node, model_dir):
    port = tools.free_port()
    proc = _launch(node, model_dir, [*tools.SEED_ARGS[2:], *tools.AFTER, "--port", str(port)])
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(proc, url)
        info = httpx.get(f"{url}/server_info").json()
        assert info["internal_states"][0]["effective_max_running_requests_per_dp"] == 40
        assert info["internal_states"][0]["max_mamba_cache_size"] == 200
        reply = httpx.post(f"{url}/v1/chat/completions", timeout=30,
                           json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4096}).json()
        assert reply["choices"][0]["finish_reason"] in ("stop", "length") and reply["usage"]["completion_tokens"] > 0
        apps = _smi(node, "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader,nounits")
        pid, name, used = apps.strip().split(", ")
        assert (int(pid), name) == (proc.pid, "sglang::scheduler")  # no rank suffix at --tp-size 1
        assert int(used) > 0.9 * 183359 - 512  # weights + pools + graphs: most of the GPU at mfs 0.93
        assert _smi(node, "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0") == "512\n"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    log = proc.stdout.read()
    assert "The server is fired up and ready to roll!" in log
    assert "max_running_requests is capped to 40 by the mamba state cache" in log
    assert _smi(node, "--query-gpu=memory.used", "--format=csv,noheader,nounits") == "512\n512\n"


@pytest.mark.parametrize("extra, fault, expected", [
    (["--mem-fraction-static", "0.93"], {"fail_at_launch": "oom"},
     "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
     "Current value: mem_fraction_static=0.93"),
    (["--mem-fraction-static", "0.97"], None, "Exception: Capture cuda graph failed: CUDA out of memory."),
    # at 0.98 the MTP draft worker's KV pool (outside the budget) no longer fits before capture
    (["--mem-fraction-static", "0.98"], None, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4."),
])
def test_fatal_start_up_exits_with_sglangs_message(tools, node, model_dir, extra, fault, expected):
    port = tools.free_port()
    if fault:
        write_faults(node, port, fault)
    proc = _launch(node, model_dir, [*tools.SEED_ARGS[2:], *extra, "--port", str(port)])
    log, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert expected in log
    assert "Received sigquit from a child process. It usually means the child failed." in log  # SGLang's launcher
    if "Capture" in expected:
        assert "Possible solutions:\n1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)" in log
    assert _smi(node, "--query-compute-apps=pid", "--format=csv,noheader") == ""


def test_crash_fault_kills_the_server_after_n_requests(tools, node, model_dir):
    port = tools.free_port()
    write_faults(node, port, {"crash_after_requests": 1})
    proc = _launch(node, model_dir, [*tools.SEED_ARGS[2:], *tools.AFTER, "--port", str(port)])
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(proc, url)
        reply = httpx.post(f"{url}/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 4}}, timeout=30)
        assert reply.status_code == 200
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert _smi(node, "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "1") == "512\n"


def test_hold_cli_registers_and_frees_memory(node):
    def hold():
        proc = subprocess.Popen([sys.executable, "-m", "sglang_sim.cli", "hold", "--gpu", "0", "--mib", "1000",
                                 "--name", "foreign", "--node", str(node.path)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().startswith("holding 1000 MiB on GPU 0")
        return proc

    proc = hold()
    assert node.gpu_memory()[0]["processes"] == [{"pid": proc.pid, "process_name": "foreign", "used_mib": 1000}]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0 and node.used_mib(0) == 512
    proc = hold()
    proc.kill()
    proc.wait(timeout=10)
    assert node.used_mib(0) == 512  # kill -9: no cleanup ran, the dead pid is ignored


def test_create_node_cli(tmp_path):
    out = subprocess.run([sys.executable, "-m", "sglang_sim.cli", "create-node", str(tmp_path / "n"), "--name", "n1",
                          "--gpus", "3", "--time-scale", "100"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["gpus"] == 3
    assert json.loads((tmp_path / "n" / "node.json").read_text())["sim"]["time_scale"] == 100


def test_sigterm_drains_the_request_in_flight_and_exits_0(tools, tmp_path, model_dir):
    # decoding slow enough that the request is still running when SIGTERM lands
    node = create_node(tmp_path / "slow", name="n", gpus=1, sim={"load_seconds": 0.1, "time_scale": 1,
                                                                  "decode_base_ms": 5})
    port = tools.free_port()
    proc = _launch(node, model_dir, [*tools.SEED_ARGS[2:], *tools.AFTER, "--port", str(port)], gpu="0")
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(proc, url)
        with httpx.Client(timeout=60) as client:
            import threading

            replies = []
            chat = threading.Thread(target=lambda: replies.append(client.post(
                f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                    "max_tokens": 1000})))
            chat.start()
            # running is a passing state: the wait ends when the request runs, fails at once if it ended unseen
            deadline = time.monotonic() + START_CAP_S
            while (running := client.get(f"{url}/v1/loads").json()["loads"][0]["num_running_reqs"]) == 0:
                assert chat.is_alive(), f"the request ended before /v1/loads showed it running: {replies}"
                assert time.monotonic() < deadline, f"the request was not running after {START_CAP_S:.0f} s"
                time.sleep(0.005)
            assert running == 1
            proc.send_signal(signal.SIGTERM)
            health = client.get(f"{url}/health").status_code
            chat.join(60)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # SGLang's drain (sglang/srt/managers/tokenizer_manager.py): 503 to health checks, the request finishes
    assert health == 503 and replies[0].status_code == 200
    log = proc.stdout.read()
    assert "SIGTERM received. signum=None frame=None. Draining requests and shutting down..." in log
    assert "Health check request received during shutdown. Returning 503." in log
    assert "Gracefully exiting... Remaining number of requests 1. Remaining requests remaining_rids=['" in log
    assert log.rstrip().endswith("Gracefully exiting... Remaining number of requests 0. "
                                 "Remaining requests remaining_rids=[].")


@pytest.mark.parametrize("bind, internal", [("0.0.0.0", "127.0.0.1"), ("", "127.0.0.1"), ("::", "::1"),
                                            ("10.0.0.5", "10.0.0.5")])
def test_the_warm_up_goes_to_the_loopback_of_the_family_bound_to(bind, internal):
    from sglang_sim.serve import internal_host

    assert internal_host(bind) == internal


def test_a_request_to_an_ipv6_host_names_it_in_brackets():
    import asyncio

    from sglang_sim.serve import _http

    seen = []

    async def main():
        async def answer(reader, writer):
            seen.append((await reader.readuntil(b"\r\n\r\n")).decode())
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(answer, "::1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            return await _http("::1", port, "GET", "/model_info", None, None), port

    status, port = asyncio.run(main())
    assert status == 200 and f"Host: [::1]:{port}\r\n" in seen[0]
