"""Three nights of the DAG on a simulated node: what a nightly run relaunches and regenerates.

Night 1 runs N prompts on a cold node; night 2 the same prompts (the servers stay up between nights,
as ``keep_servers_up`` does by default); night 3 the same file with 2 % new prompts and 1 % edited. Each
night is a full ``airflow dags test`` of ``sglang_generation`` with ``reuse_completions=always`` (what a
scheduled run does by default) and ``pin_full_context_plan`` (the same plan every night: the workload
mode's nightly steps would relaunch the servers whose plan moved, as they should). Figures come from each night's report: servers (re)launched, completions
generated tonight (the rest were reused), and the DAG run's wall seconds.

Last line: ``nightly relaunched=<n1>/<n2>/<n3> generated=<g1>/<g2>/<g3> seconds=<s1>/<s2>/<s3>``
(goal: night 2 relaunches 0 and generates 0; night 3 generates ~3 % and relaunches 0).

    python bench/nightly.py [--prompts 2000] [--gpus 2] [--dir .bench-nightly] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

from _common import parse_args
from devstack.demo import DAGS_TEST_ENV, SimEnvironment, airflow_cli, airflow_env, prepare_airflow
from sglang_sim.synthetic import synthetic_prompt

NEW_SHARE = 0.02
EDITED_SHARE = 0.01
SMOKE = {"prompts": 100, "gpus": 1}


def night_three_prompts(path: Path, count: int) -> None:
    """The same prompts with every 100th edited (1 %) and 2 % new ones appended."""
    lines = []
    for index in range(count):
        prompt = synthetic_prompt(index)
        if index % round(1 / EDITED_SHARE) == 7:
            prompt["messages"][-1]["content"] += " Answer in French."
        lines.append(json.dumps(prompt, separators=(",", ":")))
    lines += [json.dumps(synthetic_prompt(count + index, seed=1), separators=(",", ":"))
              for index in range(round(count * NEW_SHARE))]
    path.write_text("\n".join(lines) + "\n")


def run_night(env: dict, conf: dict, log_path: Path, output_root: Path, before: set[str]) -> tuple[dict, float]:
    started = time.monotonic()
    with log_path.open("w") as log_file:
        result = subprocess.run(airflow_cli() + ["dags", "test", "sglang_generation", "-c", json.dumps(conf)],
                                env={**env, **DAGS_TEST_ENV}, stdout=log_file, stderr=subprocess.STDOUT)
    seconds = time.monotonic() - started
    reports = [path for path in output_root.glob("*/report/report.json") if path.parent.parent.name not in before]
    if result.returncode != 0 or len(reports) != 1:
        print(log_path.read_text()[-4000:])
        raise SystemExit(f"night failed (exit {result.returncode}); log {log_path}")
    return json.loads(reports[0].read_text()), seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=2000)
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--dir", default=".bench-nightly")
    args = parse_args(parser, SMOKE)
    root = Path(args.dir).resolve()
    shutil.rmtree(root, ignore_errors=True)
    environment = SimEnvironment(root=root, gpus_per_node=args.gpus, prompts=args.prompts,
                                 sim={"time_scale": 100.0, "load_seconds": 10.0}).prepare().start()
    env = airflow_env(root / "airflow", environment.settings_env())
    figures = []
    try:
        prepare_airflow(root / "airflow", env)
        fleet = yaml.safe_load(env["AIRFLOW_VAR_FLEETGEN_FLEET"])
        fleet["nodes"][0]["gpus"] = list(range(args.gpus))
        fleet_path = root / "fleet.json"
        fleet_path.write_text(json.dumps(fleet))
        conf = {"prompts_path": str(environment.prompts_path), "output_root": str(environment.output_root),
                "fleet_file": str(fleet_path), "shard_size": max(1, args.prompts // 2), "max_tokens": 4096,
                "ready_timeout_s": 300, "reuse_completions": "always", "sample_interval_s": 1.0,
                # the plan pinned: the workload mode steps it night after night, and a changed plan relaunches
                "pin_full_context_plan": True}
        for night in (1, 2, 3):
            if night == 3:
                night_three_prompts(environment.prompts_path, args.prompts)
            before = {path.name for path in environment.output_root.glob("*")}
            report, seconds = run_night(env, conf, root / f"night{night}.log", environment.output_root, before)
            figures.append((report["servers"]["relaunched"], report["reuse"]["generated"], seconds))
            print(f"night {night}: {report['reuse']['generated']} generated, {report['reuse']['reused']} reused, "
                  f"{report['servers']['kept']} server(s) kept, {report['servers']['relaunched']} (re)launched, "
                  f"{seconds:.0f} s", flush=True)
    finally:
        environment.stop()
    print("nightly relaunched={} generated={} seconds={}".format(
        "/".join(str(f[0]) for f in figures), "/".join(str(f[1]) for f in figures),
        "/".join(f"{f[2]:.0f}" for f in figures)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
