"""A simulated SGLang server replaced on its port mid-shard, by hand from our own command line (the same
--weight-version) with --max-running-requests 4: none of its completions is accepted and the shard fails naming
both launches. Real processes and HTTP: the simulator answers /server_info as SGLang does."""

import dataclasses
import os
import subprocess
import threading
import time

import pytest
from generate_fakes import shard_output
from devstack.local_fleet import LocalSimFleet, get_json, wait_healthy

from fleetgen.errors import ServerReplaced
from fleetgen.generate import GenerationSettings, run_shard
from fleetgen.nodes import launch_identity, readiness
from fleetgen.prompts.scan import plan_shards
from sglang_sim.synthetic import write_synthetic_prompts

pytestmark = pytest.mark.slow
NIGHT_1 = launch_identity.launch_id("night-1")


def wait_for(condition, what: str, cap_s: float = 120.0):
    deadline = time.monotonic() + cap_s
    while time.monotonic() < deadline:
        seen = condition()
        if seen:
            return seen
        time.sleep(0.02)
    raise AssertionError(f"{what}: not seen within {cap_s:.0f} s (last: {condition()!r})")


def completions(out) -> int:
    return len(shard_output(out)["completions"])


def test_a_server_replaced_on_its_port_by_hand_is_refused_and_fails_the_shard_naming_both(tmp_path):
    prompts = write_synthetic_prompts(tmp_path / "prompts.jsonl", 400)
    shard = plan_shards(prompts, shard_size=400)[0]
    out = tmp_path / "out"
    settings = GenerationSettings(model="qwen3.6-27b", max_tokens=256, request_timeout_s=60.0, recheck_initial_s=0.2,
                                  recheck_max_s=0.5, retry_backoff_s=0.05, all_down_timeout_s=120.0)
    with LocalSimFleet(tmp_path / "fleet", 1, sim={"time_scale": 1.0, "load_seconds": 0.2},
                       extra_flags=("--weight-version", NIGHT_1)) as fleet:
        info = get_json(fleet.url(0) + "/server_info")
        fields = readiness.launch_fields(info, readiness.args_as_flags(fleet.flags))
        endpoints = [dataclasses.replace(endpoint, launch_id=NIGHT_1, launch_fields=fields)
                     for endpoint in fleet.endpoints()]
        outcome: dict = {}

        def generate():
            try:
                outcome["summary"] = run_shard(shard, endpoints, out, settings)
            except Exception as exc:  # what the shard ended with, for the test thread
                outcome["error"] = exc

        worker = threading.Thread(target=generate)
        worker.start()
        wait_for(lambda: completions(out) >= 20 or outcome, "20 completions")
        old = fleet.processes[0]
        old.kill()  # stopped by hand: what it had in flight is lost
        old.wait(timeout=60)
        argv = [word if word != "64" else "4" for word in old.args]  # our command line, --max-running-requests 4
        assert argv != list(old.args)
        env = {**os.environ, **fleet.node.env(), "CUDA_VISIBLE_DEVICES": "0"}
        with (tmp_path / "replacement.log").open("wb") as log:
            replacement = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        fleet.processes.append(replacement)
        wait_healthy(replacement, fleet.url(0), timeout_s=90)
        replacement_up_at = time.time()  # seconds after the old launch died: anything finished from now is its
        worker.join(timeout=120)
        assert not worker.is_alive(), "the shard did not end"
    assert isinstance(outcome.get("error"), ServerReplaced), outcome
    finished_at = [record["finished_at"] for record in shard_output(out)["completions"]]
    assert len(finished_at) >= 20 and max(finished_at) < replacement_up_at  # none written by the replacement
    message = outcome["error"].message
    assert "is not the launch wait_ready read" in message and "launched by run 'night-1'" in message
    assert "max_running_requests: read 64, now 4" in message
    assert outcome["error"].hint.startswith("the server was restarted outside fleetgen")
