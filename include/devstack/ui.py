"""``make ui``: Airflow standalone (UI, scheduler, triggerer) against the demo's simulated fleet.

Same setup as ``make demo`` (same folder, same airflow_settings.yaml), but instead of one
``dags test`` it starts the whole of Airflow so the DAG can be triggered from its form. The deployment's
defaults point at the simulated fleet's prompts and output folder, so the form's defaults are a valid run
and a scheduled run started by "unpause on trigger" finds its prompts. The browser tests start it the same
way (``AirflowUI``).
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from devstack.demo import PROJECT_ROOT, SimEnvironment, airflow_cli, airflow_env, prepare_airflow
from devstack.sessions import STOP_GRACE_S, terminate_sessions


@dataclass
class AirflowUI:
    """A simulated fleet and an ``airflow standalone`` serving the UI on ``port``; ``start``/``stop``."""

    root: Path
    port: int = 8080
    password: str = "admin"
    sim: dict = field(default_factory=lambda: {"time_scale": 100.0, "load_seconds": 20.0})
    prompts: int = 3000
    gpus_per_node: int = 7  # the committed fleet (airflow_settings.yaml) names 7 GPUs; fewer narrows it
    extra_env: dict = field(default_factory=dict)
    environment: SimEnvironment | None = None
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://localhost:{self.port}"

    @property
    def airflow_home(self) -> Path:
        return self.root / "airflow"

    def start(self, log_path: Path | None = None) -> AirflowUI:
        self.environment = SimEnvironment(root=self.root, sim=self.sim, prompts=self.prompts,
                                          gpus_per_node=self.gpus_per_node).prepare().start()
        env = airflow_env(self.airflow_home, self.environment.settings_env())
        # A real scheduler and triggerer: wait_ready keeps its hold against the fast-resume race, whatever
        # the calling process set for in-process runs (fleetgen/airflow/triggers.py).
        env.pop("FLEETGEN_RESUME_SETTLE_S", None)
        # An AIRFLOW_VAR_ variable wins over the metadata DB's: the fleet narrowed to this node's GPUs.
        fleet = yaml.safe_load(env["AIRFLOW_VAR_FLEETGEN_FLEET"])
        fleet["nodes"][0]["gpus"] = list(range(self.gpus_per_node))
        env["AIRFLOW_VAR_FLEETGEN_FLEET"] = json.dumps(fleet)
        env.update({"AIRFLOW__API__PORT": str(self.port), "AIRFLOW__API__BASE_URL": self.url,
                    "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
                    # The deployment's defaults (the DAG's params read them): the form's defaults are a valid
                    # run, and a scheduled run finds its prompts (its output root comes with settings_env).
                    "FLEETGEN_PROMPTS_PATH": str(self.environment.prompts_path), **self.extra_env})
        prepare_airflow(self.airflow_home, env)
        (self.airflow_home / "simple_auth_manager_passwords.json.generated").write_text(
            json.dumps({"admin": self.password}))
        output = log_path.open("wb") if log_path else None
        self.process = subprocess.Popen(airflow_cli() + ["standalone"], env=env, start_new_session=True,
                                        stdout=output, stderr=subprocess.STDOUT if output else None)
        return self

    def wait_until_up(self, timeout_s: float = 180) -> None:
        import httpx

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"airflow standalone exited with {self.process.returncode}")
            try:
                if httpx.get(f"{self.url}/api/v2/monitor/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(2)
        raise TimeoutError(f"the Airflow UI did not answer on {self.url} within {timeout_s:.0f} s")

    def stop(self) -> None:
        # standalone ignores SIGINT when backgrounded: TERM its whole session, task processes included.
        if self.process is not None:
            terminate_sessions([self.process.pid], signal.SIGTERM, STOP_GRACE_S)
            self.process.wait(timeout=10)
        if self.environment is not None:
            self.environment.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devstack.ui", description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=str(PROJECT_ROOT / ".demo"))
    parser.add_argument("--port", type=int, default=8080, help="the Airflow UI's port")
    parser.add_argument("--password", default="admin", help="password of the 'admin' user")
    args = parser.parse_args(argv)

    ui = AirflowUI(root=Path(args.dir).resolve(), port=args.port, password=args.password).start()
    print(f"Airflow UI: {ui.url}  (user admin, password {args.password})\n"
          f"The trigger form's defaults run on the simulated fleet: prompts {ui.environment.prompts_path}, "
          f"outputs under {ui.environment.output_root}.\nStop with Ctrl-C.", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # a TERM to us also stops Airflow and the fleet
    try:
        return ui.process.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        ui.stop()


if __name__ == "__main__":
    sys.exit(main())
