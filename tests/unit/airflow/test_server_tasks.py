"""launch_servers on a node reached through a shell that runs the commands here, in bash: a retry after a
refused or dropped SSH connection launches each server exactly once."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleetgen.airflow import server_tasks
from fleetgen.errors import HostUnreachable, RemoteError
from fleetgen.nodes import remote

SLEEPER = "import time\nprint('up', flush=True)\ntime.sleep(600)\n"
# nvidia-smi for the memory check after a stop: one idle GPU, no compute processes.
NVIDIA_SMI = "#!/bin/sh\ncase \"$*\" in *query-gpu*) echo '0, GPU-a, Fake GPU, 1000, 0, 1000';; esac\n"
PORTS = (31000, 31001, 31002)


class LocalNode:
    """Stands in for NodeShell: runs each command in a local bash. ``refuse_connections`` tries fail to
    connect; ``drop_after_launches`` launches run and then the connection drops before their output is read."""

    refuse_connections = 0
    drop_after_launches: int | None = None
    launches = 0
    env: dict = {}

    def __init__(self, node, ssh_conn_id, **_):
        self.node = node

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def run(self, command, *, stdin=None, timeout_s=120.0, check=True, describe="command"):
        if LocalNode.refuse_connections:
            LocalNode.refuse_connections -= 1
            raise HostUnreachable("cannot reach the node via connection 'ssh_n0': ConnectionRefusedError",
                                  host=self.node)
        result = subprocess.run(["bash", "-c", command], input=stdin, capture_output=True, text=True,
                                timeout=timeout_s, env=LocalNode.env)
        if describe.startswith("launch of "):
            LocalNode.launches += 1
            if LocalNode.drop_after_launches is not None and LocalNode.launches > LocalNode.drop_after_launches:
                LocalNode.drop_after_launches = None
                raise HostUnreachable(f"connection lost during {describe}: Socket is closed", host=self.node)
        if check and result.returncode != 0:
            raise RemoteError(f"{describe} failed with exit status {result.returncode}: {result.stderr}",
                              host=self.node)
        return result.returncode, result.stdout, result.stderr


@pytest.fixture
def node(tmp_path, monkeypatch):
    (tmp_path / "fakeserver.py").write_text(SLEEPER)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvidia-smi").write_text(NVIDIA_SMI)
    (tmp_path / "bin" / "nvidia-smi").chmod(0o755)
    LocalNode.refuse_connections, LocalNode.drop_after_launches, LocalNode.launches = 0, None, 0
    LocalNode.env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    monkeypatch.setattr(server_tasks, "NodeShell", LocalNode)
    fleet = {"model": {"path": str(tmp_path / "model"), "served_name": "m"},
             "server": {"python": sys.executable, "module": "fakeserver", "run_dir": str(tmp_path / "run"),
                        "log_dir": str(tmp_path / "logs"), "env": {"PYTHONPATH": str(tmp_path)}, "stop_grace_s": 0.2},
             "nodes": [{"name": "n0", "ssh_conn_id": "ssh_n0", "address": "10.0.0.5", "gpus": [0, 1, 2],
                        "base_port": PORTS[0]}]}
    yield tmp_path, fleet
    subprocess.run(["bash", "-c", remote.stop_command(run_dir=str(tmp_path / "run"), module="fakeserver",
                                                      ports=PORTS, grace_s=0.2)], capture_output=True)


def _plans(requests=40):
    return [{"host": "n0", "port": port, "flags": {"--max-running-requests": requests}} for port in PORTS]


def _servers_running(tmp_path, ports=()) -> dict[int, list[int]]:
    """Port -> pids of the fake servers of this test's model path, read from /proc; first waits until each of
    ``ports`` runs one (a launch returns before its process has exec'd the server)."""
    deadline = time.monotonic() + 60
    while True:
        found = _scan(tmp_path)
        if set(ports) <= set(found) or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def _scan(tmp_path) -> dict[int, list[int]]:
    found: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode().split("\0")
            state = (entry / "stat").read_text().split()[2]
        except OSError:
            continue
        if str(tmp_path / "model") in argv and "fakeserver" in argv and state != "Z":
            found.setdefault(int(argv[argv.index("--port") + 1]), []).append(int(entry.name))
    return found


def _launch(fleet, plans):
    return server_tasks.launch_servers("n0", fleet, plans, [{"node": "n0", "records": [], "decisions": []}])


def test_a_refused_connection_launches_nothing_and_the_retry_launches_every_server(node):
    tmp_path, fleet = node
    LocalNode.refuse_connections = 1
    with pytest.raises(HostUnreachable, match="ConnectionRefusedError"):
        _launch(fleet, _plans())
    assert _servers_running(tmp_path) == {}
    launched = _launch(fleet, _plans())
    running = _servers_running(tmp_path, PORTS)
    assert sorted(running) == list(PORTS) and all(len(pids) == 1 for pids in running.values())
    assert [(s["port"], s["pid"], s["kept"]) for s in launched] == [(p, running[p][0], False) for p in PORTS]


def test_a_retry_after_a_dropped_connection_passes_on_the_servers_already_launched(node, caplog):
    tmp_path, fleet = node
    LocalNode.drop_after_launches = 1  # the second launch runs on the node, then the connection drops
    with pytest.raises(HostUnreachable, match="connection lost during launch of n0:31001"):
        _launch(fleet, _plans())
    before = _servers_running(tmp_path, (31000, 31001))
    assert sorted(before) == [31000, 31001]
    with caplog.at_level("INFO", logger="fleetgen"):
        launched = _launch(fleet, _plans())
    running = _servers_running(tmp_path, PORTS)
    assert sorted(running) == list(PORTS) and all(len(pids) == 1 for pids in running.values())
    assert {p: running[p] for p in (31000, 31001)} == before  # the same processes, not launched again
    assert [s["pid"] for s in launched] == [running[p][0] for p in PORTS]
    assert launched[0]["plan"] == _plans()[0] and launched[0]["log_path"].endswith("sglang-31000.log")
    assert "n0:31000: already launched by an earlier try of this task" in caplog.text


def test_a_server_of_ours_with_another_command_line_is_stopped_and_launched_with_tonights_plan(node):
    tmp_path, fleet = node
    LocalNode.drop_after_launches = 1
    with pytest.raises(HostUnreachable):
        _launch(fleet, _plans(requests=20))  # e.g. what wait_ready relaunched smaller before a clear
    before = _servers_running(tmp_path, (31000, 31001))
    launched = _launch(fleet, _plans(requests=40))
    running = _servers_running(tmp_path, PORTS)
    assert sorted(running) == list(PORTS) and all(len(pids) == 1 for pids in running.values())
    assert all(running[p] != before[p] for p in before)
    assert all("--max-running-requests 40" in s["command"] for s in launched)


def test_a_command_line_whose_home_the_node_expanded_is_the_same_launch():
    from fleetgen.airflow.lifecycle import _same_command

    spec = remote.LaunchSpec(python="~/venv/bin/python", module="sglang.launch_server", model_path="~/models/m",
                             served_name="m", port=30000, gpu_ids=(0,), bind_host="0.0.0.0", run_dir="~/run",
                             log_dir="~/logs", args=("--max-running-requests", "40"), api_key_on_stdin=True)
    running = ["/home/u/venv/bin/python", *spec.argv()[1:4], "/home/u/models/m", *spec.argv()[5:],
               "--config", "/home/u/run/sglang-30000.yaml"]
    assert _same_command(running, spec)
    assert not _same_command(running[:-2], spec)  # launched without the key file
    assert not _same_command([*running[:-4], "20", *running[-2:]], spec)  # another plan
    assert not _same_command(["/opt/other/python", *running[1:]], spec)
