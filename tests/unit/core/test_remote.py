"""Command builders: quoting (property-based, through a real bash), launch/stop shapes, sections."""

import json
import os
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
    argv = launch_spec(fleet, slot, {"flags": {"--max-running-requests": 40}}, with_api_key=False).argv()
    assert argv.count("--enable-metrics") == 1 and argv[-2:] == ["--reasoning-parser", "qwen3"]
    user_asked = load_fleet_text(FLEET_YAML.replace("[--reasoning-parser, qwen3]", "[--enable-metrics]"), source="t")
    argv = launch_spec(user_asked, slot, {"flags": {}}, with_api_key=False).argv()
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
