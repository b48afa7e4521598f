"""The tuning trial end to end with dag.test() over real SSH on three simulated B200 servers: the incumbent on two,
a challenger on one; the decision follows what the simulated servers really generate per second, the servers on
the losing configuration are relaunched on the winner, and every prompt ends with exactly one completion.

The two candidates differ by their request cap only (4 and 16 running requests; the rest of the launch the same):
the simulated decode step grows little with the batch (include/sglang_sim/perf.py), so four times the batch is
about three times the output tokens per second. The second run swaps which of them is the incumbent, and the
decision swaps with it."""

import json
import os
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow

SLOW_CAP, FAST_CAP = 4, 16
PROMPTS = 1500


@pytest.fixture(scope="module")
def trial_env(tmp_path_factory, airflow_db):
    """One simulated node of 3 B200 GPUs behind the embedded SSH server, with short outputs of steady length so that
    a window of a few seconds holds tens of completions, and real time (time_scale 1) so that the client keeps up."""
    from devstack.demo import SimEnvironment

    environment = SimEnvironment(root=tmp_path_factory.mktemp("trial"), gpus_per_node=3, prompts=PROMPTS,
                                 sim={"time_scale": 1.0, "load_seconds": 2.0, "output_mean_tokens": 150.0,
                                      "output_shape": 40.0}).prepare().start()
    try:
        with environment.airflow_settings_applied():
            yield environment
    finally:
        environment.stop()


def _fleet_file(env, cap: int) -> Path:
    fleet = yaml.safe_load(os.environ["AIRFLOW_VAR_FLEETGEN_FLEET"])  # the committed fleet, applied
    fleet["nodes"][0]["gpus"] = [0, 1, 2]
    fleet["server"]["extra_args"] = list(fleet["server"]["extra_args"]) + ["--max-running-requests", str(cap)]
    path = env.root / f"fleet-cap-{cap}.json"
    path.write_text(json.dumps(fleet))
    return path


def _run(dag, env, *, incumbent_cap: int, challenger_cap: int, output_root: Path, **extra):
    conf = {"fleet_file": str(_fleet_file(env, incumbent_cap)), "prompts_path": str(env.prompts_path),
            "output_root": str(output_root), "shard_size": PROMPTS // 2, "max_tokens": 512, "ready_timeout_s": 120,
            "sample_interval_s": 0.5, "tuning_trial": True, "tuning_trial_share": 0.5, "tuning_trial_window_s": 3.0,
            "tuning_trial_min_gain": 0.03, "pin_full_context_plan": True, "relaunch_servers": False,
            "reuse_completions": "never",
            "tuning_candidates": [{"name": f"cap_{challenger_cap}",
                                   "flags": {"--max-running-requests": challenger_cap}}],
            # the relaunch round is what these runs check: made whatever it costs (tests/unit cover when_it_pays)
            "tuning_trial_max_s": 0, "tuning_trial_relaunch": "always", **extra}
    dag_run = dag.test(run_conf=conf)
    states = {(ti.task_id, ti.map_index): ti.state for ti in dag_run.get_task_instances()}
    assert dag_run.state == "success", states
    run_dir = next(output_root.glob("*/report/report.json")).parent.parent
    return states, run_dir


def _completion_ids(run_dir: Path) -> list[str]:
    return [json.loads(line)["id"] for path in sorted((run_dir / "completions").glob("*.jsonl"))
            for line in path.read_text().splitlines()]


def _servers_by_candidate(run_dir: Path) -> dict[str, list[str]]:
    servers = json.loads((run_dir / "trial-decision.json").read_text())["servers"]
    by: dict[str, list[str]] = {}
    for server, entry in servers.items():
        by.setdefault(entry["candidate"], []).append(server)
    return by


@pytest.mark.parametrize("incumbent_cap, challenger_cap, winner", [
    (FAST_CAP, SLOW_CAP, "incumbent"),            # the challenger is slower: kept, its server moved back
    (SLOW_CAP, FAST_CAP, f"cap_{FAST_CAP}"),      # swapped: the challenger wins, the incumbent's servers move
])
def test_the_trial_keeps_the_measured_winner_and_relaunches_the_losers_on_it(dag, trial_env, incumbent_cap,
                                                                             challenger_cap, winner):
    output_root = trial_env.output_root / f"incumbent-{incumbent_cap}"
    states, run_dir = _run(dag, trial_env, incumbent_cap=incumbent_cap, challenger_cap=challenger_cap,
                           output_root=output_root)
    decision = json.loads((run_dir / "trial-decision.json").read_text())
    print(f"trial (incumbent cap {incumbent_cap}, challenger cap {challenger_cap}): {decision['reason']}")
    assert decision["winner"] == winner, decision["reason"]
    scores = decision["scores"]
    challenger = f"cap_{challenger_cap}"
    assert set(scores) == {"incumbent", challenger}, decision
    fast, slow = (challenger, "incumbent") if winner == challenger else ("incumbent", challenger)
    assert scores[fast]["lower"] > scores[slow]["upper"] and scores[fast]["median"] > 1.5 * scores[slow]["median"]
    by_candidate = _servers_by_candidate(run_dir)
    assert len(by_candidate["incumbent"]) == 2 and len(by_candidate[challenger]) == 1

    # the relaunch round ran: the losers were stopped and started on the winner, the winners kept
    assert states[("trial.relaunch_needed", -1)] == "success"
    assert all(state == "success" for (task, _), state in states.items() if task.startswith("relaunch."))
    losers = [server for candidate, servers in by_candidate.items() if candidate != winner for server in servers]
    report = json.loads((run_dir / "report" / "report.json").read_text())
    assert report["servers"]["relaunched"] == len(losers) and report["servers"]["kept"] == 3 - len(losers)
    caps = {row["server"]: row["effective"]["max_running_requests"] for row in report["tuning"]}
    winner_cap = challenger_cap if winner == challenger else incumbent_cap
    assert set(caps.values()) == {winner_cap}, caps
    # GPU-hours of every server from its first launch, and what the chosen configuration saves per million output
    # tokens against the incumbent at the candidates' steady rates (nothing when the incumbent is kept)
    gpu_hours = report["gpu_hours"]
    assert set(gpu_hours["per_server"]) == set(caps) and gpu_hours["not_recorded"] == [], gpu_hours
    [saving] = [row for row in gpu_hours["configurations"]["savings"] if row["against"] == "the incumbent (incumbent)"]
    assert saving["configuration"] == winner and (saving["gpu_hours_per_million_tokens"] > 0) is (winner == challenger)

    # exactly once: the trial's shards and the rest are the job's, every prompt once
    ids = _completion_ids(run_dir)
    expected = [json.loads(line)["id"] for line in trial_env.prompts_path.read_text().splitlines()]
    assert sorted(ids) == sorted(expected) and len(ids) == len(set(ids)) == PROMPTS
    trial_shards = [ti for (task, _), ti in states.items() if task == "generate.trial_shard"]
    assert trial_shards and all(state == "success" for state in trial_shards)
    assert report["validation"]["success"]
    # recorded for the next night under the key of this fleet, model and workload
    history = [json.loads(line) for line in (output_root / "tuning-trials.jsonl").read_text().splitlines()]
    assert [record["decision"]["winner"] for record in history] == [winner]


def test_a_trial_cut_by_its_time_cap_leaves_the_rest_of_its_shard_to_the_winner_and_every_prompt_ends_once(
        dag, trial_env):
    """tuning_trial_max_s of 12 s (a warm-up and 3 windows of 3 s), for a trial shard of 750 prompts that takes 25 to
    35 s uncut: it stops taking prompts 12 s after it began and finishes those in flight; generate_shard is given it
    again and generates what it left on the servers in use after the decision, each prompt once."""
    output_root = trial_env.output_root / "time-cap"
    states, run_dir = _run(dag, trial_env, incumbent_cap=FAST_CAP, challenger_cap=SLOW_CAP, output_root=output_root,
                           tuning_trial_max_s=12)
    report = json.loads((run_dir / "report" / "report.json").read_text())
    by_shard: dict[int, list[dict]] = {}
    for item in report["shards"]["items"]:
        by_shard.setdefault(item["shard_id"], []).append(item)
    # the trial's shard 0 ran twice (trial_shard, then generate_shard); the cap left part of it to the second
    assert sorted(by_shard) == [0, 1] and len(by_shard[0]) == 2 and len(by_shard[1]) == 1, by_shard
    trial, finish = by_shard[0]
    assert 0 < trial["done"] < PROMPTS // 2 and trial["left"] == PROMPTS // 2 - trial["done"], by_shard
    assert finish["done"] == trial["left"] and not finish["left"], by_shard
    assert report["shards"]["count"] == 2 and report["shards"]["done"] == PROMPTS
    ids = _completion_ids(run_dir)
    expected = [json.loads(line)["id"] for line in trial_env.prompts_path.read_text().splitlines()]
    assert sorted(ids) == sorted(expected) and len(ids) == len(set(ids)) == PROMPTS
    assert report["validation"]["success"]
    assert all(state == "success" for (task, _), state in states.items() if task.startswith("generate."))


def test_a_tie_whose_relaunch_would_not_pay_keeps_the_challengers_server_and_skips_the_round(dag, trial_env):
    """A challenger whose flag the simulated speed does not read (``--stream-interval``) is as fast as the incumbent
    within the windows' noise: moving its server back would gain a few server-seconds over the ~30 s left, while the
    round idles all 3 servers for the first round's measured load (2 s each at least). With tuning_trial_relaunch at
    its default the server keeps its configuration, the relaunch group is skipped and every prompt ends once."""
    output_root = trial_env.output_root / "tie"
    states, run_dir = _run(dag, trial_env, incumbent_cap=FAST_CAP, challenger_cap=FAST_CAP, output_root=output_root,
                           tuning_trial_relaunch="when_it_pays", relaunch_servers=True,  # the first round launches
                           tuning_candidates=[{"name": "stream_interval_4", "flags": {"--stream-interval": 4}}])
    decision = json.loads((run_dir / "trial-decision.json").read_text())
    [challenger_server] = _servers_by_candidate(run_dir)["stream_interval_4"]
    relaunch = decision["relaunch"]
    print(f"tie: {decision['reason']}; {relaunch['reason']}")
    assert decision["winner"] == "incumbent"
    assert relaunch["moved"] == {challenger_server: "stream_interval_4"} and relaunch["round_s"] >= 2.0
    assert relaunch["pays"] is False and relaunch["policy"] == "when_it_pays", relaunch
    # relaunch_needed (a short-circuit) said no: every task of the round skipped but the hand-over of the servers
    skipped = {task for (task, _), state in states.items() if task.startswith("relaunch.") and state == "skipped"}
    assert skipped == {"relaunch.stop_servers", "relaunch.launch_servers", "relaunch.servers_to_wait",
                       "relaunch.wait_ready"}, states
    assert states[("relaunch.servers_in_use", -1)] == "success"
    ids = _completion_ids(run_dir)
    assert sorted(ids) == sorted(json.loads(line)["id"] for line in trial_env.prompts_path.read_text().splitlines())
    assert len(ids) == len(set(ids)) == PROMPTS
    report = json.loads((run_dir / "report" / "report.json").read_text())
    assert report["validation"]["success"]
    assert "- Relaunch round (when_it_pays): relaunching would idle 3 server(s)" in (
        run_dir / "report" / "report.md").read_text()
