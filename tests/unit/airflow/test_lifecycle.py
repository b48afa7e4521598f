"""Stop, launch and memory checks of one node's servers (fleetgen.airflow.lifecycle), through a scripted shell
that answers each remote command by what it is for: no SSH, no server, no sleep."""

from __future__ import annotations

import httpx
import pytest

from fleetgen.airflow import lifecycle
from fleetgen.errors import ConfigError, RemoteError, ServerStartupError
from fleetgen.nodes import probe, readiness, remote
from fleetgen.nodes.fleet import fleet_from_json

RUN = "manual__2026-12-03T22:00:00+00:00"  # the run whose launches carry its identity


class ScriptedShell:
    """Stands in for NodeShell: ``answers`` maps the start of a command's ``describe`` to the (status, stdout,
    stderr) it gets, a list of them (one per call, in order) or a callable ``(command, stdin) -> answer``.
    Every call is recorded; ``check`` raises as NodeShell does."""

    def __init__(self, answers: dict):
        self.answers = dict(answers)
        self.calls: list[dict] = []

    def run(self, command, *, stdin=None, timeout_s=120.0, check=True, describe="command"):
        self.calls.append({"command": command, "stdin": stdin, "timeout_s": timeout_s, "check": check,
                           "describe": describe})
        prefix = next(p for p in self.answers if describe.startswith(p))
        answer = self.answers[prefix]
        if isinstance(answer, list):
            answer = answer.pop(0) if len(answer) > 1 else answer[0]
        if callable(answer):
            answer = answer(command, stdin)
        if check and answer[0] != 0:
            raise RemoteError(f"{describe} failed with exit status {answer[0]}", host="scripted")
        return answer

    def described(self, prefix: str) -> list[dict]:
        return [call for call in self.calls if call["describe"].startswith(prefix)]


def probe_output(processes: list[tuple[int, int]] = (), ours: dict[int, int] | None = None) -> str:
    """What the GPU probe prints: two idle-ish GPUs, ``processes`` as (pid, MiB) on GPU 0, ``ours`` {pid: port}."""
    marker = remote.SECTION_MARKER
    apps = "\n".join(f"GPU-a, {pid}, python3, {mib}" for pid, mib in processes) or "No running processes found"
    our_lines = "\n".join(f"ours port={port} pid={pid}" for pid, port in (ours or {}).items())
    return (f"{marker}gpus\n0, GPU-a, Fake GPU, 1000, 0, 1000\n1, GPU-b, Fake GPU, 1000, 0, 1000\n{marker}rc=0\n"
            f"{marker}apps\n{apps}\n{marker}rc=0\n{marker}ours\n{our_lines}\n{marker}rc=0\n")


def fleet_document(**server) -> dict:
    """Two nodes at different addresses that use the same port numbers: n0 runs two servers, n1 one."""
    return {"model": {"path": "/models/m", "served_name": "m"},
            "server": {"python": "/opt/py", "module": "sglang.launch_server", "run_dir": "/r", "log_dir": "/l",
                       "stop_grace_s": 5, "extra_args": ["--reasoning-parser", "qwen3"], **server},
            "nodes": [{"name": "n0", "ssh_conn_id": "ssh_n0", "address": "10.0.0.5", "gpus": [0, 1],
                       "base_port": 30000},
                      {"name": "n1", "ssh_conn_id": "ssh_n1", "address": "10.0.0.6", "gpus": [0],
                       "base_port": 30000}]}


@pytest.fixture
def fleet():
    return fleet_from_json(fleet_document())


def slots_of(fleet, node):
    return [slot for slot in fleet.servers() if slot.node == node]


def plans_for(fleet, requests: dict | None = None) -> dict:
    """``{(host, port): plan}`` for every server; ``requests`` gives some servers another cap."""
    requests = requests or {}
    return {(s.node, s.port): {"host": s.node, "port": s.port,
                               "flags": {"--max-running-requests": requests.get((s.node, s.port), 40)}}
            for s in fleet.servers()}


# --- the API key -------------------------------------------------------------------------------------------------

def _connections(monkeypatch, passwords: dict):
    from airflow.sdk import BaseHook

    class Connection:
        def __init__(self, password):
            self.password = password

    monkeypatch.setattr(BaseHook, "get_connection", classmethod(lambda cls, conn_id: Connection(passwords[conn_id])))


def test_no_api_key_connection_means_no_key(fleet):
    assert lifecycle.api_key(fleet) is None


def test_the_api_key_is_the_password_of_the_named_connection(monkeypatch):
    _connections(monkeypatch, {"sglang_key": "s3cret", "other": "wrong"})
    assert lifecycle.api_key(fleet_from_json(fleet_document(api_key_conn_id="sglang_key"))) == "s3cret"


def test_a_connection_without_a_password_is_a_config_error_naming_it(monkeypatch):
    _connections(monkeypatch, {"sglang_key": ""})
    with pytest.raises(ConfigError, match="connection 'sglang_key' has no password") as refused:
        lifecycle.api_key(fleet_from_json(fleet_document(api_key_conn_id="sglang_key")))
    assert refused.value.hint == "set the connection's password to the SGLang --api-key value"


def test_a_password_that_cannot_be_a_key_is_refused_without_showing_it(monkeypatch):
    _connections(monkeypatch, {"sglang_key": "-leading-dash"})
    with pytest.raises(ConfigError, match="connection 'sglang_key' cannot be an API key") as refused:
        lifecycle.api_key(fleet_from_json(fleet_document(api_key_conn_id="sglang_key")))
    assert "-leading-dash" not in str(refused.value) and refused.value.__cause__ is None
    assert refused.value.hint == "set the connection's password to a key of one line not starting with '-'"


# --- probe, stop, memory ------------------------------------------------------------------------------------------

def test_the_probe_asks_for_the_named_nodes_ports_and_reads_its_host(fleet):
    shell = ScriptedShell({"GPU probe": (0, probe_output([(7, 500)], {7: 30001}), "")})
    inventory = lifecycle.probe_node(shell, fleet, "n1")
    assert inventory["host"] == "n1" and [g["index"] for g in inventory["gpus"]] == [0, 1]
    assert inventory["gpus"][0]["processes"][0]["pid"] == 7
    [call] = shell.calls
    assert call["timeout_s"] == 60 and call["command"] == probe.probe_command(
        run_dir="/r", module="sglang.launch_server", ports=(30000,))


def test_stop_records_every_port_with_its_pid_and_signal_in_the_ports_order(fleet):
    # the ports are stopped at once: their lines come in the order they ended
    out = ("stopped port=30003 pid=14 signal=KILL\nstale port=30002 pid=13\nnoise line\n"
           "stopped port=30000 pid=11 signal=TERM\nabsent port=30001\n")
    shell = ScriptedShell({"stop servers": (0, out, "")})
    records = lifecycle.stop_ports(shell, fleet, [30000, 30001, 30002, 30003])
    plain = {"launched_under_other_module": False, "pid_file_missing": False}
    assert records == [{"outcome": "stopped", "port": 30000, "pid": 11, "signal": "TERM", **plain},
                       {"outcome": "absent", "port": 30001, "pid": None, "signal": None, **plain},
                       {"outcome": "stale", "port": 30002, "pid": 13, "signal": None, **plain},
                       {"outcome": "stopped", "port": 30003, "pid": 14, "signal": "KILL", **plain}]
    [call] = shell.calls
    # The ports stop at once: one grace period, plus a minute for the SSH round trip.
    assert call["timeout_s"] == 5 + 60
    assert call["command"] == remote.stop_command(run_dir="/r", module="sglang.launch_server",
                                                  ports=[30000, 30001, 30002, 30003], grace_s=5)


def test_a_stopped_server_found_by_its_marker_says_how_it_was_found(fleet):
    out = ("stopped port=30000 pid=11 signal=TERM module=other\n"
           "stopped port=30001 pid=12 signal=KILL pid_file=missing module=other\n")
    records = lifecycle.stop_ports(ScriptedShell({"stop servers": (0, out, "")}), fleet, [30000, 30001])
    assert [(r["launched_under_other_module"], r["pid_file_missing"]) for r in records] == [(True, False),
                                                                                          (True, True)]


def test_the_live_server_of_ours_on_a_port_is_the_pid_its_pid_file_names_and_none_when_it_names_another(fleet):
    shell = ScriptedShell({"our server on the port": [(0, "ours port=30001 pid=12\nours port=30000 pid=11\n", ""),
                                                      (0, "ours port=30001 pid=12\n", ""), (0, "", "")]})
    assert lifecycle.live_server_of_ours(shell, fleet, 30000) == 11
    assert lifecycle.live_server_of_ours(shell, fleet, 30000) is None
    assert lifecycle.live_server_of_ours(shell, fleet, 30000) is None
    assert shell.calls[0]["command"] == remote.our_pids_command(run_dir="/r", module="sglang.launch_server",
                                                                ports=[30000])


class Clock:
    """time.monotonic and time.sleep for the memory wait: each sleep advances the clock by one step."""

    def __init__(self, monkeypatch, step: float):
        self.now, self.step, self.sleeps, self.slept = 100.0, step, 0, []
        monkeypatch.setattr(lifecycle.time, "monotonic", lambda: self.now)
        monkeypatch.setattr(lifecycle.time, "sleep", self.sleep)

    def sleep(self, seconds):
        self.sleeps += 1
        self.slept.append(seconds)
        self.now += self.step


def test_memory_is_released_once_no_stopped_pid_holds_it_even_if_a_foreign_process_does(fleet, monkeypatch):
    clock = Clock(monkeypatch, step=1.0)
    shell = ScriptedShell({"GPU probe": [(0, probe_output([(11, 500), (99, 300)]), ""),
                                         (0, probe_output([(99, 300)]), "")]})
    inventory = lifecycle.wait_memory_released(shell, fleet, "n0", {11, 12})
    assert len(shell.calls) == 2 and clock.slept == [1.0]
    assert [p["pid"] for p in inventory["gpus"][0]["processes"]] == [99]


def test_memory_still_held_at_the_deadline_is_probed_once_more_then_fails_naming_the_pids(fleet, monkeypatch):
    Clock(monkeypatch, step=2.0)  # probes at t=0, 2, 4 (the deadline itself: not past it), 6
    shell = ScriptedShell({"GPU probe": (0, probe_output([(12, 500), (11, 500), (99, 1)]), "")})
    with pytest.raises(RemoteError, match=r"pids \[11, 12\]\) still hold GPU memory after 4 s") as failed:
        lifecycle.wait_memory_released(shell, fleet, "n0", {11, 12}, timeout_s=4)
    assert len(shell.calls) == 4 and failed.value.host == "n0"
    assert failed.value.hint == ("check `nvidia-smi` on the node; a zombie or a stuck driver context may need a "
                                 "manual kill")


def test_the_memory_wait_gives_up_after_two_minutes_by_default(fleet, monkeypatch):
    Clock(monkeypatch, step=120.5)  # the second probe is already past two minutes
    shell = ScriptedShell({"GPU probe": (0, probe_output([(11, 500)]), "")})
    with pytest.raises(RemoteError, match="after 120 s"):
        lifecycle.wait_memory_released(shell, fleet, "n0", {11})
    assert len(shell.calls) == 2


def test_no_pid_to_wait_for_returns_the_first_probe(fleet, monkeypatch):
    clock = Clock(monkeypatch, step=1.0)
    shell = ScriptedShell({"GPU probe": (0, probe_output([(11, 500)]), "")})
    assert lifecycle.wait_memory_released(shell, fleet, "n0", set())["host"] == "n0"
    assert len(shell.calls) == 1 and clock.sleeps == 0


# --- launch -------------------------------------------------------------------------------------------------------

def test_the_launch_spec_is_the_plans_flags_then_metrics_then_the_fleets_extra_args(fleet):
    slot = slots_of(fleet, "n0")[1]
    spec = lifecycle.launch_spec(fleet, slot, {"flags": {"--max-running-requests": 40, "--disable-radix-cache": True}},
                                 with_api_key=True, run_id=RUN)
    assert spec.args == ("--max-running-requests", "40", "--disable-radix-cache", "--enable-metrics",
                         "--reasoning-parser", "qwen3", "--weight-version", "fleetgen/" + RUN)
    assert (spec.python, spec.module, spec.model_path, spec.served_name) == ("/opt/py", "sglang.launch_server",
                                                                               "/models/m", "m")
    assert (spec.port, spec.gpu_ids, spec.bind_host, spec.run_dir, spec.log_dir) == (30001, (1,), "0.0.0.0", "/r", "/l")
    assert spec.api_key_on_stdin is True
    assert lifecycle.launch_spec(fleet, slot, {"flags": {}}, with_api_key=False, run_id=RUN).api_key_on_stdin is False


def test_a_plan_on_a_trial_candidate_launches_and_is_compared_with_its_own_extra_args(fleet):
    slot = slots_of(fleet, "n0")[0]
    challenger = {"flags": {"--max-running-requests": 60}, "candidate": "no_speculation",
                  "extra_args": ["--chunked-prefill-size", "4096"]}
    launched = lifecycle.launch_spec(fleet, slot, challenger, with_api_key=False, run_id=RUN).args
    assert launched == ("--max-running-requests", "60", "--enable-metrics", "--chunked-prefill-size", "4096",
                        "--weight-version", "fleetgen/" + RUN)
    assert "--reasoning-parser" not in lifecycle.kept_server(fleet, slot, challenger, 77)["args"]
    # a plan naming no args of its own (written before the trial) launches with the fleet's
    assert lifecycle.launch_extra_args(fleet, {"flags": {}, "extra_args": None}) == ["--reasoning-parser", "qwen3"]
    assert lifecycle.launch_extra_args(fleet, {"flags": {}, "extra_args": []}) == []


def test_a_launch_carries_its_runs_identity_and_the_keep_comparison_does_not(fleet):
    slot = slots_of(fleet, "n0")[0]
    plan = plans_for(fleet)[("n0", 30000)]
    launched = lifecycle.launch_spec(fleet, slot, plan, with_api_key=False, run_id=RUN).args
    assert launched[-2:] == ("--weight-version", "fleetgen/" + RUN)
    compared = lifecycle.launch_spec(fleet, slot, plan, with_api_key=False, run_id=None).args
    assert compared == launched[:-2]
    # a server kept from an earlier run keeps its own identity: wait_ready compares the flags without it
    assert "--weight-version" not in lifecycle.kept_server(fleet, slot, plan, 77)["args"]
    assert lifecycle.launch_record(fleet, slot, plan, 77, run_id=RUN)["args"][-2:] == [
        "--weight-version", "fleetgen/" + RUN]


def test_the_launch_spec_carries_the_servers_environment():
    fleet = fleet_from_json(fleet_document(env={"CUDA_LAUNCH_BLOCKING": "1"}))
    spec = lifecycle.launch_spec(fleet, fleet.servers()[0], {"flags": {}}, with_api_key=False, run_id=RUN)
    assert spec.env == (("CUDA_LAUNCH_BLOCKING", "1"),)


def test_a_launch_returns_the_last_printed_pid_and_the_record_wait_ready_needs(fleet, caplog):
    slot = slots_of(fleet, "n0")[1]
    plan = plans_for(fleet)[("n0", 30001)]
    shell = ScriptedShell({"launch of": (0, "launched port=30001 pid=400\nlaunched port=30001 pid=401\n", "")})
    with caplog.at_level("INFO", logger=lifecycle.__name__):
        record = lifecycle.launch_server(shell, fleet, slot, plan, None, run_id=RUN)
    assert [r.getMessage() for r in caplog.records] == ["launched n0:30001 on GPU(s) [1]: pid 401, log /l/sglang-30001.log"]
    spec = lifecycle.launch_spec(fleet, slot, plan, with_api_key=False, run_id=RUN)
    assert record == {**slot.to_dict(), "pid": 401, "log_path": "/l/sglang-30001.log", "plan": plan,
                      "command": " ".join(spec.argv()), "args": spec.argv()[3:], "kept": False}
    [call] = shell.calls
    assert call["stdin"] is None and call["check"] is False and call["timeout_s"] == 60
    assert call["describe"] == "launch of n0:30001" and call["command"] == remote.launch_command(spec)


def test_a_launch_with_a_key_sends_it_on_stdin_and_never_in_the_command(fleet):
    slot = slots_of(fleet, "n0")[0]
    shell = ScriptedShell({"launch of": (0, "launched port=30000 pid=400\n", "")})
    lifecycle.launch_server(shell, fleet, slot, plans_for(fleet)[("n0", 30000)], "s3cret", run_id=RUN)
    [call] = shell.calls
    assert call["stdin"] == remote.api_key_config("s3cret") and "s3cret" not in call["command"]
    assert call["command"] == remote.launch_command(
        lifecycle.launch_spec(fleet, slot, plans_for(fleet)[("n0", 30000)], with_api_key=True, run_id=RUN))


def test_a_refused_launch_names_the_exit_status_and_the_end_of_stderr(fleet):
    slot = slots_of(fleet, "n1")[0]
    shell = ScriptedShell({"launch of": (3, "some output", "x" * 2000 + "port 30000 is held\n")})
    with pytest.raises(ServerStartupError, match=r"launch refused \(exit 3\): x+port 30000 is held") as refused:
        lifecycle.launch_server(shell, fleet, slot, plans_for(fleet)[("n1", 30000)], None, run_id=RUN)
    shown = str(refused.value).split("launch refused (exit 3): ")[1].split("\n")[0]
    assert shown == ("x" * 2000 + "port 30000 is held")[-1000:]  # the last thousand characters
    assert (refused.value.host, refused.value.server, refused.value.kind) == ("n1", "n1:30000", "launch")
    assert refused.value.hint == "a server of ours may still hold the port; run the DAG again or stop it"


def test_a_refused_launch_without_stderr_shows_its_output(fleet):
    shell = ScriptedShell({"launch of": (1, "already running\n", "")})
    with pytest.raises(ServerStartupError, match=r"exit 1\): already running"):
        lifecycle.launch_server(shell, fleet, slots_of(fleet, "n0")[0], plans_for(fleet)[("n0", 30000)], None, run_id=RUN)


def test_a_launch_that_prints_no_pid_is_a_startup_error(fleet):
    shell = ScriptedShell({"launch of": (0, "launched port=30000\n" + "y" * 600 + "\n", "")})
    with pytest.raises(ServerStartupError, match="the launch printed no pid: y{500}$") as silent:
        lifecycle.launch_server(shell, fleet, slots_of(fleet, "n0")[1], plans_for(fleet)[("n0", 30001)], None, run_id=RUN)
    assert (silent.value.host, silent.value.server, silent.value.kind) == ("n0", "n0:30001", "launch")
    shell = ScriptedShell({"launch of": (0, "", "")})
    with pytest.raises(ServerStartupError, match="printed no pid"):
        lifecycle.launch_server(shell, fleet, slots_of(fleet, "n0")[0], plans_for(fleet)[("n0", 30000)], None, run_id=RUN)


def test_a_kept_server_has_the_launch_records_shape_marked_kept(fleet):
    slot = slots_of(fleet, "n1")[0]
    plan = plans_for(fleet)[("n1", 30000)]
    kept = lifecycle.kept_server(fleet, slot, plan, "77")
    assert kept["kept"] is True and kept["pid"] == 77 and kept["plan"] is plan
    assert {k: v for k, v in kept.items() if k != "kept"} == \
        {k: v for k, v in lifecycle.launch_record(fleet, slot, plan, 77, run_id=None).items() if k != "kept"}


# --- servers launched by an earlier try ---------------------------------------------------------------------------

def _cmdline(argv: list[str]) -> str:
    return "\0".join(argv) + "\0"


def _node_with(running: dict[int, tuple[int, str | None]]):
    """Answers for a node whose pid files name ``running``: {port: (pid, /proc cmdline or None when unreadable)}."""
    by_pid = {pid: cmdline for pid, cmdline in running.values()}

    def read_cmdline(command, stdin):
        pid = int(command.split("/proc/")[1].split("/")[0])
        return (0, by_pid[pid], "") if by_pid[pid] is not None else (4, "", "cannot read")

    ours = "".join(f"ours port={port} pid={pid}\n" for port, (pid, _) in running.items())
    return {"our servers": (0, ours, ""), "command line of pid": read_cmdline}


def test_no_slot_to_launch_asks_the_node_nothing(fleet):
    shell = ScriptedShell({})
    assert lifecycle.already_launched(shell, fleet, [], {}, None, run_id=RUN) == ({}, {}) and shell.calls == []


def test_earlier_launches_are_split_into_this_plans_and_another_plans(fleet):
    n0 = slots_of(fleet, "n0")
    plans = plans_for(fleet)
    same = lifecycle.launch_spec(fleet, n0[0], plans[("n0", 30000)], with_api_key=False, run_id=RUN).argv()
    other = lifecycle.launch_spec(fleet, n0[1], {"flags": {"--max-running-requests": 20}}, with_api_key=False, run_id=RUN).argv()
    shell = ScriptedShell(_node_with({30000: (500, _cmdline(same)), 30001: (501, _cmdline(other))}))
    assert lifecycle.already_launched(shell, fleet, n0, plans, None, run_id=RUN) == ({30000: 500}, {30001: 501})
    assert shell.described("our servers")[0]["command"] == remote.our_pids_command(
        run_dir="/r", module="sglang.launch_server", ports=[30000, 30001])
    assert [c["check"] for c in shell.described("command line of pid")] == [False, False]


def test_a_port_with_no_server_of_ours_is_neither_same_nor_other(fleet):
    n0 = slots_of(fleet, "n0")
    plans = plans_for(fleet)
    same = lifecycle.launch_spec(fleet, n0[1], plans[("n0", 30001)], with_api_key=False, run_id=RUN).argv()
    shell = ScriptedShell(_node_with({30001: (501, _cmdline(same))}))
    assert lifecycle.already_launched(shell, fleet, n0, plans, None, run_id=RUN) == ({30001: 501}, {})
    assert len(shell.described("command line of pid")) == 1


def test_an_unreadable_command_line_counts_as_another_plan(fleet):
    n0 = slots_of(fleet, "n0")[:1]
    shell = ScriptedShell(_node_with({30000: (500, None)}))
    assert lifecycle.already_launched(shell, fleet, n0, plans_for(fleet), None, run_id=RUN) == ({}, {30000: 500})


def test_an_earlier_launch_is_compared_with_the_plan_of_its_own_node_when_nodes_share_port_numbers(fleet):
    n1 = slots_of(fleet, "n1")
    plans = plans_for(fleet, {("n0", 30000): 10, ("n1", 30000): 30})
    n1_argv = lifecycle.launch_spec(fleet, n1[0], plans[("n1", 30000)], with_api_key=False, run_id=RUN).argv()
    shell = ScriptedShell(_node_with({30000: (600, _cmdline(n1_argv))}))
    assert lifecycle.already_launched(shell, fleet, n1, plans, None, run_id=RUN) == ({30000: 600}, {})


def test_with_a_key_an_earlier_launch_is_the_same_only_with_its_config_file(fleet):
    slot = slots_of(fleet, "n0")[0]
    plans = plans_for(fleet)
    argv = lifecycle.launch_spec(fleet, slot, plans[("n0", 30000)], with_api_key=True, run_id=RUN).argv()
    with_config = ScriptedShell(_node_with({30000: (500, _cmdline([*argv, "--config", "/r/sglang-30000.yaml"]))}))
    assert lifecycle.already_launched(with_config, fleet, [slot], plans, "k", run_id=RUN) == ({30000: 500}, {})
    without = ScriptedShell(_node_with({30000: (500, _cmdline(argv))}))
    assert lifecycle.already_launched(without, fleet, [slot], plans, "k", run_id=RUN) == ({}, {30000: 500})


def _spec(**changes):
    fields = dict(python="~/venv/bin/python", module="sglang.launch_server", model_path="~/models/m",
                  served_name="~/m", port=30000, gpu_ids=(0,), bind_host="0.0.0.0", run_dir="~/run",
                  log_dir="~/logs", args=("--max-running-requests", "40"))
    return remote.LaunchSpec(**{**fields, **changes})


def test_only_the_interpreter_and_the_model_path_may_have_their_home_expanded():
    argv = _spec().argv()
    assert lifecycle._same_command(["/home/u/venv/bin/python", *argv[1:4], "/home/u/models/m", *argv[5:]], _spec())
    # The served name (index 6) is passed to SGLang as written: an expanded one is another launch.
    assert not lifecycle._same_command([*argv[:6], "/home/u/m", *argv[7:]], _spec())
    # An expansion must end with the path after "~": another directory is another launch.
    assert not lifecycle._same_command(["/home/u/venv/bin/python3", *argv[1:]], _spec())
    assert not lifecycle._same_command(["/home/u/othervenv/bin/python", *argv[1:]], _spec())


def test_a_command_line_without_home_to_expand_must_be_equal_word_for_word():
    spec = _spec(python="/opt/py", model_path="/models/m")
    argv = spec.argv()
    assert lifecycle._same_command(list(argv), spec)
    assert not lifecycle._same_command(["/x/opt/py", *argv[1:]], spec)
    assert not lifecycle._same_command([*argv, "--extra"], spec)
    assert not lifecycle._same_command(argv[:-1], spec)


def test_with_a_key_the_config_flag_must_be_second_to_last():
    spec = _spec(python="/opt/py", model_path="/models/m", api_key_on_stdin=True)
    argv = spec.argv()
    assert lifecycle._same_command([*argv, "--config", "/run/sglang-30000.yaml"], spec)
    assert not lifecycle._same_command([*argv, "/run/sglang-30000.yaml", "--config"], spec)
    assert not lifecycle._same_command([*argv[:-1], "--config", "/run/sglang-30000.yaml"], spec)


# --- version and health -------------------------------------------------------------------------------------------

def test_the_installed_version_is_the_last_line_printed(fleet):
    shell = ScriptedShell({"SGLang version": (0, "a warning\n0.5.2\n", "")})
    assert lifecycle.installed_version(shell, fleet) == ("0.5.2", None)
    [call] = shell.calls
    assert call["check"] is False and call["timeout_s"] == 60
    assert call["command"] == remote.package_version_command("/opt/py", "sglang.launch_server")


def test_an_unknown_version_says_why(fleet):
    failed = ScriptedShell({"SGLang version": (1, "0.5.2\n", "y" * 400 + "No module named sglang\n")})
    version, why = lifecycle.installed_version(failed, fleet)
    assert version is None and why.endswith("No module named sglang") and len(why) == 300
    silent = ScriptedShell({"SGLang version": (0, "  \n", "")})
    assert lifecycle.installed_version(silent, fleet) == (None, "exit 0")
    only_stdout = ScriptedShell({"SGLang version": (2, "broken python\n", "")})
    assert lifecycle.installed_version(only_stdout, fleet) == (None, "broken python")


@pytest.fixture
def http_answers(monkeypatch):
    """Routes httpx.Client to ``answers`` (path -> (status, JSON) or an exception); records the requests."""
    answers, requests = {}, []
    real_client = httpx.Client

    def handler(request):
        requests.append(request)
        answer = answers[request.url.path]
        if isinstance(answer, Exception):
            raise answer
        return httpx.Response(answer[0], json=answer[1])

    def client(**kwargs):
        requests.append(kwargs)
        return real_client(transport=httpx.MockTransport(handler), **kwargs)

    monkeypatch.setattr(httpx, "Client", client)
    return answers, requests


def test_a_healthy_server_answers_its_server_info_with_the_key(fleet, http_answers):
    answers, requests = http_answers
    answers.update({"/health": (200, {}), "/server_info": (200, {"version": "0.5.2"})})
    slot = slots_of(fleet, "n1")[0]
    assert lifecycle.running_server_info(slot, "k") == ({"version": "0.5.2"}, None)
    client, *sent = requests
    assert client["timeout"] == 10.0  # a hung server must not hold the task
    assert [str(r.url) for r in sent] == ["http://10.0.0.6:30000/health", "http://10.0.0.6:30000/server_info"]
    assert all(r.headers["Authorization"] == "Bearer k" for r in sent)
    requests.clear()
    lifecycle.running_server_info(slot, None)
    assert all("Authorization" not in r.headers for r in requests[1:])


def test_an_unhealthy_or_silent_server_says_why(fleet, http_answers):
    answers, _ = http_answers
    slot = slots_of(fleet, "n0")[0]
    answers.update({"/health": (503, {}), "/server_info": (200, {})})
    assert lifecycle.running_server_info(slot, None) == (None, "/health answered HTTP 503")
    answers.update({"/health": (200, {}), "/server_info": (404, {})})
    assert lifecycle.running_server_info(slot, None) == (None, "/server_info answered HTTP 404")
    answers.update({"/health": httpx.ConnectError("refused")})
    assert lifecycle.running_server_info(slot, None) == (None, "ConnectError: refused")


# --- keep or relaunch ---------------------------------------------------------------------------------------------

def info_running(fleet, slot, plan, version="0.5.2") -> dict:
    """The /server_info of a server launched exactly with ``plan``."""
    argv = lifecycle.launch_spec(fleet, slot, plan, with_api_key=False, run_id=RUN).argv()
    info = {"version": version}
    for flag, value in readiness.args_as_flags(argv[3:]).items():
        info[readiness._ALIAS_FIELDS.get(flag) or flag.lstrip("-").replace("-", "_")] = value
    return info


def _serving(monkeypatch, infos: dict):
    """running_server_info answers ``infos[(node, port)]``: an info dict, or a reason it has none."""
    asked = []

    def running_server_info(slot, key):
        asked.append((slot.name, key))
        found = infos[(slot.node, slot.port)]
        return (found, None) if isinstance(found, dict) else (None, found)

    monkeypatch.setattr(lifecycle, "running_server_info", running_server_info)
    return asked


def test_each_server_of_the_node_is_kept_or_relaunched_for_its_own_reason(fleet, monkeypatch):
    fleet = fleet_from_json({**fleet_document(), "nodes": [{**fleet_document()["nodes"][0], "gpus": [0, 1, 2, 3]}]})
    n0 = slots_of(fleet, "n0")
    plans = plans_for(fleet)
    asked = _serving(monkeypatch, {
        ("n0", 30000): info_running(fleet, n0[0], plans[("n0", 30000)]),
        ("n0", 30001): info_running(fleet, n0[1], {"flags": {"--max-running-requests": 20}}),
        ("n0", 30002): "ConnectError: refused"})
    shell = ScriptedShell({"our servers": (0, "ours port=30000 pid=500\nours port=30001 pid=501\n"
                                              "ours port=30002 pid=502\n", ""),
                           "SGLang version": (0, "0.5.2\n", "")})
    decisions = lifecycle.keep_or_relaunch(shell, fleet, "n0", list(plans.values()), force=False, key="k")
    assert [(d["server"], d["port"], d["pid"], d["decision"]) for d in decisions] == [
        ("n0:30000", 30000, 500, "keep"), ("n0:30001", 30001, 501, "relaunch"),
        ("n0:30002", 30002, 502, "relaunch"), ("n0:30003", 30003, None, "relaunch")]
    assert decisions[0]["reasons"] == []
    assert decisions[1]["reasons"] == ["--max-running-requests: running '20', tonight '40'"]
    assert decisions[2]["reasons"] == ["not healthy: ConnectError: refused"]
    assert decisions[3]["reasons"] == ["no server of ours runs on the port"]
    assert asked == [("n0:30000", "k"), ("n0:30001", "k"), ("n0:30002", "k")]
    assert shell.described("our servers")[0]["command"] == remote.our_pids_command(
        run_dir="/r", module="sglang.launch_server", ports=[30000, 30001, 30002, 30003])


def test_a_server_running_another_sglang_version_is_relaunched(fleet, monkeypatch):
    slot = slots_of(fleet, "n1")[0]
    plans = plans_for(fleet)
    _serving(monkeypatch, {("n1", 30000): info_running(fleet, slot, plans[("n1", 30000)], version="0.5.1")})
    shell = ScriptedShell({"our servers": (0, "ours port=30000 pid=9\n", ""), "SGLang version": (0, "0.5.2\n", "")})
    [decision] = lifecycle.keep_or_relaunch(shell, fleet, "n1", list(plans.values()), force=False, key=None)
    assert decision["decision"] == "relaunch"
    assert decision["reasons"] == ["version: running '0.5.1', installed '0.5.2'"]


def test_an_unknown_installed_version_compares_flags_only_and_says_so(fleet, monkeypatch, caplog):
    slot = slots_of(fleet, "n1")[0]
    plans = plans_for(fleet)
    _serving(monkeypatch, {("n1", 30000): info_running(fleet, slot, plans[("n1", 30000)], version="0.4")})
    shell = ScriptedShell({"our servers": (0, "ours port=30000 pid=9\n", ""),
                           "SGLang version": (1, "", "no sglang")})
    with caplog.at_level("WARNING", logger=lifecycle.__name__):
        [decision] = lifecycle.keep_or_relaunch(shell, fleet, "n1", list(plans.values()), force=False, key=None)
    assert decision["decision"] == "keep"
    assert [r.getMessage() for r in caplog.records] == [
        "n1:30000: installed SGLang version unknown (no sglang); compared flags and model only"]


def test_a_known_version_logs_no_warning(fleet, monkeypatch, caplog):
    slot = slots_of(fleet, "n1")[0]
    plans = plans_for(fleet)
    _serving(monkeypatch, {("n1", 30000): info_running(fleet, slot, plans[("n1", 30000)])})
    shell = ScriptedShell({"our servers": (0, "ours port=30000 pid=9\n", ""), "SGLang version": (0, "0.5.2", "")})
    with caplog.at_level("WARNING", logger=lifecycle.__name__):
        lifecycle.keep_or_relaunch(shell, fleet, "n1", list(plans.values()), force=False, key=None)
    assert "version unknown" not in caplog.text


def test_relaunch_servers_relaunches_every_running_server_without_asking_it(fleet, monkeypatch):
    asked = _serving(monkeypatch, {})
    shell = ScriptedShell({"our servers": (0, "ours port=30000 pid=500\nours port=30001 pid=501\n", "")})
    decisions = lifecycle.keep_or_relaunch(shell, fleet, "n0", list(plans_for(fleet).values()), force=True, key=None)
    assert [(d["decision"], d["reasons"]) for d in decisions] == [("relaunch", ["relaunch_servers is set"])] * 2
    assert asked == [] and shell.described("SGLang version") == []


def test_a_node_with_no_server_of_ours_asks_no_version(fleet, monkeypatch):
    _serving(monkeypatch, {})
    shell = ScriptedShell({"our servers": (0, "", "")})
    decisions = lifecycle.keep_or_relaunch(shell, fleet, "n0", list(plans_for(fleet).values()), force=False, key=None)
    assert [d["decision"] for d in decisions] == ["relaunch", "relaunch"]
    assert shell.described("SGLang version") == []


def test_a_kept_server_is_checked_against_its_own_nodes_plan_when_nodes_share_port_numbers(fleet, monkeypatch):
    plans = plans_for(fleet, {("n0", 30000): 10, ("n1", 30000): 30})
    n1 = slots_of(fleet, "n1")[0]
    _serving(monkeypatch, {("n1", 30000): info_running(fleet, n1, plans[("n1", 30000)])})
    shell = ScriptedShell({"our servers": (0, "ours port=30000 pid=9\n", ""), "SGLang version": (0, "0.5.2", "")})
    [decision] = lifecycle.keep_or_relaunch(shell, fleet, "n1", list(plans.values()), force=False, key=None)
    assert (decision["server"], decision["decision"]) == ("n1:30000", "keep")


def test_a_server_serving_another_model_path_is_relaunched(fleet, monkeypatch):
    slot = slots_of(fleet, "n1")[0]
    plans = plans_for(fleet)
    info = {**info_running(fleet, slot, plans[("n1", 30000)]), "model_path": "/models/yesterday"}
    _serving(monkeypatch, {("n1", 30000): info})
    shell = ScriptedShell({"our servers": (0, "ours port=30000 pid=9\n", ""), "SGLang version": (0, "0.5.2", "")})
    [decision] = lifecycle.keep_or_relaunch(shell, fleet, "n1", list(plans.values()), force=False, key=None)
    assert decision["reasons"] == ["--model-path: running '/models/yesterday', tonight '/models/m'"]


def test_a_failed_read_of_the_command_line_is_another_plan_whatever_it_printed(fleet):
    slot = slots_of(fleet, "n0")[0]
    plans = plans_for(fleet)
    argv = lifecycle.launch_spec(fleet, slot, plans[("n0", 30000)], with_api_key=False, run_id=RUN).argv()
    shell = ScriptedShell({"our servers": (0, "ours port=30000 pid=500\n", ""),
                           "command line of pid": (1, _cmdline(argv), "read error")})
    assert lifecycle.already_launched(shell, fleet, [slot], plans, None, run_id=RUN) == ({}, {30000: 500})
