"""DAG-level utilisation: the whole sglang_generation DAG on Airflow standalone (LocalExecutor) against a
simulated 7-GPU node, enough prompts for at least 8 shards generating at once under the fleetgen_fleet pool.

Utilisation = the generation stage's output tokens/s (all completion tokens over first request start to last
finish: shard boundaries, pool hand-overs and the tail included) / the fleet's simulated capacity for this
workload (bench/utilization.py's ``capacity``: every server at full batch, less its prompts' prefill stalls),
read from the servers' own /server_info after the run. Every server's peak of requests in flight (from the
stats rows: each request from its start to its finish) is compared with its effective max_running_requests x
headroom: the goal is a busy fleet without a deep queue.

Usage: python bench/dag_utilization.py [--prompts 12000] [--shard-size 1500] [--pool 8] [--time-scale 10] [--smoke]
Last line: dag_utilization fleet=<x.xxx> shards=<n>   (n: most shards generating at once)
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import parse_args  # noqa: E402
from utilization import HEADROOM, capacity  # noqa: E402  (one capacity formula for both benchmarks)

from fleetgen.outputs import RunLayout  # noqa: E402
from devstack.demo import DEMO_API_KEY_FILE, SimEnvironment, airflow_cli, airflow_env, free_port_block  # noqa: E402
from devstack.prod import settings_document  # noqa: E402
from devstack.sessions import STOP_GRACE_S, terminate_sessions  # noqa: E402

DAG_ID = "sglang_generation"
SHARD_TASK = "generate.generate_shard"
# Enough prompts for two shards at once, on servers that load in seconds.
SMOKE = {"prompts": 200, "shard_size": 100, "pool": 2, "load_seconds": 1.0}


class ServerInfoFleet:
    """What ``capacity`` reads of a fleet: each server's simulator figures, from its /server_info."""

    def __init__(self, ports: list[int], headers: dict[str, str]) -> None:
        self.ports = ports
        self.headers = headers

    def capacity(self, index: int) -> dict:
        return self.server_info(index)["sim"]

    def server_info(self, index: int) -> dict:
        response = httpx.get(f"http://127.0.0.1:{self.ports[index]}/server_info", headers=self.headers, timeout=10)
        response.raise_for_status()
        return response.json()["internal_states"][0]


def start_standalone(environment: SimEnvironment, pool: int, port: int) -> tuple[subprocess.Popen, dict]:
    home = environment.root / "airflow"
    env = airflow_env(home, environment.settings_env())
    env.update({"AIRFLOW__API__PORT": str(port), "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
                "AIRFLOW__CORE__PARALLELISM": str(pool + 4), "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": str(pool + 4),
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
                "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False", "FLEETGEN_RETRY_DELAY_S": "1"})
    home.mkdir(parents=True, exist_ok=True)
    subprocess.run(airflow_cli() + ["db", "migrate"], env=env, check=True, stdout=subprocess.DEVNULL)
    settings = environment.airflow_settings(pool_slots=pool)
    subprocess.run([sys.executable, "-m", "devstack.prod", "apply-settings"], env=env, check=True,
                   input=json.dumps(settings_document(settings)).encode())
    (home / "simple_auth_manager_passwords.json.generated").write_text(json.dumps({"admin": "bench"}))
    log = (environment.root / "standalone.log").open("wb")
    process = subprocess.Popen(airflow_cli() + ["standalone"], env=env, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    return process, env


def api_client(port: int, timeout_s: float = 180) -> httpx.Client:
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            token = httpx.post(f"{base}/auth/token", json={"username": "admin", "password": "bench"}, timeout=10)
            if token.status_code in (200, 201):
                client = httpx.Client(base_url=f"{base}/api/v2", timeout=30,
                                      headers={"Authorization": f"Bearer {token.json()['access_token']}"})
                if client.get(f"/dags/{DAG_ID}").status_code == 200:
                    return client
                client.close()
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"Airflow standalone did not serve the DAG on {base} within {timeout_s:.0f} s")
        time.sleep(2)


def peak_concurrent(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


def generation_figures(run_dir: Path) -> dict:
    """Output tokens/s over first request start to last finish, mean prompt and output tokens, completions,
    and each server's peak of requests in flight, all from the run's stats rows."""
    rows = [json.loads(line) for path in RunLayout(run_dir).shard_files("stats") for line in path.open()]
    intervals = [(row["finished_at"] - row["latency_s"], row["finished_at"]) for row in rows]
    output = sum(row["completion_tokens"] for row in rows)
    by_server: dict[str, list[tuple[float, float]]] = {}
    for row, interval in zip(rows, intervals):
        by_server.setdefault(row["server"], []).append(interval)
    span = max(end for _, end in intervals) - min(start for start, _ in intervals)
    return {"tokens_per_s": output / span, "mean_prompt": sum(row["prompt_tokens"] for row in rows) / len(rows),
            "mean_output": output / len(rows), "completions": len(rows),
            "peak_in_flight": {server: peak_concurrent(spans) for server, spans in sorted(by_server.items())}}


def _iso_seconds(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def run(args: argparse.Namespace, root: Path) -> int:
    environment = SimEnvironment(root=root, prompts=args.prompts,
                                 sim={"time_scale": args.time_scale, "load_seconds": args.load_seconds}).prepare().start()
    port = free_port_block(2)
    standalone, _ = start_standalone(environment, args.pool, port)
    ports = [environment.node_base_port(0) + gpu for gpu in range(environment.gpus_per_node)]
    headers = {"Authorization": f"Bearer {(root / DEMO_API_KEY_FILE).read_text().strip()}"}  # the servers' --api-key
    try:
        api = api_client(port)
        api.patch(f"/dags/{DAG_ID}", json={"is_paused": False}).raise_for_status()
        conf = {"fleet_file": str(environment.fleet_file()), "prompts_path": str(environment.prompts_path),
                "output_root": str(environment.output_root), "shard_size": args.shard_size, "parallel_shards": 0,
                "max_tokens": 4096, "headroom": HEADROOM, "ready_timeout_s": 300}
        run_id = api.post(f"/dags/{DAG_ID}/dagRuns", json={"logical_date": None, "conf": conf}).json()["dag_run_id"]
        started = time.monotonic()
        while (state := api.get(f"/dags/{DAG_ID}/dagRuns/{run_id}").json()["state"]) not in ("success", "failed"):
            time.sleep(5)
        print(f"run {run_id}: {state} in {time.monotonic() - started:.0f} s (log: {root / 'standalone.log'})")
        if state != "success":
            return 1
        shards = [t for t in api.get(f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances", params={"limit": 200})
                  .json()["task_instances"] if t["task_id"] == SHARD_TASK]
        peak = peak_concurrent([(_iso_seconds(t["start_date"]), _iso_seconds(t["end_date"])) for t in shards])
        figures = generation_figures(RunLayout.for_run(environment.output_root, run_id).root)
        fleet = ServerInfoFleet(ports, headers)
        workload, decode_only = capacity(fleet, figures["mean_prompt"], figures["mean_output"])
        allowed = {str(port): fleet.server_info(index)["effective_max_running_requests_per_dp"] * HEADROOM
                   for index, port in enumerate(ports)}
        rate = figures["tokens_per_s"]
        print(f"{figures['completions']} completions in {len(shards)} shards, at most {peak} generating at once "
              f"(pool {args.pool})")
        print(f"generation: {rate:.0f} output tokens/s; capacity {workload:.0f} (decode only {decode_only:.0f})")
        print("peak requests in flight per server / effective max_running_requests x headroom: " + ", ".join(
            f"{server.rsplit(':', 1)[1]}: {count}/{allowed[server.rsplit(':', 1)[1]]:.0f}"
            for server, count in figures["peak_in_flight"].items()))
        print(f"dag_utilization fleet={rate / workload:.3f} shards={peak}")
        return 0
    finally:
        terminate_sessions([standalone.pid], signal.SIGTERM, STOP_GRACE_S)
        standalone.wait(timeout=10)
        environment.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=12000)
    parser.add_argument("--shard-size", type=int, default=1500)
    parser.add_argument("--pool", type=int, default=8, help="slots of the fleetgen_fleet pool: shards at once")
    parser.add_argument("--time-scale", type=float, default=10.0)
    parser.add_argument("--load-seconds", type=float, default=20.0, help="simulated seconds a server takes to load")
    parser.add_argument("--dir", help="keep everything here (default: a temporary folder)")
    args = parse_args(parser, SMOKE)
    if args.dir:
        return run(args, Path(args.dir).resolve())
    with tempfile.TemporaryDirectory(prefix="dag-utilization-") as folder:
        return run(args, Path(folder))


if __name__ == "__main__":
    sys.exit(main())
