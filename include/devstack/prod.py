"""``make prod-up``: a production-shaped Airflow on this machine against the simulated fleet.

PostgreSQL metadata database (its own database, created and migrated), CeleryExecutor with Redis as
broker, two Celery workers, scheduler, triggerer, dag-processor and API server, each a real process
of its own. Everything a multi-machine deployment must share is set once here and handed to every
component: the metadata DB, broker and result backend, the JWT secret, API secret key and Fernet key,
``execution_api_server_url`` and the storage of prompts, outputs, logs and the SSH key file.

``python -m devstack.prod up`` starts it in the background and returns; ``down`` stops it.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from devstack.demo import PROJECT_ROOT, SimEnvironment, airflow_cli
from devstack.sessions import (STOP_GRACE_S, hold_sessions, reap_sessions, release_sessions, signal_session,
                               terminate_sessions)

DAG_ID = "sglang_generation"
PG_ADMIN_URL = os.environ.get("FLEETGEN_PG_ADMIN_URL", "postgresql://root@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("FLEETGEN_REDIS_URL", "redis://127.0.0.1:6379/0")
WORKERS = ("worker-a", "worker-b")
# A Celery message is acknowledged when its task ends (task_acks_late). Redis hands an unacknowledged
# message to another worker after visibility_timeout, so it must outlast the longest shard, or a
# second worker would start the very try that is still generating. It does not bound recovery from a
# dead worker: the scheduler retries that try after TASK_HEARTBEAT_TIMEOUT_S, and the stale message,
# once redelivered, is refused because its try is over. 12 h: a 5,000-prompt shard at 4,096 tokens
# takes well under an hour on one 8-GPU node; raise it with shards that run longer.
VISIBILITY_TIMEOUT_S = 12 * 3600
# A try whose supervisor stopped heartbeating (worker lost, machine gone) is failed and retried after
# this long instead of Airflow's 300 s; supervisors heartbeat every few seconds, so a live try never
# comes near it.
TASK_HEARTBEAT_TIMEOUT_S = 60
HOSTNAME_ENV = "FLEETGEN_WORKER_HOSTNAME"


def worker_hostname() -> str:
    """``[core] hostname_callable`` of the workers: the name a worker was started with (two workers on
    one machine would otherwise record the same host on their task instances), else the FQDN."""
    return os.environ.get(HOSTNAME_ENV) or socket.getfqdn()


class ServiceMissing(RuntimeError):
    """A service the stack needs does not answer; the message names it and how to start it."""


SERVICE_HINTS = {
    "PostgreSQL": "start it (Debian: apt-get install postgresql && service postgresql start; Docker: docker run "
                  "-d -p 5432:5432 -e POSTGRES_HOST_AUTH_METHOD=trust postgres:16) or point FLEETGEN_PG_ADMIN_URL "
                  "at one",
    "Redis": "start it (Debian: apt-get install redis-server && service redis-server start; Docker: docker run "
             "-d -p 6379:6379 redis:7) or point FLEETGEN_REDIS_URL at one",
}


def check_services(pg_admin_url: str = PG_ADMIN_URL, redis_url: str = REDIS_URL) -> None:
    """Raise ServiceMissing naming the first of PostgreSQL and Redis that does not accept connections."""
    for name, url, default_port in (("PostgreSQL", pg_admin_url, 5432), ("Redis", redis_url, 6379)):
        parts = urlsplit(url)
        address = (parts.hostname or "127.0.0.1", parts.port or default_port)
        try:
            with socket.create_connection(address, timeout=2):
                pass
        except OSError as error:
            raise ServiceMissing(f"{name} is not reachable at {address[0]}:{address[1]} ({error.strerror or error}): "
                                 f"{SERVICE_HINTS[name]}") from None


def _database_url(admin_url: str, database: str, driver: str = "postgresql+psycopg") -> str:
    parts = urlsplit(admin_url)
    return f"{driver}://{parts.netloc}/{database}"


def create_database(admin_url: str, database: str, *, recreate: bool = False) -> None:
    """Create the metadata database (its own, not the server's default one); idempotent."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(admin_url, autocommit=True) as connection:
        if recreate:
            connection.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database)))
        exists = connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone()
        if not exists:
            connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))


def drop_database(admin_url: str, database: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(admin_url, autocommit=True) as connection:
        connection.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database)))


def shared_secrets(path: Path) -> dict[str, str]:
    """One JWT secret, API secret key and Fernet key for every component, generated once."""
    if path.exists():
        return json.loads(path.read_text())
    secrets = {"jwt_secret": base64.urlsafe_b64encode(os.urandom(32)).decode(),
               "api_secret_key": base64.urlsafe_b64encode(os.urandom(32)).decode(),
               "fernet_key": base64.urlsafe_b64encode(os.urandom(32)).decode()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(secrets))
    path.chmod(0o600)
    return secrets


@dataclass
class ProdStack:
    """The processes of a production Airflow, started against ``environment`` (the simulated fleet)."""

    environment: SimEnvironment
    database: str = "fleetgen_airflow"
    queue: str = "fleetgen"
    api_port: int = 8080
    workers: tuple[str, ...] = WORKERS
    worker_concurrency: int = 4
    heartbeat_timeout_s: int = TASK_HEARTBEAT_TIMEOUT_S
    visibility_timeout_s: int = VISIBILITY_TIMEOUT_S
    pool_slots: int | None = None
    scheduled_runs: bool = True
    admin_password: str = "admin"
    pg_admin_url: str = PG_ADMIN_URL
    redis_url: str = REDIS_URL
    extra_env: dict[str, str] = field(default_factory=dict)
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def root(self) -> Path:
        return self.environment.root

    @property
    def airflow_home(self) -> Path:
        return self.root / "airflow"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def log_path(self, component: str) -> Path:
        return self.root / "logs" / f"{component}.log"

    def env(self) -> dict[str, str]:
        """What every component shares: metadata DB, executor, broker, secrets, API URLs, storage."""
        secrets = shared_secrets(self.airflow_home / "secrets.json")
        env = dict(os.environ)
        # Real executor and triggerer: wait_ready keeps its hold against the fast-resume race, whatever the
        # calling process set for in-process runs (fleetgen/airflow/triggers.py); extra_env may set it.
        env.pop("FLEETGEN_RESUME_SETTLE_S", None)
        env.update(self.environment.settings_env())
        env.update({
            "AIRFLOW_HOME": str(self.airflow_home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(PROJECT_ROOT / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAG_RUN_CONF_OVERRIDES_PARAMS": "True",
            "AIRFLOW__CORE__PARALLELISM": "16",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": _database_url(self.pg_admin_url, self.database),
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__CELERY__BROKER_URL": self.redis_url,
            "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + _database_url(self.pg_admin_url, self.database),
            "AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__VISIBILITY_TIMEOUT": str(self.visibility_timeout_s),
            "AIRFLOW__OPERATORS__DEFAULT_QUEUE": self.queue,
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": str(self.heartbeat_timeout_s),
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets["jwt_secret"],
            "AIRFLOW__API__SECRET_KEY": secrets["api_secret_key"],
            "AIRFLOW__CORE__FERNET_KEY": secrets["fernet_key"],
            "AIRFLOW__API__BASE_URL": self.base_url,
            "AIRFLOW__API__PORT": str(self.api_port),
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base_url}/execution/",
            "AIRFLOW__CORE__HOSTNAME_CALLABLE": "devstack.prod.worker_hostname",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(self.root / "logs" / "tasks"),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(self.api_port + 1),
            # False only for tests: their runs are triggered, and the first unpause would also start the
            # latest nightly slot with the default parameters.
            "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": str(self.scheduled_runs),
            "PYTHONUNBUFFERED": "1",
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        })
        env.update(self.extra_env)
        return env

    def worker_env(self, index: int) -> dict[str, str]:
        """Each worker has a scratch folder of its own, as a pod has: a run on an object store shares nothing else."""
        return {**self.env(), HOSTNAME_ENV: self.workers[index],
                "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(self.api_port + 2 + index),
                "FLEETGEN_SCRATCH_DIR": str(self.scratch_dir(self.workers[index]))}

    def scratch_dir(self, worker: str) -> Path:
        return self.root / "scratch" / worker

    def prepare(self, *, recreate_database: bool = False) -> "ProdStack":
        """Create and migrate the metadata DB, apply the fleet's connections, pool and variable."""
        check_services(self.pg_admin_url, self.redis_url)
        self.airflow_home.mkdir(parents=True, exist_ok=True)
        self.log_path("x").parent.mkdir(parents=True, exist_ok=True)
        create_database(self.pg_admin_url, self.database, recreate=recreate_database)
        env = self.env()
        subprocess.run(airflow_cli() + ["db", "migrate"], env=env, check=True, stdout=subprocess.DEVNULL)
        settings = self.environment.airflow_settings(pool_slots=self.pool_slots)
        subprocess.run([sys.executable, "-m", "devstack.prod", "apply-settings"], env=env, check=True,
                       input=json.dumps(settings_document(settings)).encode())
        (self.airflow_home / "simple_auth_manager_passwords.json.generated").write_text(
            json.dumps({"admin": self.admin_password}))
        return self

    def command(self, component: str) -> tuple[list[str], dict[str, str]]:
        if component in self.workers:
            index = self.workers.index(component)
            return (airflow_cli() + ["celery", "worker", "--celery-hostname", f"{component}@%h", "--queues", self.queue,
                                     "--concurrency", str(self.worker_concurrency), "--without-gossip",
                                     "--without-mingle"], self.worker_env(index))
        arguments = {"api-server": ["api-server", "--host", "127.0.0.1", "--port", str(self.api_port)],
                     "scheduler": ["scheduler"], "dag-processor": ["dag-processor"], "triggerer": ["triggerer"]}
        return airflow_cli() + arguments[component], self.env()

    @property
    def components(self) -> tuple[str, ...]:
        return ("api-server", "scheduler", "dag-processor", "triggerer", *self.workers)

    def start_component(self, component: str) -> subprocess.Popen:
        argv, env = self.command(component)
        log = self.log_path(component).open("ab")
        process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.processes[component] = process
        return process

    def start(self, timeout_s: float = 300) -> "ProdStack":
        for component in self.components:
            self.start_component(component)
        self.wait_healthy(timeout_s)
        return self

    def wait_healthy(self, timeout_s: float = 300) -> None:
        """Until the API server reports DB, scheduler, triggerer and dag-processor healthy and every worker
        logged that it is ready."""
        import httpx

        deadline = time.monotonic() + timeout_s
        problem = "not started"
        while time.monotonic() < deadline:
            for component, process in self.processes.items():
                if process.poll() is not None:
                    raise RuntimeError(f"{component} exited with {process.returncode}; see {self.log_path(component)}")
            try:
                health = httpx.get(f"{self.base_url}/api/v2/monitor/health", timeout=5).json()
                unhealthy = [name for name, part in health.items() if part.get("status") != "healthy"]
                not_ready = [w for w in self.workers if b" ready." not in self.log_path(w).read_bytes()]
                problem = f"unhealthy {unhealthy}, workers not ready {not_ready}"
                if not unhealthy and not not_ready:
                    return
            except (httpx.HTTPError, ValueError, OSError) as error:
                problem = f"API server: {error}"
            time.sleep(2)
        raise TimeoutError(f"the stack was not healthy after {timeout_s:.0f} s: {problem}; logs in {self.log_path('x').parent}")

    def kill(self, component: str, sig: int = signal.SIGKILL, grace_s: float = STOP_GRACE_S) -> bool:
        """Signal every process of a component's session, as a machine's shutdown or an orchestrator does
        (a worker's pool and the task processes too: each task runs in a process group of its own, but in
        the worker's session). What still runs ``grace_s`` later is killed. True when it exited in time."""
        self.signal(component, sig)
        return self.reap(component, sig, grace_s)

    def signal(self, component: str, sig: int) -> None:
        """Send ``sig`` to every process of a component's session and return at once (``reap`` then waits)."""
        signal_session(self.processes[component].pid, sig)

    @contextmanager
    def held(self, *components: str) -> Iterator[None]:
        """Inside the block every process of these components' sessions is stopped (SIGSTOP; entered once all
        are): a held worker's task processes write, report and heartbeat nothing. Let go on (SIGCONT) after."""
        leaders = [self.processes[component].pid for component in components]
        try:
            hold_sessions(leaders)
            yield
        finally:
            release_sessions(leaders)

    def reap(self, component: str, sig: int, grace_s: float = STOP_GRACE_S) -> bool:
        """After ``signal``: up to ``grace_s`` for it to exit, then SIGKILL to its session. True when it exited."""
        process = self.processes[component]
        stuck = reap_sessions([process.pid], grace_s)
        process.wait(timeout=10)
        if stuck:
            print(f"{component} did not exit within {grace_s:.0f} s of {signal.Signals(sig).name}: killed "
                  f"(SIGKILL); its log: {self.log_path(component)}", file=sys.stderr, flush=True)
        return not stuck

    def stop(self) -> None:
        leaders = {process.pid: component for component, process in reversed(self.processes.items())
                   if process.poll() is None}
        stuck = terminate_sessions(list(leaders), signal.SIGTERM, STOP_GRACE_S)
        for process in self.processes.values():
            process.wait(timeout=10)
        if stuck:
            print(f"killed (SIGKILL) after {STOP_GRACE_S} s: {', '.join(leaders[pid] for pid in stuck)}",
                  file=sys.stderr, flush=True)
        self.processes.clear()


def settings_document(settings) -> dict:
    import dataclasses

    return {"connections": [dataclasses.asdict(c) for c in settings.connections],
            "pools": [dataclasses.asdict(p) for p in settings.pools],
            "variables": [list(v) for v in settings.variables]}


def apply_settings_from_stdin() -> int:
    """Apply a settings document (``settings_document``) read from stdin to the configured metadata DB."""
    from fleetgen.airflow.apply_settings import apply_to_db
    from fleetgen.airflow.settings_file import Connection, Pool, Settings

    document = json.loads(sys.stdin.read())
    apply_to_db(Settings(tuple(Connection(**c) for c in document["connections"]),
                         tuple(Pool(**p) for p in document["pools"]),
                         tuple(tuple(v) for v in document["variables"])))
    return 0


STATE_FILE = "stack.json"


def up(args: argparse.Namespace) -> int:
    root = Path(args.dir).resolve()
    environment = SimEnvironment(root=root, nodes=2, gpus_per_node=args.gpus_per_node, prompts=args.prompts,
                                 sim={"time_scale": args.time_scale, "load_seconds": 20.0}).prepare().start()
    stack = ProdStack(environment=environment, api_port=args.port, admin_password=args.password)
    try:
        stack.prepare().start()
    except BaseException:
        stack.stop()
        environment.stop()
        raise
    state = {"pids": {name: p.pid for name, p in stack.processes.items()},
             "sshd_pids": [p.pid for p in environment._sshd], "ssh_ports": environment.ssh_ports,
             "base_port": environment.base_port, "nodes": environment.nodes, "gpus_per_node": environment.gpus_per_node}
    (root / STATE_FILE).write_text(json.dumps(state))
    conf = {"fleet_file": str(environment.fleet_file()), "prompts_path": str(environment.prompts_path),
            "output_root": str(environment.output_root)}
    print(f"Production-shaped Airflow is up: {stack.base_url} (user admin, password {args.password})\n"
          f"  metadata DB {stack.database} on PostgreSQL, CeleryExecutor on {stack.redis_url}, workers "
          f"{', '.join(stack.workers)}; logs in {stack.log_path('x').parent}\n"
          f"Trigger '{DAG_ID}' with:\n  {json.dumps(conf)}\nStop with: make prod-down", flush=True)
    return 0


def down(args: argparse.Namespace) -> int:
    root = Path(args.dir).resolve()
    state_path = root / STATE_FILE
    if not state_path.exists():
        print(f"no stack recorded in {state_path}: nothing to stop")
        return 0
    state = json.loads(state_path.read_text())
    stuck = terminate_sessions([*state["pids"].values(), *state["sshd_pids"]], signal.SIGTERM, STOP_GRACE_S)
    names = {pid: name for name, pid in state["pids"].items()}
    if stuck:
        print(f"killed (SIGKILL) after {STOP_GRACE_S} s: {', '.join(names.get(pid, f'sshd {pid}') for pid in stuck)}")
    environment = SimEnvironment(root=root, nodes=state["nodes"], gpus_per_node=state["gpus_per_node"])
    environment.base_port = state["base_port"]
    environment.stop_servers()
    state_path.unlink()
    print("stopped the Airflow components, the SSH endpoints and the simulated servers")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devstack.prod", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("up", help="create the DB, start every component in the background")
    stop = commands.add_parser("down", help="stop what `up` started")
    for sub in (start, stop):
        sub.add_argument("--dir", default=str(PROJECT_ROOT / ".prod"), help="shared storage of the stack")
    start.add_argument("--port", type=int, default=8080, help="the API server's port")
    start.add_argument("--password", default="admin", help="password of the 'admin' user")
    start.add_argument("--prompts", type=int, default=3000)
    start.add_argument("--gpus-per-node", type=int, default=4)
    start.add_argument("--time-scale", type=float, default=10.0)
    commands.add_parser("apply-settings", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.command == "apply-settings":
        return apply_settings_from_stdin()
    try:
        return up(args) if args.command == "up" else down(args)
    except ServiceMissing as missing:
        print(f"error: {missing}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
