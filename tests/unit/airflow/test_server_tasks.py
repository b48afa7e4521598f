"""The servers tasks (stop, launch, release). First on a node reached through a shell that runs the commands
here, in bash: a retry after a refused or dropped SSH connection launches each server exactly once. Then each
task's own decisions (what to keep, stop, adopt, launch, on which node) with lifecycle's remote steps faked."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleetgen.airflow import context as task_context_module
from fleetgen.airflow import lifecycle, server_tasks
from fleetgen.airflow.run_config import RunConfig
from fleetgen.errors import HostUnreachable, RemoteError
from fleetgen.nodes import remote
from fleetgen.outputs import RunLayout, read_server_times

RUN = "manual__2026-12-03T22:00:00+00:00"  # the run whose launches carry its identity

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
    monkeypatch.setattr(task_context_module, "task_context", lambda: {"params": PARAMS, "run_id": RUN, "ti": None})
    monkeypatch.setenv("FLEETGEN_OUTPUT_ROOT", PARAMS["output_root"])  # the deployment's root, the run's
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


# --- the tasks' own decisions, with lifecycle's remote steps replaced by recording fakes ---------------------------

PARAMS = {**{spec.name: spec.default_value() for spec in RunConfig.settings()}, "fleet_file": "",
          "prompts_path": "/p.jsonl", "output_root": "/out"}


@pytest.fixture(autouse=True)
def output_root(tmp_path, monkeypatch):
    """Each test's own output root: the tasks record when servers were launched, kept and stopped in the run's
    folder (server-times/)."""
    monkeypatch.setitem(PARAMS, "output_root", str(tmp_path / "out"))
    return tmp_path / "out"
# Two nodes at different addresses that use the same port numbers: n0 runs two servers, n1 one.
TWO_NODES = {"model": {"path": "/models/m", "served_name": "m"},
             "server": {"python": "/opt/py", "module": "sglang.launch_server", "run_dir": "/r", "log_dir": "/l"},
             "nodes": [{"name": "n0", "ssh_conn_id": "ssh_n0", "address": "10.0.0.5", "gpus": [0, 1],
                        "base_port": 30000},
                       {"name": "n1", "ssh_conn_id": "ssh_n1", "address": "10.0.0.6", "gpus": [0],
                        "base_port": 30000}]}


class RecordingNode:
    """Stands in for NodeShell and for lifecycle's remote steps: records what each was asked, answers from
    ``stop_records``, ``decisions``, ``earlier``/``other_plan`` and hands out pids from 900."""

    def __init__(self, monkeypatch):
        self.opened, self.calls, self.given = [], [], []
        self.stop_records, self.decisions, self.earlier, self.other_plan = [], [], {}, {}
        self.next_pid = 900
        recorder = self
        monkeypatch.setattr(task_context_module, "task_context", lambda: {"params": PARAMS, "run_id": RUN, "ti": None})
        monkeypatch.setenv("FLEETGEN_OUTPUT_ROOT", PARAMS["output_root"])  # the deployment's root, the run's

        class Shell:
            def __init__(self, node, ssh_conn_id, **_):
                self.node = node
                recorder.opened.append((node, ssh_conn_id))

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                pass

        monkeypatch.setattr(server_tasks, "NodeShell", Shell)
        monkeypatch.setattr(lifecycle, "api_key", lambda fleet: self._given(None, fleet) or "k")
        monkeypatch.setattr(lifecycle, "keep_or_relaunch", self.keep_or_relaunch)
        monkeypatch.setattr(lifecycle, "stop_ports", self.stop_ports)
        monkeypatch.setattr(lifecycle, "wait_memory_released", self.wait_memory_released)
        monkeypatch.setattr(lifecycle, "already_launched", self.already_launched)
        monkeypatch.setattr(lifecycle, "launch_server", self.launch_server)

    def _given(self, shell, fleet):
        """Which node's shell (None: no shell taken) and which fleet's model each remote step was given."""
        self.given.append((shell and shell.node, fleet.model.path))

    def keep_or_relaunch(self, shell, fleet, node, plans, *, force, key):
        self._given(shell, fleet)
        self.calls.append(("keep_or_relaunch", node, len(plans), force, key))
        return self.decisions

    def stop_ports(self, shell, fleet, ports):
        self._given(shell, fleet)
        self.calls.append(("stop_ports", list(ports)))
        return self.stop_records

    def wait_memory_released(self, shell, fleet, node, pids):
        self._given(shell, fleet)
        self.calls.append(("wait_memory_released", node, set(pids)))
        return {"host": node, "gpus": []}

    def already_launched(self, shell, fleet, slots, plan_by_port, key, *, run_id):
        assert run_id == task_context_module.task_context()["run_id"]
        self._given(shell, fleet)
        self.calls.append(("already_launched", [s.name for s in slots], key))
        return dict(self.earlier), dict(self.other_plan)

    def launch_server(self, shell, fleet, slot, plan, key, *, run_id):
        assert run_id == task_context_module.task_context()["run_id"]
        self._given(shell, fleet)
        self.calls.append(("launch_server", slot.name, plan["flags"]["--max-running-requests"], key))
        self.next_pid += 1
        return lifecycle.launch_record(fleet, slot, plan, self.next_pid, run_id=run_id)


@pytest.fixture
def recording(monkeypatch):
    return RecordingNode(monkeypatch)


def _run_with(monkeypatch, **params):
    context = {"params": {**PARAMS, **params}, "run_id": "manual__1", "ti": None}
    monkeypatch.setattr(task_context_module, "task_context", lambda: context)


def _plans_two_nodes(n0=(40, 41), n1=50):
    return [{"host": "n0", "port": 30000, "flags": {"--max-running-requests": n0[0]}},
            {"host": "n0", "port": 30001, "flags": {"--max-running-requests": n0[1]}},
            {"host": "n1", "port": 30000, "flags": {"--max-running-requests": n1}}]


def _decision(port, decision, pid=None):
    return {"server": f"n0:{port}", "port": port, "pid": pid, "decision": decision,
            "reasons": [] if decision == "keep" else ["no server of ours runs on the port"]}


def test_a_stop_with_no_plans_stops_every_port_of_its_node_and_waits_for_the_stopped_pids(monkeypatch, recording):
    _run_with(monkeypatch)
    recording.stop_records = [{"outcome": "stopped", "port": 30000, "pid": 11, "signal": "TERM"},
                              {"outcome": "stale", "port": 30001, "pid": 12, "signal": None}]
    result = server_tasks.stop_servers("n0", TWO_NODES)
    assert recording.opened == [("n0", "ssh_n0")]
    assert recording.calls == [("stop_ports", [30000, 30001]), ("wait_memory_released", "n0", {11})]
    assert result == {"node": "n0", "records": recording.stop_records, "decisions": []}


def test_a_stop_on_the_second_node_touches_only_its_own_ports(monkeypatch, recording):
    _run_with(monkeypatch)
    server_tasks.stop_servers("n1", TWO_NODES)
    assert recording.opened == [("n1", "ssh_n1")]
    assert recording.calls[0] == ("stop_ports", [30000])


def test_a_stop_with_plans_keeps_the_servers_that_run_them_and_stops_the_others(monkeypatch, recording):
    _run_with(monkeypatch)
    recording.decisions = [_decision(30000, "keep", pid=500), _decision(30001, "relaunch", pid=501)]
    recording.stop_records = [{"outcome": "stopped", "port": 30001, "pid": 501, "signal": "TERM"}]
    result = server_tasks.stop_servers("n0", TWO_NODES, _plans_two_nodes())
    assert recording.calls == [("keep_or_relaunch", "n0", 3, False, "k"), ("stop_ports", [30001]),
                               ("wait_memory_released", "n0", {501})]
    assert result["decisions"] == recording.decisions


def test_every_remote_step_of_a_stop_runs_in_the_nodes_session_with_the_runs_fleet(monkeypatch, recording):
    _run_with(monkeypatch)
    recording.decisions = [_decision(30000, "keep", pid=500), _decision(30001, "relaunch", pid=501)]
    recording.stop_records = [{"outcome": "stopped", "port": 30001, "pid": 501, "signal": "TERM"}]
    server_tasks.stop_servers("n0", TWO_NODES, _plans_two_nodes())
    # api_key (no session), keep_or_relaunch, stop_ports, wait_memory_released
    assert recording.given == [(None, "/models/m")] + [("n0", "/models/m")] * 3


def test_relaunch_servers_is_passed_on_as_force(monkeypatch, recording):
    _run_with(monkeypatch, relaunch_servers=True)
    server_tasks.stop_servers("n0", TWO_NODES, _plans_two_nodes())
    assert recording.calls[0] == ("keep_or_relaunch", "n0", 3, True, "k")


def test_after_the_trial_the_losers_are_stopped_whatever_they_report_and_the_winners_kept(monkeypatch, recording):
    # relaunch_servers applied to the first round: the winners' servers stay up
    _run_with(monkeypatch, relaunch_servers=True)
    recording.decisions = [_decision(30000, "keep", pid=500), _decision(30001, "keep", pid=501)]
    recording.stop_records = [{"outcome": "stopped", "port": 30001, "pid": 501, "signal": "TERM"}]
    final = [{**plan, "candidate": "no_speculation"} for plan in _plans_two_nodes()]
    ran = [final[0], {**final[1], "candidate": "incumbent"}, final[2]]
    result = server_tasks.stop_servers("n0", TWO_NODES, final, ran)
    assert recording.calls == [("keep_or_relaunch", "n0", 3, False, "k"), ("stop_ports", [30001]),
                               ("wait_memory_released", "n0", {501})]
    assert [d["decision"] for d in result["decisions"]] == ["keep", "relaunch"]
    assert result["decisions"][1]["reasons"] == ["ran incumbent in the tuning trial, which no_speculation won"]


def test_when_every_server_is_kept_nothing_is_stopped(monkeypatch, recording):
    _run_with(monkeypatch)
    recording.decisions = [_decision(30000, "keep", pid=500), _decision(30001, "keep", pid=501)]
    result = server_tasks.stop_servers("n0", TWO_NODES, _plans_two_nodes())
    assert [call[0] for call in recording.calls] == ["keep_or_relaunch", "wait_memory_released"]
    assert recording.calls[-1] == ("wait_memory_released", "n0", set()) and result["records"] == []


def test_a_stale_pid_file_is_reported_and_not_waited_for(monkeypatch, recording, caplog):
    _run_with(monkeypatch)
    recording.stop_records = [{"outcome": "stale", "port": 30001, "pid": 12, "signal": None},
                              {"outcome": "absent", "port": 30000, "pid": None, "signal": None}]
    with caplog.at_level("INFO", logger="fleetgen"):
        server_tasks.stop_servers("n0", TWO_NODES)
    assert recording.calls[-1] == ("wait_memory_released", "n0", set())
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        "port 30001: pid file named pid 12, which is not our server any more; left it alone"]
    assert "Stopped 0 server(s) on n0" in caplog.text


def test_keep_servers_up_releases_nothing(monkeypatch, recording):
    _run_with(monkeypatch, keep_servers_up=True)
    assert server_tasks.release_servers("n1", TWO_NODES) == {"node": "n1", "records": []}
    assert recording.opened == [] and recording.calls == []


def test_without_keep_servers_up_the_release_stops_every_server_of_the_node(monkeypatch, recording):
    _run_with(monkeypatch, keep_servers_up=False)
    recording.stop_records = [{"outcome": "stopped", "port": 30000, "pid": 21, "signal": "TERM"}]
    result = server_tasks.release_servers("n1", TWO_NODES)
    assert recording.calls == [("stop_ports", [30000]), ("wait_memory_released", "n1", {21})]
    assert result == {"node": "n1", "records": recording.stop_records, "decisions": []}


def _stopped(node, kept: dict[int, int]):
    return {"node": node, "records": [],
            "decisions": [{"server": f"{node}:{port}", "port": port, "pid": pid, "decision": "keep", "reasons": []}
                          for port, pid in kept.items()]}


def test_a_launch_passes_on_the_kept_servers_of_its_own_node_when_nodes_share_port_numbers(monkeypatch, recording):
    stopped = [_stopped("n1", {30000: 600}), _stopped("n0", {30000: 500})]
    launched = server_tasks.launch_servers("n1", TWO_NODES, _plans_two_nodes(), stopped)
    assert [(s["name"], s["pid"], s["kept"], s["plan"]["flags"]["--max-running-requests"]) for s in launched] == \
        [("n1:30000", 600, True, 50)]
    assert recording.opened == [] and recording.calls == []  # nothing to launch: no SSH session


def test_a_launch_keeps_some_servers_and_launches_the_others_with_their_own_plans(monkeypatch, recording):
    stopped = [_stopped("n0", {30001: 501}), _stopped("n1", {30000: 600})]
    launched = server_tasks.launch_servers("n0", TWO_NODES, _plans_two_nodes(), stopped)
    assert [(s["name"], s["pid"], s["kept"]) for s in launched] == [("n0:30001", 501, True), ("n0:30000", 901, False)]
    assert recording.opened == [("n0", "ssh_n0")]
    assert recording.calls == [("already_launched", ["n0:30000"], "k"), ("launch_server", "n0:30000", 40, "k")]


def _times(output_root, run_id=RUN) -> list[tuple]:
    layout = RunLayout.for_run(output_root, run_id)
    return [(server, event["event"], event["pid"]) for server, events in read_server_times(layout).items()
            for event in events]


def test_a_launch_records_when_each_server_was_launched_or_kept_for_the_gpu_hours(monkeypatch, recording,
                                                                                 output_root):
    server_tasks.launch_servers("n0", TWO_NODES, _plans_two_nodes(), [_stopped("n0", {30001: 501})])
    assert _times(output_root) == [("n0:30000", "launched", 901), ("n0:30001", "kept", 501)]


def test_a_stop_records_when_the_servers_it_stopped_were_gone_and_nothing_of_a_stale_pid(monkeypatch, recording,
                                                                                        output_root):
    _run_with(monkeypatch, keep_servers_up=False)
    recording.stop_records = [{"outcome": "stopped", "port": 30000, "pid": 11, "signal": "TERM"},
                              {"outcome": "stale", "port": 30001, "pid": 12, "signal": None}]
    server_tasks.release_servers("n0", TWO_NODES)
    assert _times(output_root, "manual__1") == [("n0:30000", "stopped", 11)]


def test_a_launch_with_no_stop_results_launches_every_server_of_the_node(monkeypatch, recording):
    launched = server_tasks.launch_servers("n0", TWO_NODES, _plans_two_nodes())
    assert [(s["name"], s["pid"]) for s in launched] == [("n0:30000", 901), ("n0:30001", 902)]
    assert [c for c in recording.calls if c[0] == "launch_server"] == [("launch_server", "n0:30000", 40, "k"),
                                                                      ("launch_server", "n0:30001", 41, "k")]


def test_a_launch_adopts_an_earlier_tries_server_and_stops_one_with_another_plan(monkeypatch, recording, caplog):
    plans = _plans_two_nodes()
    fleet = dict(TWO_NODES, nodes=[{**TWO_NODES["nodes"][0], "gpus": [0, 1, 2]}])
    plans.append({"host": "n0", "port": 30002, "flags": {"--max-running-requests": 42}})
    recording.earlier, recording.other_plan = {30001: 701}, {30002: 702, 30000: 700}
    recording.stop_records = [{"outcome": "stopped", "port": 30000, "pid": 700, "signal": "TERM"},
                              {"outcome": "stale", "port": 30002, "pid": 702, "signal": None}]
    with caplog.at_level("INFO", logger="fleetgen"):
        launched = server_tasks.launch_servers("n0", fleet, plans, [_stopped("n0", {})])
    assert recording.calls == [("already_launched", ["n0:30000", "n0:30001", "n0:30002"], "k"),
                               ("stop_ports", [30000, 30002]), ("wait_memory_released", "n0", {700}),
                               ("launch_server", "n0:30000", 40, "k"), ("launch_server", "n0:30002", 42, "k")]
    assert [(s["name"], s["pid"], s["kept"]) for s in launched] == [
        ("n0:30000", 901, False), ("n0:30001", 701, False), ("n0:30002", 902, False)]
    assert launched[1]["plan"] == plans[1]
    assert "n0:30001: already launched by an earlier try of this task (pid 701" in caplog.text
    assert "ports [30000, 30002] run a server of ours launched with another command line" in caplog.text


def test_a_launch_with_no_earlier_server_of_another_plan_stops_nothing(monkeypatch, recording):
    recording.earlier = {30000: 701}
    server_tasks.launch_servers("n0", TWO_NODES, _plans_two_nodes(), [_stopped("n0", {})])
    assert [c[0] for c in recording.calls] == ["already_launched", "launch_server"]


def test_a_stop_result_without_decisions_keeps_nothing_and_launches_every_server(monkeypatch, recording):
    launched = server_tasks.launch_servers("n0", TWO_NODES, _plans_two_nodes(), [{"node": "n0", "records": []}])
    assert [(s["name"], s["pid"], s["kept"]) for s in launched] == [("n0:30000", 901, False), ("n0:30001", 902, False)]
    assert set(recording.given) == {(None, "/models/m"), ("n0", "/models/m")}


def test_the_launched_servers_of_every_node_are_flattened_in_order():
    assert server_tasks.flatten([[{"pid": 1}, {"pid": 2}], [], [{"pid": 3}]]) == [{"pid": 1}, {"pid": 2}, {"pid": 3}]


def _messages(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == "fleetgen"]


def test_a_stop_logs_each_decision_what_it_stops_and_what_memory_is_left(monkeypatch, recording, caplog):
    _run_with(monkeypatch)
    recording.decisions = [_decision(30000, "keep", pid=500),
                           {**_decision(30001, "relaunch", pid=501), "reasons": ["flags differ", "model differs"]}]
    recording.stop_records = [{"outcome": "stopped", "port": 30001, "pid": 501, "signal": "TERM"}]
    with caplog.at_level("INFO", logger="fleetgen"):
        server_tasks.stop_servers("n0", TWO_NODES, _plans_two_nodes())
    assert _messages(caplog) == [
        "n0:30000: kept (pid 500): it runs tonight's plan, model and version",
        "n0:30001: relaunched: flags differ; model differs",
        "Stopping our servers on n0 ports [30001] (only pids from our pid files whose command line matches)",
        "Stopped 1 server(s) on n0; memory released:\nn0: 0 GPU(s)"]


def test_a_kept_release_says_so(monkeypatch, recording, caplog):
    _run_with(monkeypatch, keep_servers_up=True)
    with caplog.at_level("INFO", logger="fleetgen"):
        server_tasks.release_servers("n0", TWO_NODES)
    assert _messages(caplog) == ["keep_servers_up is set: servers on n0 stay up for the next run"]


def test_a_launch_logs_what_it_launches_adopts_and_keeps(monkeypatch, recording, caplog):
    recording.earlier, recording.other_plan = {30001: 701}, {}
    with caplog.at_level("INFO", logger="fleetgen"):
        server_tasks.launch_servers("n0", TWO_NODES, _plans_two_nodes(), [_stopped("n0", {})])
    assert _messages(caplog) == [
        "Launching 2 server(s) on n0; 0 kept running",
        "n0:30001: already launched by an earlier try of this task (pid 701, same command line); not launched again",
        "Servers on n0: pids [901, 701]"]
    caplog.clear()
    recording.earlier, recording.other_plan = {}, {30001: 702, 30000: 703}
    with caplog.at_level("INFO", logger="fleetgen"):
        server_tasks.launch_servers("n0", TWO_NODES, _plans_two_nodes(), [_stopped("n0", {30000: 5})])
    assert _messages(caplog) == [
        "Launching 1 server(s) on n0; 1 kept running",
        "ports [30000, 30001] run a server of ours launched with another command line after stop_servers "
        "(pids [702, 703]): stopping them to launch tonight's plan",
        "Servers on n0: pids [5, 902]"]


# --- a node tonight's plan left out (skip_unreachable_nodes) ------------------------------------------------------

def _plans_without_n1():
    return [plan for plan in _plans_two_nodes() if plan["host"] == "n0"]


def test_a_node_the_plan_left_out_is_not_stopped_launched_or_released(monkeypatch, recording, caplog):
    _run_with(monkeypatch, keep_servers_up=False, skip_unreachable_nodes=True)
    with caplog.at_level("WARNING", logger="fleetgen"):
        assert server_tasks.stop_servers("n1", TWO_NODES, _plans_without_n1()) == {
            "node": "n1", "records": [], "decisions": [], "left_out": True}
        assert server_tasks.launch_servers("n1", TWO_NODES, _plans_without_n1(), []) == []
        assert server_tasks.release_servers("n1", TWO_NODES, _plans_without_n1()) == {
            "node": "n1", "records": [], "left_out": True}
    assert recording.opened == [] and recording.calls == []
    assert [r.getMessage() for r in caplog.records] == [
        "n1 was left out of tonight's plan (unreachable at probe time, skip_unreachable_nodes): not touched"] * 3


def test_the_nodes_the_plan_kept_are_stopped_and_released_as_ever(monkeypatch, recording):
    _run_with(monkeypatch, keep_servers_up=False)
    server_tasks.stop_servers("n0", TWO_NODES, _plans_without_n1())
    server_tasks.release_servers("n0", TWO_NODES, _plans_without_n1())
    assert recording.opened == [("n0", "ssh_n0")] * 2


def test_a_release_without_a_plan_stops_every_node(monkeypatch, recording):
    # derive_plan did not run (it failed): its XCom is None and no node is left out
    _run_with(monkeypatch, keep_servers_up=False)
    server_tasks.release_servers("n1", TWO_NODES, None)
    assert recording.opened == [("n1", "ssh_n1")]
