"""Every shell command builder, every branch (error paths included), run through a real bash with
hostile paths and values: nothing they hold is ever executed, and messages name them intact.

A canary: each hostile value carries a payload that would create the file ``pwned`` in the working
directory if any shell evaluated it ($(...), backticks, quotes closed early, newlines). The file
must never appear.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetgen.nodes import probe, remote

CANARY = "pwned"
PAYLOADS = [f"$(touch {CANARY})", f"`touch {CANARY}`", f'"; touch {CANARY}; "', f"'; touch {CANARY}; '",
            f"\ntouch {CANARY}\n", f"${{IFS}}$(touch${{IFS}}{CANARY})", f'\\"$(touch {CANARY})',
            f"' \"`touch {CANARY}`\" '",
            f"$(touch {CANARY}) && echo ", f"; touch {CANARY} #", f" | touch {CANARY}", f"> {CANARY}"]
# Anything else a fleet file or a model path could hold; no NUL (no argv or path can carry one).
noise = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
hostile = st.builds(lambda a, payload, b: a + payload + b, noise, st.sampled_from(PAYLOADS), noise)
# One path component: no '/', never '.' or '..'.
hostile_name = hostile.map(lambda text: text.replace("/", "_")).filter(lambda text: text not in (".", ".."))
# A run folder holds no line break (the fleet file refuses one: the launch marker names a pid file under it).
hostile_run_name = hostile_name.map(lambda text: text.replace("\n", "_").replace("\r", "_"))

SLEEPER = "import time\nprint('up', flush=True)\ntime.sleep(600)\n"
MODULE = "fleetgen_quoting_sleeper"


class Node:
    """A scratch 'node': a working directory, bash run there, the canary checked after every command."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="quoting-"))
        (self.root / f"{MODULE}.py").write_text(SLEEPER)
        self.pids: list[int] = []

    def bash(self, command: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        # bytes, decoded here: text mode would turn a '\r' of a hostile path into a newline
        done = subprocess.run(["bash", "-c", command], input=None if stdin is None else stdin.encode(),
                              capture_output=True, cwd=self.root, timeout=60)
        self.assert_no_canary()
        return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(), done.stderr.decode())

    def assert_no_canary(self) -> None:
        found = [str(path) for path in self.root.rglob(f"*{CANARY}*") if path.name == CANARY]
        assert not found, f"a hostile value was executed: {found}"

    def close(self) -> None:
        for pid in self.pids:
            subprocess.run(["kill", "-KILL", str(pid)], capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def node_factory():
    nodes = []

    def make() -> Node:
        nodes.append(Node())
        return nodes[-1]

    yield make
    for node in nodes:
        node.close()


@settings(max_examples=60, deadline=None)
@given(name=hostile)
def test_read_and_tail_of_a_missing_path_name_it_and_run_nothing(name):
    node = Node()
    try:
        path = f"{node.root}/missing/{name}"
        missing = node.bash(remote.read_file_command(path))
        assert missing.returncode == 4 and missing.stderr == f"cannot read {path}\n" and missing.stdout == ""
        tail = node.bash(remote.tail_command(path))
        assert tail.returncode == 0 and tail.stdout == ""
        watch = node.bash(remote.watch_command(path, 2**22 + 1))  # above Linux's pid_max: never alive
        assert remote.parse_watch(watch.stdout) == (False, [])
    finally:
        node.close()


@settings(max_examples=40, deadline=None)
@given(name=hostile_name)
def test_read_and_tail_of_a_hostile_file_name_every_branch(name):
    node = Node()
    try:
        path = f"{node.root}/{name}"
        Path(path).write_bytes(b"x" * 99 + b"\n")
        large = node.bash(remote.read_file_command(path, max_bytes=10))
        assert large.returncode == 5 and large.stderr == f"{path} is 100 bytes, more than 10\n"
        whole = node.bash(remote.read_file_command(path))
        assert whole.returncode == 0 and whole.stdout == "x" * 99 + "\n"
        assert node.bash(remote.tail_command(path, 1)).stdout == "x" * 99 + "\n"
        watch = node.bash(remote.watch_command(path, os.getpid(), 1))
        assert remote.parse_watch(watch.stdout) == (True, ["x" * 99])
        folder = node.bash(remote.read_file_command(str(node.root)))  # a directory is not a readable file
        assert folder.returncode == 4 and folder.stderr == f"cannot read {node.root}\n"
    finally:
        node.close()


@settings(max_examples=40, deadline=None)
@given(name=hostile_name)
def test_scheduler_log_reading_of_a_hostile_log_dir_every_branch(name):
    node = Node()
    try:
        log_dir = f"{node.root}/{name}"
        missing = node.bash(remote.scheduler_log_command(log_dir, [30001]))
        assert missing.returncode == 0 and missing.stdout == "scheduler port=30001 missing=1\n"
        Path(log_dir).mkdir()
        Path(remote.log_file(log_dir, 30001)).write_text(
            "Decode batch, #running-req: 2, #full token: 700, full token usage: 0.1\n"
            "KV cache pool is full. Retract requests. #retracted_reqs: 2, #new_tokens_gained: 9\n")
        found = node.bash(remote.scheduler_log_command(log_dir, [30001]))
        assert found.stdout == "scheduler port=30001 peak_full_tokens=700 retracted=2\n"
    finally:
        node.close()


def _wait_for_log(path: Path) -> str:
    deadline = time.monotonic() + 60  # a loaded machine can take a while to start python
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text()
        time.sleep(0.02)
    return path.read_text() if path.exists() else ""


@settings(max_examples=12, deadline=None)
@given(run_name=hostile_run_name, log_name=hostile_name, model_path=hostile, served_name=hostile,
       extra=st.lists(hostile, max_size=2), env_value=hostile, key_noise=noise)
def test_server_lifecycle_builders_every_branch_with_hostile_values(run_name, log_name, model_path, served_name,
                                                                    extra, env_value, key_noise):
    node = Node()
    try:
        port = 31500
        run_dir, log_dir = f"{node.root}/{run_name}", f"{node.root}/logs/{log_name}"
        key = "k" + key_noise.replace("\n", " ").replace("\r", " ")
        spec = remote.LaunchSpec(python=sys.executable, module=MODULE, model_path=model_path, served_name=served_name,
                                 port=port, gpu_ids=(0,), bind_host="127.0.0.1", run_dir=run_dir, log_dir=log_dir,
                                 args=tuple(extra), env=(("PYTHONPATH", str(node.root)), ("HOSTILE", env_value)),
                                 api_key_on_stdin=True)
        pid_path = Path(remote.pid_file(run_dir, port))
        ours = remote.our_pids_command(run_dir=run_dir, module=MODULE, ports=[port])
        stop = remote.stop_command(run_dir=run_dir, module=MODULE, ports=[port], grace_s=0.3)

        assert node.bash(ours).stdout == ""                                   # no pid file yet
        assert node.bash(stop).stdout == f"absent port={port}\n"              # stop: absent
        launched = node.bash(remote.launch_command(spec), stdin=remote.api_key_config(key))
        assert launched.returncode == 0, launched.stderr
        pid = int(launched.stdout.split("pid=")[1])
        node.pids.append(pid)
        assert _wait_for_log(Path(remote.log_file(log_dir, port))).strip() == "up"
        refused = node.bash(remote.launch_command(spec), stdin=remote.api_key_config(key))  # launch: refused
        assert refused.returncode == 3
        assert refused.stderr == f"refused: our server on port {port} is still running (pid {pid})\n"
        assert node.bash(ours).stdout == f"ours port={port} pid={pid}\n"       # ours
        sections = remote.split_sections(node.bash(probe.probe_command(run_dir=run_dir, module=MODULE,
                                                                        ports=[port])).stdout)
        assert sections["ours"] == (0, f"ours port={port} pid={pid}")
        assert sections["marked"] == (0, f"marked port={port} pid={pid}")  # the launch marker, read back intact
        # TERM, or KILL where nothing reaps the orphaned server and it lingers as a zombie past the grace
        assert node.bash(stop).stdout in {f"stopped port={port} pid={pid} signal={s}\n" for s in ("TERM", "KILL")}
        assert not pid_path.exists() and not Path(remote.config_file(run_dir, port)).exists()

        pid_path.write_text(f"{pid} $(touch {CANARY})\n`touch {CANARY}`")  # a hostile pid file is data
        assert node.bash(ours).stdout == ""
        assert node.bash(stop).stdout == f"stale port={port} pid={pid}\n"     # stop: stale
    finally:
        node.close()


@settings(max_examples=40, deadline=None)
@given(names=st.lists(hostile, min_size=1, max_size=3, unique=True), module=hostile, run_name=hostile_name)
def test_sections_and_probe_quote_names_modules_and_folders(names, module, run_name):
    node = Node()
    try:
        node.bash(remote.sections_command({name: "true" for name in names}))
        # A module or run folder no fleet would pass: the probe and stop treat them as data all the same.
        run_dir = f"{node.root}/{run_name}"
        Path(run_dir).mkdir()
        stranger = subprocess.Popen(["sleep", "600"])
        try:
            Path(remote.pid_file(run_dir, 31600)).write_text(str(stranger.pid))
            probed = remote.split_sections(node.bash(probe.probe_command(run_dir=run_dir, module=module,
                                                                          ports=[31600])).stdout)
            assert probed["ours"] == (0, "")
            assert node.bash(remote.our_pids_command(run_dir=run_dir, module=module, ports=[31600])).stdout == ""
            stopped = node.bash(remote.stop_command(run_dir=run_dir, module=module, ports=[31600], grace_s=0.1))
            assert stopped.stdout == f"stale port=31600 pid={stranger.pid}\n" and stranger.poll() is None
        finally:
            stranger.kill()
            stranger.wait()
    finally:
        node.close()


@pytest.mark.parametrize("builder", [
    lambda bad: remote.watch_command("/x.log", bad),
    lambda bad: remote.tail_command("/x", bad),
    lambda bad: remote.stop_command(run_dir="/r", module="m", ports=[bad], grace_s=1),
    lambda bad: remote.our_pids_command(run_dir="/r", module="m", ports=[bad]),
    lambda bad: remote.marked_pids_command(run_dir="/r", ports=[bad]),
    lambda bad: remote.read_file_command("/x", max_bytes=bad),
    lambda bad: remote.scheduler_log_command("/l", [bad]),
    lambda bad: remote.launch_command(remote.LaunchSpec(python="p", module="m", model_path="/m", served_name="m",
                                                        port=bad, gpu_ids=(0,), bind_host="h", run_dir="/r",
                                                        log_dir="/l")),
    lambda bad: remote.launch_command(remote.LaunchSpec(python="p", module="m", model_path="/m", served_name="m",
                                                        port=1, gpu_ids=(0,), bind_host="h", run_dir="/r",
                                                        log_dir="/l", env=((bad, "v"),))),
])
def test_numbers_and_names_written_unquoted_refuse_anything_else(builder):
    with pytest.raises(ValueError):
        builder(f"1; touch {CANARY}")


@settings(max_examples=40, deadline=None)
@given(module=hostile)
def test_the_version_command_names_a_hostile_module_intact(module):
    node = Node()
    try:
        done = node.bash(remote.package_version_command(sys.executable, module))
        assert done.returncode != 0  # no such package: refused by Python, never run by the shell
    finally:
        node.close()


def test_the_sampling_loop_refuses_an_interval_or_duration_that_is_not_a_number():
    with pytest.raises(ValueError):
        remote.sampling_loop_command("true", interval_s=f"1; touch {CANARY}", max_seconds=1)
    with pytest.raises(ValueError):
        remote.sampling_loop_command("true", interval_s=1, max_seconds=f"1; touch {CANARY}")
