"""Command builders, run through a real bash: environment quoting, the stop's identity match, small helpers."""

import json
import subprocess
import sys
import time

import pytest

from fleetgen.nodes import remote

ENV_DUMP = ("import json, os, sys\nprint(json.dumps({'argv': sys.argv[1:], 'value': os.environ.get('FLEETGEN_T'),"
            " 'cuda': os.environ.get('CUDA_VISIBLE_DEVICES')}), flush=True)\n")
SLEEPER = "import time\nprint('up', flush=True)\ntime.sleep(600)\n"


def _bash(command, **kwargs):
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=30, **kwargs)


def _spec(tmp_path, module, port, **overrides):
    fields = dict(python=sys.executable, module=module, model_path="/m", served_name="m", port=port, gpu_ids=(0,),
                  bind_host="127.0.0.1", run_dir=str(tmp_path / "run"), log_dir=str(tmp_path / "logs"),
                  env=(("PYTHONPATH", str(tmp_path)),))
    return remote.LaunchSpec(**{**fields, **overrides})


def _log_json(path):
    deadline = time.monotonic() + 10
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
