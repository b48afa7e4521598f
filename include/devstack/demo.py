"""The simulated fleet behind ``make demo`` and the end-to-end tests.

``SimEnvironment`` lays out (idempotently) simulated GPU nodes, the model directory, SSH keys and a
prompts file under one folder, starts one loopback SSH server per node, and produces the
environment variables that ``airflow_settings.yaml`` expects. ``python -m devstack.demo`` runs the
whole DAG on it with ``airflow dags test`` and prints where everything is.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from fleetgen.outputs import OUTPUT_ROOT_VARIABLE
from sglang_sim import sshd
from sglang_sim.synthetic import write_synthetic_prompts

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def _start_openssh(node_dir, **kwargs):
    from sglang_sim.openssh import start_openssh

    return start_openssh(node_dir, **kwargs)


SSH_SERVERS = {"embedded": sshd.start_sshd, "openssh": _start_openssh}
DEMO_API_KEY_FILE = "api_key"
B200_MIB = 183359


_HANDED_OUT: set[int] = set()
PORTS_LOW = 20000
# "LOW-HIGH": the ports free_port_block picks from. Set per test worker (tests/conftest.py) so that processes
# picking side by side, each blind to the others' picks until they bind, never pick the same block.
PORT_RANGE_ENV = "FLEETGEN_PORT_RANGE"


def _ephemeral_floor() -> int:
    """The lowest port the kernel hands to outgoing connections (Linux default 32768)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def port_range() -> tuple[int, int]:
    """Where blocks are picked: ``FLEETGEN_PORT_RANGE`` when set, else from 20000 to the ephemeral floor."""
    value = os.environ.get(PORT_RANGE_ENV, "")
    if not value:
        return PORTS_LOW, _ephemeral_floor()
    low, sep, high = value.partition("-")
    if sep and low.isdigit() and high.isdigit() and 1024 <= int(low) < int(high) <= 65536:
        return int(low), int(high)
    raise ValueError(f"{PORT_RANGE_ENV}={value!r}: expected LOW-HIGH with 1024 <= LOW < HIGH <= 65536, "
                     f"e.g. 20000-24000")


def worker_port_range(index: int, workers: int) -> str:
    """The ``FLEETGEN_PORT_RANGE`` of worker ``index`` of ``workers``: equal, disjoint parts of the default range."""
    low, high = PORTS_LOW, _ephemeral_floor()
    span = (high - low) // workers
    return f"{low + index * span}-{low + (index + 1) * span}"


def free_port_block(count: int, start: int | None = None, stop: int | None = None) -> int:
    """First port P >= start such that P..P+count-1 are free on loopback and not handed out before by this
    process. Blocks are chosen below the kernel's ephemeral range: a port picked now is often bound only a
    minute later (a server launched by a DAG run), and an outgoing connection must not take it meanwhile.
    start: random within ``port_range()``, so that environments set up side by side rarely race for the same
    block (and never do when each has its own range)."""
    import random

    low, high = port_range()
    stop = stop or high
    first = port = start if start is not None else random.randrange(low, max(low + 1, stop - count - 100), 100)
    while port + count < stop:
        taken = next((offset for offset in range(count)
                      if port + offset in _HANDED_OUT or not _bindable(port + offset)), None)
        if taken is None:
            _HANDED_OUT.update(range(port, port + count))
            return port
        port = port + taken + 1
    raise RuntimeError(f"no {count} consecutive free ports between {first} and {stop}")


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@dataclass
class SimEnvironment:
    root: Path
    nodes: int = 1
    gpus_per_node: int = 7
    total_mib: int = B200_MIB
    gpu_name: str = "NVIDIA B200"
    prompts: int = 3000
    sim: dict = field(default_factory=dict)
    ssh_server: str = "embedded"  # or "openssh": Debian's sshd (see openssh.py)
    ssh_ports: list[int] = field(default_factory=list)
    base_port: int = 0
    _sshd: list[subprocess.Popen] = field(default_factory=list)

    @property
    def key_dir(self) -> Path:
        return self.root / "keys"

    def node_dir(self, index: int) -> Path:
        return self.root / f"node{index}"

    @property
    def model_dir(self) -> Path:
        return self.root / "models" / "qwen3.6-27b"

    @property
    def prompts_path(self) -> Path:
        return self.root / "prompts.jsonl"

    @property
    def output_root(self) -> Path:
        return self.root / "output"

    def prepare(self) -> "SimEnvironment":
        from sglang_sim.node import create_node
        from sglang_sim.presets import install_model

        self.root.mkdir(parents=True, exist_ok=True)
        for index in range(self.nodes):
            if not (self.node_dir(index) / "node.json").exists():
                create_node(self.node_dir(index), name=f"node{index}", gpus=self.gpus_per_node,
                            gpu_name=self.gpu_name, total_mib=self.total_mib, sim=self.sim or None)
        if not (self.model_dir / "config.json").exists():
            install_model(self.model_dir, preset="qwen3.6-27b")
        sshd.ensure_keys(self.key_dir)
        if not self.prompts_path.exists() or self._prompt_count() != self.prompts:
            write_synthetic_prompts(self.prompts_path, self.prompts)
        api_key_path = self.root / DEMO_API_KEY_FILE
        if not api_key_path.exists():
            api_key_path.write_text(os.urandom(16).hex())
            api_key_path.chmod(0o600)
        return self

    def _prompt_count(self) -> int:
        with self.prompts_path.open("rb") as handle:
            return sum(1 for _ in handle)

    def node_base_port(self, index: int) -> int:
        return self.base_port + index * self.gpus_per_node

    def start(self) -> "SimEnvironment":
        self.ssh_ports = [sshd.free_port() for _ in range(self.nodes)]
        self.base_port = free_port_block(self.nodes * self.gpus_per_node)
        if self.ssh_server not in SSH_SERVERS:
            raise ValueError(f"ssh_server must be one of {sorted(SSH_SERVERS)}, got {self.ssh_server!r}")
        for index, port in enumerate(self.ssh_ports):
            self._sshd.append(SSH_SERVERS[self.ssh_server](self.node_dir(index), port=port, key_dir=self.key_dir,
                                                           log_path=self.root / f"sshd-node{index}.log"))
        return self

    def signal_sshd(self, signum: int, index: int = 0) -> None:
        """Send node ``index``'s SSH server a signal: SIGSTOP wedges it (connections stay open, nothing
        answers), SIGCONT lets it go on."""
        self._sshd[index].send_signal(signum)

    def kill_sshd(self, index: int = 0) -> None:
        """Kill node ``index``'s SSH server at once (SIGKILL: its connections drop); servers keep running."""
        process = self._sshd[index]
        process.kill()
        process.wait(timeout=10)

    def restart_sshd(self, index: int = 0) -> None:
        """Start node ``index``'s SSH server again on its port, with the same host key."""
        self._sshd[index] = SSH_SERVERS[self.ssh_server](self.node_dir(index), port=self.ssh_ports[index],
                                                         key_dir=self.key_dir,
                                                         log_path=self.root / f"sshd-node{index}.log")

    @property
    def ssh_user(self) -> str:
        """The embedded server takes any login; OpenSSH only the user it runs as."""
        from sglang_sim import openssh

        return openssh.login_user() if self.ssh_server == "openssh" else "fleetgen"

    def settings_env(self) -> dict[str, str]:
        keys = sshd.ensure_keys(self.key_dir)
        return {
            "FLEETGEN_DEMO_DIR": str(self.root),
            "FLEETGEN_PYTHON": sys.executable,
            "FLEETGEN_SSH_PORT": str(self.ssh_ports[0]),
            "FLEETGEN_SSH_USER": self.ssh_user,
            "FLEETGEN_SSH_HOST_KEY": keys.host_public_key,
            "FLEETGEN_API_KEY": (self.root / DEMO_API_KEY_FILE).read_text().strip(),
            "FLEETGEN_BASE_PORT": str(self.base_port),
            # the deployment's output root: the only root its runs may write in (docs/security-and-ssh.md §6)
            OUTPUT_ROOT_VARIABLE: str(self.output_root),
        }

    def fleet(self) -> dict:
        """The committed fleet (airflow_settings.yaml's Variable) extended to every node of this environment."""
        import yaml

        from fleetgen.airflow.settings_file import load_settings

        settings = load_settings(PROJECT_ROOT / "airflow_settings.yaml", {**os.environ, **self.settings_env()})
        fleet = yaml.safe_load(dict(settings.variables)["fleetgen_fleet"])
        fleet["nodes"] = [{"name": f"node{index}", "ssh_conn_id": f"fleetgen_node{index}", "address": "127.0.0.1",
                           "gpus": list(range(self.gpus_per_node)), "base_port": self.node_base_port(index)}
                          for index in range(self.nodes)]
        return fleet

    def fleet_file(self) -> Path:
        path = self.root / "fleet.json"
        path.write_text(json.dumps(self.fleet()))
        return path

    def airflow_settings(self, *, pool_slots: int | None = None):
        """airflow_settings.yaml applied to this environment: one SSH connection per node, the fleet
        Variable naming every node, and (when given) the shard pool's size."""
        import dataclasses

        from fleetgen.airflow.settings_file import load_settings

        settings = load_settings(PROJECT_ROOT / "airflow_settings.yaml", {**os.environ, **self.settings_env()})
        node0 = next(c for c in settings.connections if c.conn_id == "fleetgen_node0")
        others = [c for c in settings.connections if not c.conn_id.startswith("fleetgen_node")]
        nodes = [dataclasses.replace(node0, conn_id=f"fleetgen_node{index}", port=port)
                 for index, port in enumerate(self.ssh_ports)]
        variables = tuple((key, json.dumps(self.fleet()) if key == "fleetgen_fleet" else value)
                          for key, value in settings.variables)
        pools = tuple(dataclasses.replace(pool, slots=pool_slots) if pool_slots else pool for pool in settings.pools)
        return dataclasses.replace(settings, connections=tuple(nodes + others), variables=variables, pools=pools)

    @contextmanager
    def airflow_settings_applied(self):
        """airflow_settings.yaml applied for an Airflow in this process (``dag.test()``): its connections and
        variables in this process's environment and in the metadata DB, and the deployment's output root in the
        environment; the environment restored afterwards."""
        from fleetgen.airflow.apply_settings import apply_to_db
        from fleetgen.airflow.settings_file import load_settings

        settings = load_settings(PROJECT_ROOT / "airflow_settings.yaml", self.settings_env())
        applied = {**settings.environment(), OUTPUT_ROOT_VARIABLE: str(self.output_root)}  # as a worker has it
        saved = {key: os.environ.get(key) for key in applied}
        os.environ.update(applied)
        apply_to_db(settings)
        try:
            yield settings
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def stop_servers(self) -> None:
        """Stop our simulated servers on every node, as the DAG does (pid file + command line check)."""
        from fleetgen.nodes.remote import stop_command

        for index in range(self.nodes):
            ports = [self.node_base_port(index) + gpu for gpu in range(self.gpus_per_node)]
            command = stop_command(run_dir="~/fleetgen/run", module="sglang_sim.server", ports=ports, grace_s=10)
            subprocess.run(["bash", "-c", command], env=sshd.node_environment(self.node_dir(index)),
                           stdout=subprocess.DEVNULL, check=False)

    def stop(self) -> None:
        self.stop_servers()
        for process in self._sshd:
            process.terminate()
        for process in self._sshd:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
        self._sshd.clear()


# `airflow dags test` runs each trigger in its own process, inline: no executor event can race a fast
# resume, so wait_ready need not hold its first event (fleetgen/airflow/triggers.py).
DAGS_TEST_ENV = {"FLEETGEN_RESUME_SETTLE_S": "0"}


def airflow_env(airflow_home: Path, settings_env: dict[str, str]) -> dict[str, str]:
    """Environment for Airflow processes: the settings as AIRFLOW_CONN_*/AIRFLOW_VAR_* too (the
    triggerer of `dags test` resolves connections from the environment, not the database)."""
    from fleetgen.airflow.settings_file import load_settings

    env = dict(os.environ)
    env.update(settings_env)
    env.update(load_settings(PROJECT_ROOT / "airflow_settings.yaml", env).environment())
    env.update({
        "AIRFLOW_HOME": str(airflow_home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(PROJECT_ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(PROJECT_ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__CORE__DAG_RUN_CONF_OVERRIDES_PARAMS": "True",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        "PYTHONUNBUFFERED": "1",
        # `airflow standalone` starts its components as `airflow ...` from PATH: use this environment's.
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
    })
    return env


def airflow_cli() -> list[str]:
    return [str(Path(sys.executable).parent / "airflow")]


def prepare_airflow(airflow_home: Path, env: dict[str, str]) -> None:
    """Initialise the SQLite metadata DB once and apply airflow_settings.yaml (idempotent)."""
    airflow_home.mkdir(parents=True, exist_ok=True)
    if not (airflow_home / "airflow.db").exists():
        subprocess.run(airflow_cli() + ["db", "migrate"], env=env, check=True, stdout=subprocess.DEVNULL)
    subprocess.run([sys.executable, "-m", "fleetgen.airflow.apply_settings", str(PROJECT_ROOT / "airflow_settings.yaml")],
                   env=env, check=True)


def newest_report(output_root: Path) -> Path | None:
    reports = sorted(output_root.glob("*/report/report.json"), key=lambda p: p.stat().st_mtime)
    return reports[-1] if reports else None


def run_demo(args: argparse.Namespace) -> int:
    root = Path(args.dir).resolve()
    environment = SimEnvironment(root=root, prompts=args.prompts,
                                 sim={"time_scale": args.time_scale, "load_seconds": 20.0}).prepare()
    environment.start()
    airflow_home = root / "airflow"
    env = airflow_env(airflow_home, environment.settings_env())
    started = time.monotonic()
    try:
        prepare_airflow(airflow_home, env)
        conf = {"prompts_path": str(environment.prompts_path), "output_root": str(environment.output_root),
                "shard_size": args.shard_size, "max_tokens": 4096,
                "ready_timeout_s": 300, "sample_interval_s": 1.0}  # simulated time runs 10x faster
        log_path = root / "dags-test.log"
        print(f"Running the DAG sglang_generation on a simulated 7 x B200 node (log: {log_path}) ...", flush=True)
        with log_path.open("w") as log_file:
            result = subprocess.run(airflow_cli() + ["dags", "test", "sglang_generation", "-c", json.dumps(conf)],
                                    env={**env, **DAGS_TEST_ENV}, stdout=log_file, stderr=subprocess.STDOUT)
        wall = time.monotonic() - started
        report_path = newest_report(environment.output_root)
        if result.returncode != 0 or report_path is None:
            print(log_path.read_text()[-6000:])
            print(f"demo FAILED after {wall:.0f} s (exit {result.returncode}); full log: {log_path}")
            return 1
        report = json.loads(report_path.read_text())
        run_dir = report_path.parent.parent
        completions = sum(1 for path in (run_dir / "completions").glob("*.jsonl") for _ in path.open("rb"))
        print(f"Completions: {run_dir / 'completions'}")
        print(f"Validation:  {run_dir / 'validation'}")
        print(f"Report:      {report_path.parent / 'report.md'}")
        print(f"Airflow log: {log_path}")
        print(f"Wall time {wall:.0f} s. Throughput is in simulated time scaled by {args.time_scale:g}x "
              f"(divide by the scale for GPU-equivalent figures).")
        print(f"demo prompts={environment.prompts} completions={completions} "
              f"tokens_per_s={report['throughput']['tokens_per_s']:.1f} report={report_path.parent / 'report.md'}")
        return 0
    finally:
        environment.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devstack.demo", description="Run the DAG end to end on a simulated fleet.")
    parser.add_argument("--dir", default=str(PROJECT_ROOT / ".demo"), help="where the simulated fleet and outputs live")
    parser.add_argument("--prompts", type=int, default=3000)
    parser.add_argument("--shard-size", type=int, default=1000)
    parser.add_argument("--time-scale", type=float, default=10.0,
                        help="simulated seconds per real second (10: generation, not the client, sets the pace)")
    return run_demo(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
