"""Stopping only our servers: pid file + command line must match, TERM then KILL; strangers survive."""

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleetgen.nodes import remote

SLEEPER = "import signal, sys, time\nif 'ignore-term' in sys.argv: signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('up', flush=True)\ntime.sleep(600)\n"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) is dead for our purposes.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split()[2] != "Z"


def _launch(tmp_path, port, *extra):
    (tmp_path / "fakeserver.py").write_text(SLEEPER)
    spec = remote.LaunchSpec(python=sys.executable, module="fakeserver", model_path="/m", served_name="m", port=port,
                             gpu_ids=(0,), bind_host="127.0.0.1", run_dir=str(tmp_path / "run"),
                             log_dir=str(tmp_path / "logs"), args=tuple(extra), env=(("PYTHONPATH", str(tmp_path)),))
    out = subprocess.run(["bash", "-c", remote.launch_command(spec)], capture_output=True, text=True, check=True).stdout
    return int(out.split("pid=")[1].split()[0])


def _wait_up(tmp_path, port, cap_s=60.0):
    """Until the sleeper's log says ``up`` (after its handler is set); a fresh python on a busy machine can take
    seconds to get there."""
    log = Path(remote.log_file(str(tmp_path / "logs"), port))
    deadline = time.monotonic() + cap_s
    while not (log.exists() and "up" in log.read_text().split()):
        seen = log.read_text() if log.exists() else "(absent)"
        assert time.monotonic() < deadline, f"{log}: no 'up' after {cap_s:.0f} s: {seen}"
        time.sleep(0.02)


def _stop(tmp_path, ports, grace_s=2.0, module="fakeserver"):
    command = remote.stop_command(run_dir=str(tmp_path / "run"), module=module, ports=ports, grace_s=grace_s)
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=True).stdout


@pytest.fixture
def foreign():
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield process
    process.kill()
    process.wait()


def test_stop_term_ours_and_leave_foreign_alive(tmp_path, foreign):
    pid = _launch(tmp_path, 31001)
    out = _stop(tmp_path, [31001])
    assert f"stopped port=31001 pid={pid} signal=TERM" in out
    deadline = time.monotonic() + 60  # ends when it exits: a busy machine can take seconds to deliver and handle TERM
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid), f"pid {pid} still alive 60 s after TERM"
    assert foreign.poll() is None
    assert not (tmp_path / "run" / "sglang-31001.pid").exists()


def test_stale_pid_file_naming_a_stranger_is_not_killed(tmp_path, foreign):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "sglang-31002.pid").write_text(f"{foreign.pid}\n")
    out = _stop(tmp_path, [31002])
    assert f"stale port=31002 pid={foreign.pid}" in out
    time.sleep(0.2)
    assert foreign.poll() is None


def test_pid_of_our_module_on_another_port_is_not_ours(tmp_path):
    pid = _launch(tmp_path, 31003)
    # Point port 31004's pid file at the server of port 31003: same module, wrong port.
    (tmp_path / "run" / "sglang-31004.pid").write_text(f"{pid}\n")
    out = _stop(tmp_path, [31004])
    assert "stale port=31004" in out and _alive(pid)
    assert "stopped port=31003" in _stop(tmp_path, [31003])


def test_kill_after_grace_when_term_is_ignored(tmp_path):
    pid = _launch(tmp_path, 31005, "ignore-term")
    _wait_up(tmp_path, 31005)  # its handler is installed before it says so
    out = _stop(tmp_path, [31005], grace_s=0.5)
    assert f"stopped port=31005 pid={pid} signal=KILL" in out


def test_absent_and_refused_relaunch(tmp_path):
    assert "absent port=31006" in _stop(tmp_path, [31006])
    _launch(tmp_path, 31007)
    with pytest.raises(subprocess.CalledProcessError) as refused:
        _launch(tmp_path, 31007)
    assert "still running" in refused.value.stderr
    _stop(tmp_path, [31007])


def _wait_dead(pid, cap_s=60.0):
    deadline = time.monotonic() + cap_s  # ends when it exits: TERM can take seconds on a busy machine
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid), f"pid {pid} still alive {cap_s:.0f} s after TERM"


def test_a_server_launched_under_another_module_is_stopped_and_says_so(tmp_path):
    # the fleet file's server.module changed since the launch: the marker still names it ours
    pid = _launch(tmp_path, 31011)
    out = _stop(tmp_path, [31011], module="sglang.launch_server")
    assert f"stopped port=31011 pid={pid} signal=TERM module=other" in out
    _wait_dead(pid)


def test_a_server_whose_pid_file_is_gone_is_found_by_its_marker_and_stopped(tmp_path, foreign):
    pid = _launch(tmp_path, 31012)
    (tmp_path / "run" / "sglang-31012.pid").unlink()
    out = _stop(tmp_path, [31012])
    assert f"stopped port=31012 pid={pid} signal=TERM pid_file=missing" in out
    _wait_dead(pid)
    assert foreign.poll() is None


def test_our_marker_for_another_run_folder_is_not_ours(tmp_path):
    # the same port in another run folder (another deployment on the node) is not this one's server
    pid = _launch(tmp_path, 31013)
    (tmp_path / "run" / "sglang-31013.pid").unlink()
    command = remote.stop_command(run_dir=str(tmp_path / "other-run"), module="x", ports=[31013], grace_s=1)
    out = subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=True).stdout
    assert "absent port=31013" in out and _alive(pid)
    assert f"pid={pid}" in _stop(tmp_path, [31013])


def test_the_probe_counts_a_server_launched_under_another_module_as_ours(tmp_path):
    pid = _launch(tmp_path, 31014)
    command = remote.our_pids_command(run_dir=str(tmp_path / "run"), module="sglang.launch_server", ports=[31014])
    out = subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=True).stdout
    assert out.strip() == f"ours port=31014 pid={pid}"
    _stop(tmp_path, [31014])


CHILD_SPAWNER = ("import subprocess, sys\nchild = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])"
                 "\nprint('child', child.pid, flush=True)\nchild.wait()\n")


def test_the_server_and_the_processes_it_started_carry_our_marker(tmp_path):
    (tmp_path / "spawner.py").write_text(CHILD_SPAWNER)
    spec = remote.LaunchSpec(python=sys.executable, module="spawner", model_path="/m", served_name="m", port=31015,
                             gpu_ids=(0,), bind_host="127.0.0.1", run_dir=str(tmp_path / "run"),
                             log_dir=str(tmp_path / "logs"), env=(("PYTHONPATH", str(tmp_path)),))
    out = subprocess.run(["bash", "-c", remote.launch_command(spec)], capture_output=True, text=True, check=True).stdout
    pid = int(out.split("pid=")[1].split()[0])
    log = Path(remote.log_file(str(tmp_path / "logs"), 31015))
    deadline = time.monotonic() + 60
    while "child" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, f"{log}: no child pid after 60 s"
        time.sleep(0.02)
    child = int(log.read_text().split("child")[1].split()[0])
    try:
        command = remote.marked_pids_command(run_dir=str(tmp_path / "run"), ports=[31015])
        marked = subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=True).stdout
        assert sorted(marked.split("\n")[:-1]) == sorted([f"marked port=31015 pid={pid}",
                                                          f"marked port=31015 pid={child}"])
    finally:
        os.kill(child, 9)
        _stop(tmp_path, [31015], module="spawner")


def test_a_server_launched_before_the_marker_existed_is_ours_by_its_module_on_its_port(tmp_path):
    # no FLEETGEN_PID_FILE in its environment: only its command line (our module, our port) names it ours;
    # started as a launch starts one (setsid in a background job), so init reaps it once it exits
    argv = [sys.executable, "-c", SLEEPER, "-m", "fakeserver", "--port", "31016", "--host", "h"]
    started = subprocess.run(["bash", "-c", f"setsid {shlex.join(argv)} > /dev/null 2>&1 < /dev/null & echo $!"],
                             env={key: value for key, value in os.environ.items() if key != remote.SERVER_MARKER_ENV},
                             capture_output=True, text=True, check=True)
    pid = int(started.stdout)
    try:
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / "sglang-31016.pid").write_text(f"{pid}\n")
        out = _stop(tmp_path, [31016], module="sglang.launch_server")
        assert out.strip() == f"stale port=31016 pid={pid}" and _alive(pid)
        (tmp_path / "run" / "sglang-31016.pid").write_text(f"{pid}\n")
        assert _stop(tmp_path, [31016]).strip() == f"stopped port=31016 pid={pid} signal=TERM"
        _wait_dead(pid)
    finally:
        if _alive(pid):
            os.kill(pid, 9)
