"""Remote command builders at their edges: flags left out mid-list, run folders with odd names, the
launch guard reading the right pid file, and stop / our-pids scripts that run without shell errors."""

import os
import subprocess
import sys
import time

import pytest

from fleetgen.nodes import remote

SLEEPER = "import time\nprint('up', flush=True)\ntime.sleep(600)\n"


def _bash(command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60)


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
    assert stop.stdout.split() == ["absent", "port=31012", "absent", "port=31013"]
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
