"""``make ui``: Airflow standalone (UI, scheduler, triggerer) against the demo's simulated fleet.

Same setup as ``make demo`` (same folder, same airflow_settings.yaml), but instead of one
``dags test`` it starts the whole of Airflow so the DAG can be triggered from its form.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from sglang_sim.demo import PROJECT_ROOT, SimEnvironment, airflow_cli, airflow_env, prepare_airflow


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang_sim.ui", description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=str(PROJECT_ROOT / ".demo"))
    parser.add_argument("--port", type=int, default=8080, help="the Airflow UI's port")
    parser.add_argument("--password", default="admin", help="password of the 'admin' user")
    args = parser.parse_args(argv)

    root = Path(args.dir).resolve()
    environment = SimEnvironment(root=root, sim={"time_scale": 100.0, "load_seconds": 20.0}).prepare().start()
    airflow_home = root / "airflow"
    env = airflow_env(airflow_home, environment.settings_env())
    env.update({"AIRFLOW__API__PORT": str(args.port), "AIRFLOW__API__BASE_URL": f"http://localhost:{args.port}",
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin"})
    prepare_airflow(airflow_home, env)
    (airflow_home / "simple_auth_manager_passwords.json.generated").write_text(json.dumps({"admin": args.password}))
    conf = {"prompts_path": str(environment.prompts_path), "output_root": str(environment.output_root)}
    print(f"Airflow UI: http://localhost:{args.port}  (user admin, password {args.password})\n"
          f"Trigger 'sglang_generation' with this configuration (or fill the form):\n  {json.dumps(conf)}\n"
          f"Stop with Ctrl-C.", flush=True)
    standalone = subprocess.Popen(airflow_cli() + ["standalone"], env=env, start_new_session=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # a TERM to us also stops Airflow and the fleet
    try:
        return standalone.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        # standalone ignores SIGINT when backgrounded: TERM its whole process group.
        try:
            os.killpg(standalone.pid, signal.SIGTERM)
            standalone.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        environment.stop()


if __name__ == "__main__":
    sys.exit(main())
