"""Command builders: quoting (property-based, through a real bash), launch/stop shapes, sections."""

import hashlib
import json
import os
import shlex
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from fleetgen.nodes import remote

RUN = "manual__2026-12-03T22:00:00+00:00"  # the run whose launches carry its identity

# Anything a hostile fleet file could hold: quotes, $(...), backticks, newlines, globs, unicode. No NUL:
# no argv can carry one.
hostile_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                       min_size=1, max_size=40)


@settings(max_examples=150, deadline=None)
@given(hostile_text)
def test_quote_reaches_bash_as_one_word(value):
    out = subprocess.run(["bash", "-c", 'printf "%s\\0" ' + remote.quote(value)], capture_output=True, check=True)
    assert out.stdout.split(b"\0")[:-1] == [value.encode()]


def test_tilde_prefix_stays_expandable_in_paths():
    out = subprocess.run(["bash", "-c", "printf %s " + remote.quote_path("~/a b/$x")], capture_output=True,
                         check=True, env={**os.environ, "HOME": "/home/u"})
    assert out.stdout == b"/home/u/a b/$x"


def test_a_path_as_the_node_reports_it_is_the_path_given_or_its_home_expanded():
    assert remote.as_expanded("/models/m", "/models/m") and remote.as_expanded("/home/u/models/m", "~/models/m")
    assert not remote.as_expanded("/home/u/models/m", "/models/m")  # only a ~/ path is expanded
    assert not remote.as_expanded("/home/u/models/other", "~/models/m")
    assert not remote.as_expanded("~/models/m", "/home/u/models/m")


def test_a_home_expanded_path_matches_its_folders_whole_not_a_folder_ending_in_the_same_letters():
    assert not remote.as_expanded("/home/u/old-models/m", "~/models/m")


ARGV_DUMP = "import json, sys\nprint(json.dumps(sys.argv[1:]), flush=True)\n"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(model_path=hostile_text.filter(lambda p: not p.startswith("~")), served_name=hostile_text, extra=st.lists(hostile_text, max_size=4))
def test_launch_command_passes_hostile_values_as_single_words(tmp_path, model_path, served_name, extra):
    # A folder per example: the previous example's process may not have exited yet on a loaded machine,
    # and its pid file would then (rightly) refuse this launch as "our server still running".
    tmp_path = Path(tempfile.mkdtemp(dir=tmp_path))
    (tmp_path / "argvdump.py").write_text(ARGV_DUMP)
    spec = remote.LaunchSpec(python=sys.executable, module="argvdump", model_path=model_path,
                             served_name=served_name, port=31234, gpu_ids=(3,), bind_host="127.0.0.1",
                             run_dir=str(tmp_path / "run dir"), log_dir=str(tmp_path / "logs $x"),
                             args=tuple(extra), env=(("PYTHONPATH", str(tmp_path)),))
    result = subprocess.run(["bash", "-c", remote.launch_command(spec)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    log_path = tmp_path / "logs $x" / "sglang-31234.log"
    deadline = time.monotonic() + 60  # a loaded machine can take a while to start python
    while not log_path.read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.02)
    argv = json.loads(log_path.read_text())
    assert argv == ["--model-path", model_path, "--served-model-name", served_name, "--host", "127.0.0.1",
                    "--port", "31234", *extra]
    assert (tmp_path / "run dir" / "sglang-31234.pid").read_text().strip().isdigit()


def test_api_key_travels_on_stdin_into_a_0600_config_file_never_into_argv(tmp_path):
    from sglang_sim.args import parse_args

    (tmp_path / "argvdump.py").write_text(ARGV_DUMP)
    secret = "sk-very-secret: #0123 'q' \"d\" $(x) true"  # YAML- and shell-significant characters
    config_path = tmp_path / "sglang-31235.yaml"
    planted = tmp_path / "planted"
    config_path.symlink_to(planted)  # a link planted where the file goes is replaced, not written through
    spec = remote.LaunchSpec(python=sys.executable, module="argvdump", model_path="/m", served_name="m",
                             port=31235, gpu_ids=(0,), bind_host="127.0.0.1", run_dir=str(tmp_path),
                             log_dir=str(tmp_path), env=(("PYTHONPATH", str(tmp_path)),), api_key_on_stdin=True)
    command = remote.launch_command(spec)
    assert secret not in command
    subprocess.run(["bash", "-c", command], input=remote.api_key_config(secret), text=True, check=True,
                   capture_output=True)
    log_path = tmp_path / "sglang-31235.log"
    deadline = time.monotonic() + 60  # a loaded machine can take a while to start python
    while not log_path.read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.02)
    argv = json.loads(log_path.read_text())
    assert argv[-2:] == ["--config", str(config_path)] and not any(secret in word for word in argv)
    assert not planted.exists() and not config_path.is_symlink()
    assert stat.S_IMODE(config_path.stat().st_mode) == 0o600
    # The server's parser (SGLang's --config merge) reads the key back exactly.
    assert parse_args(["--model-path", "m", *argv[-2:]]).api_key == secret


@pytest.mark.parametrize("key", ["-starts-like-a-flag", "two\nlines", ""])
def test_api_keys_sglang_could_not_read_are_refused_without_echoing_them(key):
    with pytest.raises(ValueError) as refused:
        remote.api_key_config(key)
    assert key not in str(refused.value) or not key


def test_flags_to_args():
    assert remote.flags_to_args({"--mem-fraction-static": 0.93, "--disable-radix-cache": True,
                                 "--max-mamba-cache-size": None, "--enable-x": False}) == [
        "--mem-fraction-static", "0.93", "--disable-radix-cache"]


def test_sections_round_trip():
    command = remote.sections_command({"a": "echo one; echo two", "b": "echo three; exit 3"})
    out = subprocess.run(["bash", "-c", command], capture_output=True, text=True).stdout
    assert remote.split_sections(out) == {"a": (0, "one\ntwo"), "b": (3, "three")}


def test_read_file_command_refuses_missing_and_large(tmp_path):
    big = tmp_path / "big"
    big.write_bytes(b"x" * 100)
    missing = subprocess.run(["bash", "-c", remote.read_file_command(str(tmp_path / "nope"))], capture_output=True, text=True)
    assert missing.returncode == 4 and "cannot read" in missing.stderr
    large = subprocess.run(["bash", "-c", remote.read_file_command(str(big), max_bytes=10)], capture_output=True, text=True)
    assert large.returncode == 5 and "100 bytes" in large.stderr


def test_parse_records_reads_the_tagged_lines_the_builders_print():
    output = ("noise before\nstopped port=30000 pid=41 signal=TERM\nstale port=30001 pid=7\n"
              "absent port=30002 pid=\nlaunched port=30003 pid=99\nours port=30004 pid=5 extra\n")
    assert remote.parse_records(output, ("stopped", "stale", "absent")) == [
        ("stopped", {"port": "30000", "pid": "41", "signal": "TERM"}), ("stale", {"port": "30001", "pid": "7"}),
        ("absent", {"port": "30002", "pid": ""})]
    assert remote.parse_records(output, ("launched",)) == [("launched", {"port": "30003", "pid": "99"})]
    assert remote.parse_records("launchedport=1\n", ("launched",)) == []


FLEET_YAML = """
model: {path: /models/m, served_name: m}
server: {python: python3, module: sglang.launch_server, extra_args: [--reasoning-parser, qwen3]}
nodes: [{name: node0, ssh_conn_id: c, address: 10.0.0.5, gpus: [0], base_port: 30000}]
"""


def test_every_server_is_launched_with_sglangs_metrics_on_exactly_once():
    from fleetgen.airflow.lifecycle import launch_spec
    from fleetgen.nodes.fleet import load_fleet_text

    fleet = load_fleet_text(FLEET_YAML, source="test")
    slot = fleet.servers()[0]
    argv = launch_spec(fleet, slot, {"flags": {"--max-running-requests": 40}}, with_api_key=False, run_id=None).argv()
    assert argv.count("--enable-metrics") == 1 and argv[-2:] == ["--reasoning-parser", "qwen3"]
    user_asked = load_fleet_text(FLEET_YAML.replace("[--reasoning-parser, qwen3]", "[--enable-metrics]"), source="t")
    argv = launch_spec(user_asked, slot, {"flags": {}}, with_api_key=False, run_id=RUN).argv()
    assert argv.count("--enable-metrics") == 1


def test_the_sampling_loop_and_the_version_command_quote_what_they_are_given():
    command = remote.sampling_loop_command("nvidia-smi -L", interval_s=2.5, max_seconds=60)
    assert "sleep 2.5" in command and "+ 60 ))" in command
    assert remote.timed_sample_time("@@fleetgen:t=1764400000.123456789") == 1764400000.123456789
    assert remote.timed_sample_time("0, 97, 900, 1024") is None
    version = remote.package_version_command("~/venv/bin/python", "sglang.launch_server")
    assert version.startswith('"$HOME"/venv/bin/python -c ') and version.endswith(" sglang")


def test_the_scheduler_log_command_reads_the_peak_of_dense_and_hybrid_decode_lines(tmp_path):
    # SGLang 0.5.23's Decode batch lines (scheduler_components/pool_stats_observer.py): "#token: N" on a dense
    # model, "#full token: N" on a hybrid one; the other "token" fields are not the KV held
    dense = ("[2026-12-01 14:55:08] Prefill batch, #new-seq: 1, #new-token: 9000, #cached-token: 8000, "
             "token usage: 0.00, #running-req: 0, #queue-req: 0, #pending-token: 7000, cuda graph: False\n"
             "[2026-12-01 14:55:08] Decode batch, #running-req: 1, #token: 42, token usage: 0.00, cuda graph: False, "
             "gen throughput (token/s): 6.34, #queue-req: 0\n"
             "[2026-12-01 14:55:09] Decode batch, #running-req: 2, #token: 4321, token usage: 0.13, cuda graph: True, "
             "gen throughput (token/s): 90.12, #queue-req: 0\n"
             "[2026-12-01 14:55:10] Decode batch, #running-req: 1, #token: 77, token usage: 0.00, cuda graph: True, "
             "gen throughput (token/s): 60.00, #queue-req: 0\n"
             "[2026-12-01 14:55:11] KV cache pool is full. Retract requests. #retracted_reqs: 2, "
             "#new_tokens_gained: 100, #new_token_ratio: 0.7000 -> 0.5000\n")
    hybrid = ("[2026-12-01 14:57:36] Decode batch, #running-req: 1, #full token: 41, full token usage: 0.00, "
              "mamba num: 2, mamba usage: 0.12, cuda graph: False, gen throughput (token/s): 6.70, #queue-req: 0\n"
              "[2026-12-01 14:57:37] Decode batch, #running-req: 3, #full token: 1234, full token usage: 0.04, "
              "#swa token: 99999, swa token usage: 0.50, cuda graph: True, gen throughput (token/s): 9.00, "
              "#queue-req: 0\n")
    (tmp_path / remote.log_file(str(tmp_path), 31001).rsplit("/", 1)[1]).write_text(dense)
    (tmp_path / remote.log_file(str(tmp_path), 31002).rsplit("/", 1)[1]).write_text(hybrid)
    out = subprocess.run(["bash", "-c", remote.scheduler_log_command(str(tmp_path), [31001, 31002])],
                         capture_output=True, text=True, check=True).stdout
    assert remote.parse_records(out, ("scheduler",)) == [
        ("scheduler", {"port": "31001", "peak_full_tokens": "4321", "retracted": "2"}),
        ("scheduler", {"port": "31002", "peak_full_tokens": "1234", "retracted": "0"})]


@pytest.mark.parametrize("gpu_ids, args, tp_args", [
    ((0, 1), ("--dp-size", "2"), []),                           # two tp-1 replicas
    ((0, 1, 2, 3), ("--data-parallel-size=2",), ["--tp-size", "2"]),  # two tp-2 replicas
    ((0, 1), (), ["--tp-size", "2"]),
])
def test_data_parallel_replicas_split_the_gpus_into_tp_groups(gpu_ids, args, tp_args):
    spec = remote.LaunchSpec(python="python", module="sglang.launch_server", model_path="/m", served_name="m",
                             port=30000, gpu_ids=gpu_ids, bind_host="127.0.0.1", run_dir="/r", log_dir="/l", args=args)
    argv = spec.argv()
    assert argv[argv.index("30000") + 1:] == tp_args + list(args)


ENV_DUMP = ("import json, os, sys\nprint(json.dumps({'argv': sys.argv[1:], 'value': os.environ.get('FLEETGEN_T'),"
            " 'cuda': os.environ.get('CUDA_VISIBLE_DEVICES')}), flush=True)\n")


SLEEPER = "import signal, sys, time\nif 'ignore-term' in sys.argv: signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('up', flush=True)\ntime.sleep(600)\n"


def _bash(command, **kwargs):
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60, **kwargs)


def _spec(tmp_path, module, port, **overrides):
    fields = dict(python=sys.executable, module=module, model_path="/m", served_name="m", port=port, gpu_ids=(0,),
                  bind_host="127.0.0.1", run_dir=str(tmp_path / "run"), log_dir=str(tmp_path / "logs"),
                  env=(("PYTHONPATH", str(tmp_path)),))
    return remote.LaunchSpec(**{**fields, **overrides})


def _log_json(path):
    deadline = time.monotonic() + 60  # a loaded machine can take a while to start python
    while not (path.exists() and path.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return json.loads(path.read_text())


def test_environment_values_with_spaces_and_quotes_reach_the_server_intact(tmp_path):
    (tmp_path / "envdump.py").write_text(ENV_DUMP)
    value = "a b 'c' \"d\" $(echo e) ;f"
    spec = _spec(tmp_path, "envdump", 31240, gpu_ids=(0, 2),
                 env=(("PYTHONPATH", str(tmp_path)), ("FLEETGEN_T", value)))
    result = _bash(remote.launch_command(spec))
    assert result.returncode == 0, result.stderr
    dumped = _log_json(tmp_path / "logs" / "sglang-31240.log")
    assert dumped["value"] == value and dumped["cuda"] == "0,2"
    assert dumped["argv"][-2:] == ["--tp-size", "2"]
    assert f"launched port=31240 pid={(tmp_path / 'run' / 'sglang-31240.pid').read_text().strip()}" in result.stdout


def test_one_gpu_means_no_tensor_parallel_flag():
    spec = remote.LaunchSpec(python="py", module="sglang.launch_server", model_path="/m", served_name="m",
                             port=1, gpu_ids=(5,), bind_host="h", run_dir="/r", log_dir="/l", args=("--x", "1"))
    assert spec.argv() == ["py", "-m", "sglang.launch_server", "--model-path", "/m", "--served-model-name", "m",
                           "--host", "h", "--port", "1", "--x", "1"]


def _launch_sleeper(tmp_path, port):
    (tmp_path / "fakeserver.py").write_text(SLEEPER)
    result = _bash(remote.launch_command(_spec(tmp_path, "fakeserver", port)))
    assert result.returncode == 0, result.stderr
    return int(result.stdout.split("pid=")[1].split()[0])


@pytest.fixture
def processes():
    started = []
    yield started
    for process in started:
        process.kill()
        process.wait()


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_a_port_that_prefixes_another_does_not_match_its_server(tmp_path):
    pid = _launch_sleeper(tmp_path, 31010)
    try:
        # Port 3101's pid file names the server of port 31010: " --port 3101" is a prefix of its command line.
        (tmp_path / "run" / "sglang-3101.pid").write_text(f"{pid}\n")
        ours = _bash(remote.our_pids_command(run_dir=str(tmp_path / "run"), module="fakeserver", ports=[3101, 31010]))
        assert (ours.stdout, ours.stderr) == (f"ours port=31010 pid={pid}\n", "")
        out = _bash(remote.stop_command(run_dir=str(tmp_path / "run"), module="fakeserver", ports=[3101],
                                        grace_s=1))
        assert (out.stdout, out.stderr) == (f"stale port=3101 pid={pid}\n", "") and _alive(pid)
    finally:
        _bash(remote.stop_command(run_dir=str(tmp_path / "run"), module="fakeserver", ports=[31010], grace_s=1))


def test_a_stranger_on_our_port_but_another_module_is_never_signalled(tmp_path, processes):
    stranger = subprocess.Popen([sys.executable, "-c", SLEEPER, "--port", "31011", "x"], stdout=subprocess.PIPE)
    processes.append(stranger)
    stranger.stdout.readline()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "sglang-31011.pid").write_text(f"{stranger.pid}\n")
    ours = _bash(remote.our_pids_command(run_dir=str(tmp_path / "run"), module="fakeserver", ports=[31011]))
    assert ours.stdout == ""
    out = _bash(remote.stop_command(run_dir=str(tmp_path / "run"), module="fakeserver", ports=[31011], grace_s=1))
    assert out.stdout == f"stale port=31011 pid={stranger.pid}\n"
    time.sleep(0.2)
    assert stranger.poll() is None and not (tmp_path / "run" / "sglang-31011.pid").exists()


# Exits on TERM only once its partner got TERM too (each marks its TERM in a file beside it): stopped one after
# another, the first would wait out the grace for a partner not yet signalled and be KILLed.
PARTNER = (
    "import os, signal, sys, time\n"
    "port = sys.argv[sys.argv.index('--port') + 1]\n"
    "mine, partner = f'{os.environ[\"MARKS\"]}/{port}', os.environ['PARTNER']\n"
    "def on_term(*_):\n"
    "    open(mine, 'w').close()\n"
    "    deadline = time.monotonic() + 30\n"
    "    while not os.path.exists(partner) and time.monotonic() < deadline:\n"
    "        time.sleep(0.01)\n"
    "    sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, on_term)\n"
    "print('up', flush=True)\n"
    "time.sleep(600)\n")


def test_the_servers_of_a_node_are_stopped_at_once_not_one_after_another(tmp_path):
    (tmp_path / "partnered.py").write_text(PARTNER)
    marks = tmp_path / "marks"
    marks.mkdir()
    for port, partner in ((31020, 31021), (31021, 31020)):
        spec = _spec(tmp_path, "partnered", port, env=(("PYTHONPATH", str(tmp_path)), ("MARKS", str(marks)),
                                                       ("PARTNER", str(marks / str(partner)))))
        assert _bash(remote.launch_command(spec)).returncode == 0
    for port in (31020, 31021):  # both up (their TERM handler set) before the stop
        _log_json_line(tmp_path / "logs" / f"sglang-{port}.log")
    out = _bash(remote.stop_command(run_dir=str(tmp_path / "run"), module="partnered", ports=[31020, 31021],
                                    grace_s=3))
    lines = sorted(out.stdout.splitlines())
    assert [line.split(" pid=")[0] for line in lines] == ["stopped port=31020", "stopped port=31021"]
    assert all(line.endswith("signal=TERM") for line in lines), lines


def _log_json_line(path):
    deadline = time.monotonic() + 60
    while not (path.exists() and "up" in path.read_text()) and time.monotonic() < deadline:
        time.sleep(0.02)


def test_refused_relaunch_names_port_and_pid(tmp_path):
    pid = _launch_sleeper(tmp_path, 31012)
    try:
        refused = _bash(remote.launch_command(_spec(tmp_path, "fakeserver", 31012)))
        assert refused.returncode == 3
        assert refused.stderr.strip() == f"refused: our server on port 31012 is still running (pid {pid})"
    finally:
        _bash(remote.stop_command(run_dir=str(tmp_path / "run"), module="fakeserver", ports=[31012], grace_s=1))


def test_the_tail_command_prints_the_last_lines_and_nothing_for_a_missing_log(tmp_path):
    log = tmp_path / "a log"
    log.write_text("".join(f"{i}\n" for i in range(80)))
    assert _bash(remote.tail_command(str(log), lines=3)).stdout == "77\n78\n79\n"
    assert _bash(remote.tail_command(str(log))).stdout.splitlines()[0] == "30"
    missing = _bash(remote.tail_command(str(tmp_path / "none")))
    assert (missing.returncode, missing.stdout) == (0, "")


def test_read_file_command_prints_the_file_and_names_it_when_refusing(tmp_path):
    good = tmp_path / "a b.json"
    good.write_text("{}\n")
    assert _bash(remote.read_file_command(str(good))).stdout == "{}\n"
    missing = _bash(remote.read_file_command(str(tmp_path / "nope")))
    assert missing.stderr.strip() == f"cannot read {tmp_path / 'nope'}"
    large = _bash(remote.read_file_command(str(good), max_bytes=2))
    assert (large.returncode, large.stderr.strip()) == (5, f"{good} is 3 bytes, more than 2")


def test_paths_and_helpers():
    assert remote.quote_path("~") == '"$HOME"'
    assert remote.quote_path("/a b") == "'/a b'"
    assert remote.quote_path("~user/x") == "'~user/x'"
    assert remote.quote(3) == "3"
    assert remote.pid_file("/run/", 7) == "/run/sglang-7.pid"
    assert remote.log_file("/logs//", 7) == "/logs/sglang-7.log"
    assert remote.pid_file("/runX/", 7) == "/runX/sglang-7.pid" and remote.log_file("/lX", 7) == "/lX/sglang-7.log"
    with pytest.raises(ValueError, match="flag names start with '--': 'mem'"):
        remote.flags_to_args({"mem": 1})
    assert remote.flags_to_args({"--a": 0, "--b": "x"}) == ["--a", "0", "--b", "x"]
    assert remote.flags_to_args({"--off": False, "--none": None, "--on": True, "--n": 2}) == ["--on", "--n", "2"]


def test_split_sections_ignores_text_outside_sections():
    marker = remote.SECTION_MARKER
    output = f"banner\n{marker}rc=9\n{marker}a\n\n{marker}rc=0\nnoise\n{marker}b\nx\n"
    assert remote.split_sections(output) == {"a": (0, "")}
    both = _bash(remote.sections_command({"first $(x)": "echo 1", "second": "echo 2; exit 7"})).stdout
    assert remote.split_sections(both) == {"first $(x)": (0, "1"), "second": (7, "2")}


def test_parse_records_keeps_only_the_asked_tags_in_order():
    output = ("noise port=1\nstopped port=31000 pid=7 signal=TERM\n\nabsent port=31001\n"
              "ours port=2 pid=3 note=a=b bare\nstale port=31002 pid=9\n")
    assert remote.parse_records(output, ("stopped", "absent", "stale")) == [
        ("stopped", {"port": "31000", "pid": "7", "signal": "TERM"}), ("absent", {"port": "31001"}),
        ("stale", {"port": "31002", "pid": "9"})]
    assert remote.parse_records(output, ["ours"]) == [("ours", {"port": "2", "pid": "3", "note": "a=b"})]


def test_watch_reads_the_log_tail_then_whether_the_pid_lives(tmp_path, processes):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    processes.append(sleeper)
    log = tmp_path / "s.log"
    log.write_text("".join(f"line {i}\n" for i in range(60)))
    alive, lines = remote.parse_watch(_bash(remote.watch_command(str(log), sleeper.pid)).stdout)
    assert alive is True and lines == [f"line {i}" for i in range(10, 60)]
    assert remote.parse_watch(_bash(remote.watch_command(str(log), 2**22 + 1, lines=2)).stdout) == (
        False, ["line 58", "line 59"])
    assert remote.parse_watch("a\nb\n") == (None, ["a", "b"])  # cut short: no mark


def test_a_flag_left_out_does_not_drop_the_flags_after_it():
    assert remote.flags_to_args({"--max-mamba-cache-size": None, "--mem-fraction-static": 0.9, "--enable-x": False,
                                 "--disable-radix-cache": True}) == ["--mem-fraction-static", "0.9",
                                                                     "--disable-radix-cache"]


@pytest.mark.parametrize("folder", ["/srv/BOX", "/srv/BOX/", "/srv/BOX//"])
def test_pid_log_and_config_files_keep_the_folder_name_and_drop_trailing_slashes(folder):
    assert remote.pid_file(folder, 30000) == "/srv/BOX/sglang-30000.pid"
    assert remote.log_file(folder, 30000) == "/srv/BOX/sglang-30000.log"
    assert remote.config_file(folder, 30000) == "/srv/BOX/sglang-30000.yaml"


def test_launch_guard_reads_the_servers_own_pid_file(tmp_path):
    """A second launch on the port of a live server of ours is refused; the guard checks this port's pid file."""
    (tmp_path / "fakeserver.py").write_text(SLEEPER)
    spec = remote.LaunchSpec(python=sys.executable, module="fakeserver", model_path="/m", served_name="m", port=31011,
                             gpu_ids=(0,), bind_host="127.0.0.1", run_dir=str(tmp_path / "run"),
                             log_dir=str(tmp_path / "logs"), args=(), env=(("PYTHONPATH", str(tmp_path)),))
    command = remote.launch_command(spec)
    pid_path = remote.quote_path(remote.pid_file(spec.run_dir, spec.port))
    assert f"if [ -s {pid_path} ] && fleetgen_pid=$(head -c 32 -- {pid_path})" in command
    first = _bash(command)
    assert first.returncode == 0, first.stderr
    pid = int(first.stdout.split("pid=")[1].split()[0])
    try:
        # Wait until the process runs our module (setsid has exec'd python with its argv).
        for _ in range(600):
            path = f"/proc/{pid}/cmdline"
            if os.path.exists(path) and "fakeserver" in open(path).read():
                break
            time.sleep(0.05)
        again = _bash(command)
        assert again.returncode == 3
        assert again.stderr.strip() == f"refused: our server on port 31011 is still running (pid {pid})"
        assert (tmp_path / "run" / "sglang-31011.pid").read_text().strip() == str(pid)
    finally:
        stopped = _bash(remote.stop_command(run_dir=spec.run_dir, module="fakeserver", ports=[31011], grace_s=2.0))
        assert stopped.stderr == ""
        assert f"stopped port=31011 pid={pid}" in stopped.stdout


def test_stop_and_our_pids_scripts_run_without_shell_errors(tmp_path):
    run_dir = str(tmp_path / "run")
    stop = _bash(remote.stop_command(run_dir=run_dir, module="fakeserver", ports=[31012, 31013], grace_s=0.1))
    assert (stop.returncode, stop.stderr) == (0, "")
    assert sorted(stop.stdout.splitlines()) == ["absent port=31012", "absent port=31013"]
    ours = _bash(remote.our_pids_command(run_dir=run_dir, module="fakeserver", ports=[31012]))
    assert (ours.returncode, ours.stdout, ours.stderr) == (0, "", "")


def test_a_launch_truncates_the_log_of_the_previous_launch(tmp_path):
    """The log holds the last launch only (scheduler_log_command reads it as such)."""
    (tmp_path / "fakeserver.py").write_text(SLEEPER)
    (tmp_path / "logs").mkdir()
    log_path = tmp_path / "logs" / "sglang-31014.log"
    log_path.write_text("Decode batch. #full token: 999999, stale line of the previous launch\n")
    spec = remote.LaunchSpec(python=sys.executable, module="fakeserver", model_path="/m", served_name="m", port=31014,
                             gpu_ids=(0,), bind_host="127.0.0.1", run_dir=str(tmp_path / "run"),
                             log_dir=str(tmp_path / "logs"), args=(), env=(("PYTHONPATH", str(tmp_path)),))
    launched = _bash(remote.launch_command(spec))
    try:
        assert launched.returncode == 0, launched.stderr
        assert "stale line" not in log_path.read_text()
    finally:
        _bash(remote.stop_command(run_dir=spec.run_dir, module="fakeserver", ports=[31014], grace_s=2.0))


def test_the_sampling_loop_runs_the_query_between_time_markers_without_shell_errors():
    result = _bash(remote.sampling_loop_command("echo sample", interval_s=0.2, max_seconds=1))
    assert (result.returncode, result.stderr) == (0, "")
    lines = result.stdout.splitlines()
    assert lines and len(lines) % 2 == 0
    assert all(remote.timed_sample_time(marker) is not None for marker in lines[0::2])
    assert set(lines[1::2]) == {"sample"}


def test_the_scheduler_log_command_prints_one_line_per_port(tmp_path):
    (tmp_path / "sglang-31015.log").write_text("Decode batch. #full token: 1234, #retracted_reqs: 2\n")
    result = _bash(remote.scheduler_log_command(str(tmp_path), [31015, 31016]))
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.splitlines() == ["scheduler port=31015 peak_full_tokens=1234 retracted=2",
                                          "scheduler port=31016 missing=1"]


def test_the_package_version_command_prints_the_providers_version():
    result = _bash(remote.package_version_command(sys.executable, "pytest.main"))
    assert (result.returncode, result.stdout.strip()) == (0, pytest.__version__)


@pytest.mark.parametrize("key", ["", "line\nbreak", "carriage\rreturn", "-flag"])
def test_api_keys_sglang_could_not_read_are_refused_with_the_rule(key):
    with pytest.raises(ValueError) as refused:
        remote.api_key_config(key)
    assert str(refused.value) == "an API key is one line that does not start with '-'"


def test_a_malformed_environment_name_is_refused_by_name():
    spec = remote.LaunchSpec(python="python", module="m", model_path="/m", served_name="m", port=1, gpu_ids=(0,),
                             bind_host="127.0.0.1", run_dir="/r", log_dir="/l", env=(("A B", "1"),))
    with pytest.raises(ValueError) as refused:
        remote.launch_command(spec)
    assert str(refused.value) == "not an environment variable name: 'A B'"


def test_the_package_version_comes_from_the_distribution_without_importing_it(tmp_path):
    """A package whose import would fail (or take long: ``import sglang`` loads torch) still names its version
    when a distribution of that name is installed."""
    site = tmp_path / "site"
    (site / "slowpkg").mkdir(parents=True)
    (site / "slowpkg" / "__init__.py").write_text("raise SystemExit('imported')\n")
    (site / "slowpkg-1.2.3.dist-info").mkdir()
    (site / "slowpkg-1.2.3.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: slowpkg\nVersion: 1.2.3\n")
    result = _bash(f"PYTHONPATH={site} " + remote.package_version_command(sys.executable, "slowpkg.server"))
    assert (result.returncode, result.stdout.strip()) == (0, "1.2.3"), result.stderr
    # a module without a distribution of its name (the simulator's sglang_sim) still reports its __version__
    (site / "plainpkg").mkdir()
    (site / "plainpkg" / "__init__.py").write_text("__version__ = '0.5.23'\n")
    result = _bash(f"PYTHONPATH={site} " + remote.package_version_command(sys.executable, "plainpkg.server"))
    assert (result.returncode, result.stdout.strip()) == (0, "0.5.23"), result.stderr


@pytest.mark.parametrize(("args", "size"), [
    ([], 1),
    (["--tp-size", "2", "--dp-size", "4"], 4),
    (["--tp-size", "2", "--data-parallel-size=3"], 3),
    (["--dp-size=4", "--mem-fraction-static", "0.8", "--dp-size", "2"], 2),
    (["--dp-size", "0"], 1),
    (["--dp-size", "many"], 1),
    (["--dp-size=-2"], 1),
    (["--dp-size", "4", "--dp-size"], 1),
])
def test_the_data_parallel_size_is_the_last_positive_dp_flag_of_the_arguments(args, size):
    """argparse keeps the last ``--dp-size``; a missing, zero or non-numeric value, or a flag that ends the
    arguments with no value after it, means one replica."""
    assert remote.dp_size_of_args(args) == size


def _safetensors(header: dict, tensors: bytes) -> bytes:
    text = json.dumps(header).encode()
    return len(text).to_bytes(8, "little") + text + tensors


def test_the_model_identity_command_passes_the_program_its_folders_and_spec_as_single_words(tmp_path):
    python, model = str(tmp_path / "bin dir" / "py'thon"), str(tmp_path / "my $model")
    command = remote.model_identity_command(
        python, model, tokenizer_root="~/tok x", small_files=("config.json", "a b.json"),
        tokenizer_files=("tokenizer.json",), template_file="~/t.jinja", full=True, samples=3, sample_bytes=16)
    # a leading ~/ of the tokenizer folder stays expandable on the node
    assert """ "$HOME"/'tok x' """ in command
    words = shlex.split(command)
    assert words[:5] == [python, "-c", remote._MODEL_IDENTITY_PROGRAM, model, "$HOME/tok x"] and len(words) == 6
    assert json.loads(words[5]) == {"small_files": ["config.json", "a b.json"], "tokenizer_files": ["tokenizer.json"],
                                    "template_file": "~/t.jinja", "full": True, "samples": 3, "sample_bytes": 16}
    assert json.loads(shlex.split(remote.model_identity_command(
        "python", model, tokenizer_root=model, small_files=[], tokenizer_files=[], template_file="", full=0,
        samples="2", sample_bytes="8"))[-1]) == {"small_files": [], "tokenizer_files": [], "template_file": "",
                                                 "full": False, "samples": 2, "sample_bytes": 8}


def test_the_model_identity_command_prints_the_digests_of_the_model_tokenizer_and_template(tmp_path):
    def sha(data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()

    def json_sha(value) -> str:
        return sha(json.dumps(value, sort_keys=True).encode())

    model, tokenizers = tmp_path / "model 'a'", tmp_path / "tok $dir"
    model.mkdir()
    tokenizers.mkdir()
    (model / "config.json").write_bytes(b'{"layers": 2}')
    (model / "model.safetensors.index.json").write_bytes(b'{"weight_map": {}}')
    tensors = bytes(range(200))
    weights = _safetensors({"w": {"dtype": "U8", "shape": [200], "data_offsets": [0, 200]}}, tensors)
    (model / "model.safetensors").write_bytes(weights)
    (tokenizers / "tokenizer.json").write_bytes(b'{"vocab": 3}')
    (tokenizers / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ x }}", "eos": "</s>"}))
    (tmp_path / "chat.jinja").write_bytes(b"{{ messages }}")
    command = remote.model_identity_command(
        sys.executable, str(model), tokenizer_root=str(tokenizers), small_files=("config.json", "absent.json"),
        tokenizer_files=("tokenizer.json", "tokenizer_config.json"), template_file=str(tmp_path / "chat.jinja"),
        full=True, samples=2, sample_bytes=10)
    result = _bash(command)
    assert result.returncode == 0, result.stderr
    header_end = len(weights) - len(tensors)
    sampled = sha(weights[:header_end] + tensors[0:10] + tensors[100:110])
    assert json.loads(result.stdout) == {
        "files": {"config.json": sha(b'{"layers": 2}'), "model.safetensors.index.json": sha(b'{"weight_map": {}}')},
        "tokenizer": {"files": {"tokenizer.json": sha(b'{"vocab": 3}'), "tokenizer_config.json": json_sha({"eos": "</s>"})},
                      "chat_template": json_sha("{{ x }}")},
        "weights": {"model.safetensors": {"bytes": len(weights), "sampled_sha256": sampled, "sha256": sha(weights)}},
        "unreadable": {}, "template_file": sha(b"{{ messages }}")}
    # without full, the weights are identified by their size, header and samples alone
    quick = _bash(remote.model_identity_command(
        sys.executable, str(model), tokenizer_root=str(tokenizers), small_files=(), tokenizer_files=(),
        template_file="", full=False, samples=1, sample_bytes=4))
    assert json.loads(quick.stdout)["weights"] == {
        "model.safetensors": {"bytes": len(weights), "sampled_sha256": sha(weights[:header_end] + tensors[:4])}}
    assert json.loads(quick.stdout)["template_file"] is None
