"""Exactly-once under kill -9 and under failing servers, against real simulated SGLang processes."""

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from generate_fakes import shard_output
from devstack.local_fleet import LocalSimFleet
from devstack.sessions import hold_sessions, release_sessions

from fleetgen.generate import GenerationSettings, ShardRunOptions, run_shard
from fleetgen.prompts.scan import iter_prompt_ids, plan_shards, scan_prompts
from sglang_sim.synthetic import write_synthetic_prompts

pytestmark = pytest.mark.slow
CHILD = Path(__file__).with_name("shard_child.py")


def settings(**overrides):
    return GenerationSettings(**{"model": "qwen3.6-27b", "max_tokens": 512, "request_timeout_s": 60.0,
                                 "recheck_initial_s": 0.2, "recheck_max_s": 1.0, "retry_backoff_s": 0.05,
                                 **overrides})


def served(fleet, count):
    return sum(fleet.capacity(i)["finished"] for i in range(count))


def drained(fleet, count):
    """Until no server runs or queues anything: once the shard is over nothing new arrives, so it stays so."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        states = [fleet.capacity(i) for i in range(count)]
        if all(s["running"] == 0 and s["waiting"] == 0 for s in states):
            return
        time.sleep(0.1)
    raise AssertionError(f"servers did not drain in 60 s; last seen (running, waiting): "
                         f"{[(s['running'], s['waiting']) for s in states]}")


def kill_past(child: subprocess.Popen, stats: Path, kill_at: int, *, total: int, cap_s: float = 60.0) -> int:
    """SIGKILL the shard's process (a session of its own) at a look that finds more than ``kill_at`` of its
    ``total`` prompts on disk and not all of them; returns that count. Each look is made with the process held
    (SIGSTOP), so it dies at the count read and cannot finish in between; fails with what the last look saw
    when the process ended first or after ``cap_s``."""
    deadline = time.monotonic() + cap_s
    while True:
        hold_sessions([child.pid])
        try:
            done = lines(stats)
            if kill_at < done < total and child.poll() is None:
                os.kill(child.pid, signal.SIGKILL)
                child.wait()
                return done
        finally:
            release_sessions([child.pid])
        assert child.poll() is None and done < total, \
            f"the shard process ended ({child.returncode}) with {done} of {total} prompts on disk, before the kill " \
            f"point {kill_at}"
        assert time.monotonic() < deadline, f"{done} prompts on disk after {cap_s:.0f} s, kill point {kill_at}"
        time.sleep(0.05)  # a look holds the process some milliseconds: it runs most of the time


def lines(path):
    try:
        with open(path, "rb") as handle:
            return sum(1 for _ in handle)
    except FileNotFoundError:
        return 0


def test_kill_9_at_several_points_then_retry_gives_every_prompt_exactly_once(tmp_path):
    prompts = write_synthetic_prompts(tmp_path / "prompts.jsonl", 600)
    shard = plan_shards(prompts, shard_size=600, scan=scan_prompts(prompts))[0]
    with LocalSimFleet(tmp_path / "fleet", 2, sim={"time_scale": 6.0, "load_seconds": 0.2}) as fleet:
        endpoints = fleet.endpoints()
        in_flight_limit = sum(e.max_in_flight for e in endpoints)
        job = tmp_path / "job.json"
        job.write_text(json.dumps({"shard": shard, "servers": [e.to_dict() for e in endpoints],
                                   "out_dir": str(tmp_path / "out"), "settings": settings().to_dict()}))
        before = served(fleet, 2)
        stats = tmp_path / "out" / "stats" / "shard-00000.jsonl"
        kills = 0
        for kill_at in (0, 120, 300, 450):  # killed with more than this many prompts on disk, the rest in flight
            child = subprocess.Popen([sys.executable, str(CHILD), str(job)], stderr=subprocess.DEVNULL,
                                     start_new_session=True)
            kill_past(child, stats, kill_at, total=600)
            kills += 1
        summary = run_shard(shard, endpoints, tmp_path / "out", settings())
        drained(fleet, 2)
        received = served(fleet, 2) - before

    out = shard_output(tmp_path / "out")
    ids = [r["id"] for r in out["completions"]]
    assert sorted(ids) == sorted(iter_prompt_ids(prompts)) and not out["errors"]
    assert [r["id"] for r in out["stats"]] == ids
    assert summary["skipped_already_done"] + summary["done"] == 600
    redone = received - 600
    assert 0 <= redone <= kills * in_flight_limit, (redone, kills, in_flight_limit)


def test_two_live_tries_of_one_shard_started_a_second_apart_write_every_prompt_once(tmp_path):
    prompts = write_synthetic_prompts(tmp_path / "prompts.jsonl", 400)
    shard = plan_shards(prompts, shard_size=400)[0]
    with LocalSimFleet(tmp_path / "fleet", 2, sim={"time_scale": 6.0, "load_seconds": 0.2}) as fleet:
        job = {"shard": shard, "servers": [e.to_dict() for e in fleet.endpoints()], "out_dir": str(tmp_path / "out"),
               "settings": settings().to_dict()}
        tries = []
        for try_number in (1, 2):
            (tmp_path / f"job{try_number}.json").write_text(json.dumps({**job, "try_number": try_number}))
            tries.append(subprocess.Popen([sys.executable, str(CHILD), str(tmp_path / f"job{try_number}.json")],
                                          stderr=subprocess.PIPE, text=True))
            time.sleep(1.0)
        errors = [child.communicate(timeout=120)[1] for child in tries]
    assert tries[0].returncode != 0 and tries[1].returncode == 0, errors
    assert "ShardLeaseLost" in errors[0] and "[shard 0" in errors[0], errors[0]
    assert "try 2 (pid" in errors[0] and "try 1 (pid" in errors[0]
    out = shard_output(tmp_path / "out")
    ids = [r["id"] for r in out["completions"]]
    assert sorted(ids) == sorted(iter_prompt_ids(prompts)) and not out["errors"]
    assert [r["id"] for r in out["stats"]] == ids


def test_servers_that_crash_hang_or_answer_500_mid_run(tmp_path, caplog):
    prompts = write_synthetic_prompts(tmp_path / "prompts.jsonl", 500)
    shard = plan_shards(prompts, shard_size=500)[0]
    faults = {1: {"crash_after_requests": 40}, 2: {"hang_after_requests": 40}, 3: {"http_500_after": 60}}
    with LocalSimFleet(tmp_path / "fleet", 4, sim={"time_scale": 20.0, "load_seconds": 0.2},
                       faults=faults) as fleet:
        endpoints = fleet.endpoints()
        with caplog.at_level(logging.INFO, logger="fleetgen.generate"):
            summary = run_shard(shard, endpoints, tmp_path / "out",
                                settings(request_timeout_s=3.0, health_timeout_s=1.0),
                                options=ShardRunOptions(progress_interval_s=1.0))
    out = shard_output(tmp_path / "out")
    assert sorted(r["id"] for r in out["completions"]) == sorted(iter_prompt_ids(prompts))
    assert not out["errors"] and summary["done"] == 500
    servers = [summary["servers"][e.name] for e in endpoints]
    assert not servers[0]["marked_down"]
    assert servers[1]["marked_down"][0]["reason"].startswith("connection:")
    assert servers[2]["marked_down"][0]["reason"].startswith("timeout:")
    assert servers[3]["marked_down"][0]["reason"].startswith("http_500:")
    assert Counter(r["server"] for r in out["completions"])[endpoints[0].name] > 100
    for endpoint in endpoints[1:]:
        assert f"server {endpoint.name} marked down at" in caplog.text
    assert "done" in caplog.text and "tok/s" in caplog.text


def test_a_hung_server_is_abandoned_without_waiting_out_the_request_timeout(tmp_path, caplog):
    prompts = write_synthetic_prompts(tmp_path / "prompts.jsonl", 300)
    shard = plan_shards(prompts, shard_size=300)[0]
    with LocalSimFleet(tmp_path / "fleet", 2, sim={"time_scale": 20.0, "load_seconds": 0.2},
                       faults={1: {"hang_after_requests": 20}}) as fleet:
        endpoints = fleet.endpoints()
        with caplog.at_level(logging.INFO, logger="fleetgen.generate"):
            # A 10-minute request timeout: only the stall watchdog can free the hung server's prompts in time.
            summary = run_shard(shard, endpoints, tmp_path / "out",
                                settings(request_timeout_s=600.0, health_timeout_s=1.0, stall_check_s=2.0),
                                options=ShardRunOptions(progress_interval_s=1.0))
    out = shard_output(tmp_path / "out")
    assert sorted(r["id"] for r in out["completions"]) == sorted(iter_prompt_ids(prompts))
    assert summary["done"] == 300 and not out["errors"]
    hung = summary["servers"][endpoints[1].name]
    assert hung["marked_down"][0]["reason"].startswith("stalled: no answer for")
    assert f"server {endpoints[1].name} marked down at" in caplog.text
