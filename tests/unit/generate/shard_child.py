"""Runs one shard from a job file, as a generate_shard task would; the kill -9 and two-tries tests
start it (``try_number`` in the job names the try, as Airflow's would)."""

import json
import sys

from fleetgen.generate import GenerationSettings, ServerEndpoint, ShardRunOptions, run_shard

if __name__ == "__main__":
    job = json.loads(open(sys.argv[1]).read())
    run_shard(job["shard"], [ServerEndpoint.from_dict(s) for s in job["servers"]], job["out_dir"],
              GenerationSettings.from_dict(job["settings"]), options=ShardRunOptions(try_number=job.get("try_number")))
