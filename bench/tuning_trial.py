"""What the tuning trial buys: the seed job on the simulated 7 x B200 node with the trial, without it, under SGLang's
automatic sizing and on the trial's winner from the start, side by side in one run.

Every arm is a whole run of ``sglang_generation`` (``dag.test()``, the DAG's own tasks) on the same simulated node:
the committed fleet (``airflow_settings.yaml``: Qwen3.6-27B, MTP 3/1/4, one server per GPU), the same prompts and
sampling, each arm in an output root of its own (no earlier night's trial, plan or completions reused), every DAG
parameter given (its default unless the arm sets it):

1. ``trial``: the trial on, its default candidates (docs/tuning-trial.md): the configuration it chose; ``--tries N``
   runs it N times, each in a fresh output root, and counts how many reached the same decision;
2. ``incumbent``: the trial off, the fleet file's own configuration on every server;
3. ``auto``: ``tuning: sglang_defaults``, SGLang's automatic sizing of the same launch options;
4. ``fixed``: the trial's winner from the start, the trial off: the winner's args as the fleet's own (and its cap as
   ``max_running_requests`` for a cap candidate). When the winner is the incumbent, arm 2 is that job;
5. ``tie``: the trial on with three ``tuning_candidates`` whose change the simulator's speed does not see
   (``TIE_CANDIDATES``). Listed candidates come before the defaults, and the 7 servers spare 3 challengers, so every
   challenger is as fast as the incumbent: the incumbent must be kept. Only its decision is read, so it runs on a
   job of its own, ``--tie-prompts`` long, with a share that gives its trial as many prompts as arm 1's.

The job: the seed's size, a night of hundreds of thousands of prompts, at the DAG's own ``tuning_trial_share``
(3 %). A trial of the seed workload (requests of ~2,600 output tokens at 71 running per server) needs about 5,000
prompts for its challengers to give 3 windows each, so the default job (170,000 prompts) is the one the DAG's
default share is sized for; a smaller ``--prompts`` needs a larger ``--trial-share`` and pays the trial and the
relaunch round over fewer prompts.

Figures, all from the runs' own outputs, the same way for every run. A run's output tokens/s per GPU is its report's
``throughput.tokens_per_s_generation`` (its completions' tokens over first request start to last finish: shard
boundaries, the tail and, with a trial, the relaunch round included) over its GPUs.

- ``gain_vs_incumbent`` = arm 4's / arm 2's: the chosen configuration against the fleet file's own, the whole job;
- ``gain_vs_auto`` = arm 4's / arm 3's;
- ``trial_share`` = the GPU-seconds the trial's servers spent in it (``trial-decision.json``'s ``trial_seconds``: first
  to last metrics row of the trial shards) over the trial run's (its generation span x its GPUs);
- ``whole_job_ratio`` = arm 1's / arm 4's: the job with the trial against the same job knowing the answer beforehand.
  It charges the challengers' speed on the trial's share and the relaunch round: the trial's drain, the decision,
  the losers' stop, load and readiness, during which the rest of the job waits; or, when the trial measured that
  the round would cost more than it gains (``tuning_trial_relaunch`` at its default, docs/tuning-trial.md §7), the
  losers' lower speed for the rest of the job. The simulator runs generation ``--time-scale`` times faster than the
  wall clock; a server's load is given in simulated seconds (``--load-sim-s``) and passed on in wall seconds, but
  Airflow's tasks run at wall speed, so the round's task hops weigh ``--time-scale`` times more here than on GPUs;
  the bench prints the job's simulated length and the round's wall seconds beside the ratio;
- ``tie_kept_incumbent`` = yes when arm 5 kept the incumbent.

The trial's windows, time cap and sampling interval are given in simulated seconds (``--window-sim-s``,
``--trial-max-sim-s``, ``--sample-sim-s``: the DAG's defaults, 60 s, 1,800 s and 5 s) and passed to the DAG in wall
seconds (divided by ``--time-scale``), so a window holds as many completions as on GPUs.

Usage: python bench/tuning_trial.py [--prompts 170000] [--trial-share 0.03] [--tries 3] [--time-scale 20] [--smoke]
Last line: ``tuning_trial chosen=<name> gain_vs_incumbent=<x> gain_vs_auto=<x> trial_share=<x> whole_job_ratio=<x>
tie_kept_incumbent=<yes|no>``
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

from _common import parse_args
from devstack.demo import DAGS_TEST_ENV, SimEnvironment, airflow_env, prepare_airflow
from fleetgen.airflow.run_config import RunConfig
from fleetgen.outputs import RunLayout
from fleetgen.tuning.plan import INCUMBENT
from sglang_sim.synthetic import write_synthetic_prompts

DAG_ID = "sglang_generation"
TRIAL_SHARE_MAX = next(spec.high for spec in RunConfig.settings() if spec.name == "tuning_trial_share")
BENCH_NAME = "tuning_trial"
# Flags the simulated server accepts and whose value its speed does not read (include/sglang_sim/engine.py): in SGLang
# --stream-interval sets how often a streamed response is sent and --schedule-policy lpm orders the waiting queue by
# shared prefix; a non-streaming client of prompts that share no prefix sees the same batch either way.
TIE_CANDIDATES = [{"name": "stream_interval_4", "flags": {"--stream-interval": 4}},
                  {"name": "stream_interval_16", "flags": {"--stream-interval": 16}},
                  {"name": "schedule_lpm", "flags": {"--schedule-policy": "lpm"}}]
# The smoke run's caps at 8 running requests: a trial needs a warm-up turnover and three windows' worth of
# completions per server (tuning/trial_plan.py prompts_needed), a few dozen prompts at that cap.
SMOKE = {"prompts": 240, "tie_prompts": 240, "gpus": 3, "tries": 1, "trial_share": 0.5, "max_running_requests": 8,
         "time_scale": 20.0, "load_sim_s": 20.0, "window_sim_s": 20.0, "sample_sim_s": 4.0,
         "output_mean_tokens": 600.0}


def load_dag(env: dict):
    """The DAG, parsed in this process with ``env`` (the simulated deployment's Airflow settings) as its environment:
    every arm runs through ``dag.test()`` here, so Airflow and the tasks' libraries load once for all of them."""
    os.environ.update({**env, **DAGS_TEST_ENV})
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    if bag.import_errors:
        raise SystemExit(f"the DAG does not import: {bag.import_errors}")
    return bag.dags[DAG_ID]


@contextmanager
def output_to(log_path: Path):
    """This process's stdout and stderr (the tasks' logs among them) go to ``log_path`` meanwhile."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with log_path.open("ab") as log_file:
        os.dup2(log_file.fileno(), 1)
        os.dup2(log_file.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


def dag_default(name: str):
    """The DAG's own default of parameter ``name``."""
    return next(spec.default_value() for spec in RunConfig.settings() if spec.name == name)


def full_conf(**params) -> dict:
    """Every DAG parameter: ``params`` over the declared defaults. In one process ``dag.test()`` keeps what an earlier
    run's conf set for a parameter the next conf leaves out, so no arm may leave one out."""
    return {**{spec.name: spec.default_value() for spec in RunConfig.settings()}, **params}


def run_arm(dag, conf: dict, log_path: Path) -> Path:
    """One run of the DAG with ``conf``; the run's folder (the only one under its output root)."""
    with output_to(log_path):
        state = dag.test(run_conf=conf).state
    reports = list(Path(conf["output_root"]).glob("*/report/report.json"))
    if state != "success" or len(reports) != 1:
        print(log_path.read_text()[-4000:])
        raise SystemExit(f"run {log_path.stem} ended {state}; log {log_path}")
    return reports[0].parent.parent


def per_gpu_rate(report: dict) -> float:
    """Output tokens/s per GPU over the run's generation span: its report's own figure over its GPUs."""
    return report["throughput"]["tokens_per_s_generation"] / len(report["per_gpu"])


def caps_in_use(report: dict) -> list[int]:
    """The running-request caps the servers reported at the end, one per server."""
    return sorted({row["effective"].get("max_running_requests") for row in report["tuning"]} - {None})


def candidate_plan(run_dir: Path, candidate: str) -> dict:
    """``candidate``'s plan for the fleet's first server, from the trial run's candidate plans."""
    plans = json.loads(RunLayout(run_dir).candidate_plans.read_text())["plans"]
    return next(iter(plans[candidate].values()))


def fixed_fleet(fleet: dict, plan: dict, incumbent_plan: dict) -> tuple[dict, dict]:
    """(the fleet, the DAG parameters) that launch ``plan``'s configuration from the start: its args as the fleet's
    own, its cap as max_running_requests when the tuner's bound is where it differs from the incumbent's, and its
    tuning mode when it is SGLang's own sizing (``sglang_auto``)."""
    fixed = json.loads(json.dumps(fleet))
    if plan.get("extra_args") is not None:
        fixed["server"]["extra_args"] = list(plan["extra_args"])
    params = {}
    if plan.get("mode") and plan["mode"] != incumbent_plan.get("mode"):
        params["tuning"] = plan["mode"]
    cap = plan["inputs"]["bounds"].get("max_running_requests")
    if cap != incumbent_plan["inputs"]["bounds"].get("max_running_requests"):
        params["max_running_requests"] = int(cap)
    return fixed, params


def trial_figures(run_dir: Path, report: dict) -> dict:
    """The trial's decision, its GPU-seconds share of the run, and the relaunch round's wall seconds: from the trial's
    last completion to the first request of the rest of the job (a stats row that started after the decision)."""
    decision = json.loads(RunLayout(run_dir).trial_decision.read_text())
    if "skipped" in decision:
        raise SystemExit(f"{run_dir}: no trial ran: {decision['skipped']}")
    trial_gpu_s = sum(entry["trial_seconds"] * entry["gpus"] for entry in decision["servers"].values())
    job_gpu_s = report["timing"]["generation_seconds"] * len(report["per_gpu"])
    after, trial_last = [], 0.0
    for path in RunLayout(run_dir).shard_files("stats"):
        for line in path.open():
            row = json.loads(line)
            started = row["finished_at"] - row["latency_s"]
            if started >= decision["decided_at"]:
                after.append(started)
            else:
                trial_last = max(trial_last, row["finished_at"])
    caps: dict[str, set] = {}
    for entry in decision["servers"].values():
        caps.setdefault(entry["candidate"], set()).add(entry["cap"])
    return {"winner": decision["winner"], "reason": decision["reason"], "share": trial_gpu_s / job_gpu_s,
            "round_s": min(after) - trial_last if after else None, "scores": decision["scores"],
            "unscored": decision.get("unscored", {}), "caps": caps,
            "servers": Counter(entry["candidate"] for entry in decision["servers"].values()),
            "job_s": report["timing"]["generation_seconds"],
            "relaunch": (decision.get("relaunch") or {}).get("reason", "not recorded")}


def trial_costs(figures: dict) -> dict | None:
    """What the trial cost the whole job, as shares of it, from the trial run's own figures: its GPU-seconds share at
    its split fleet's measured speed below the winner's (``trial``; a candidate the trial did not judge counted at
    the winner's speed, so this is a lower bound), and the relaunch round, during which the whole fleet waited
    (``round``). ``1 - trial - round`` is what ``whole_job_ratio`` should be if nothing else differs between the
    two runs. None when the winner has no score (no trial was judged)."""
    winner = figures["scores"].get(figures["winner"])
    if not winner:
        return None
    servers = figures["servers"]
    speeds = [(figures["scores"].get(name) or winner)["median"] / winner["median"] * count
              for name, count in servers.items()]
    trial = figures["share"] * (1 - sum(speeds) / sum(servers.values()))
    round_share = (figures["round_s"] or 0.0) / figures["job_s"]
    return {"trial": trial, "round": round_share, "expected_ratio": 1 - trial - round_share}


def score_lines(figures: dict) -> list[str]:
    """Each candidate's cap and measured output tokens/s per GPU, as the decision file holds them."""
    lines = []
    for name, caps in sorted(figures["caps"].items(), key=lambda item: (item[0] != INCUMBENT, item[0])):
        cap = "/".join(str(value) for value in sorted(caps))
        score = figures["scores"].get(name)
        measured = (f"{score['median']:,.0f} ({score['lower']:,.0f}..{score['upper']:,.0f}, {score['windows']} windows)"
                    if score else f"not judged ({figures['unscored'].get(name, 0)} windows)")
        lines.append(f"    {name:<18} cap {cap:>4}: {measured}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=170000)
    parser.add_argument("--tie-prompts", type=int, default=20000, help="the tie arm's job (only its decision is read)")
    parser.add_argument("--gpus", type=int, default=7)
    parser.add_argument("--tries", type=int, default=3, help="runs of the trial arm, to compare their decisions")
    parser.add_argument("--trial-share", type=float, default=dag_default("tuning_trial_share"),
                        help="tuning_trial_share (default: the DAG's)")
    parser.add_argument("--window-sim-s", type=float, default=60.0, help="tuning_trial_window_s, simulated seconds")
    parser.add_argument("--sample-sim-s", type=float, default=5.0, help="sample_interval_s, simulated seconds")
    parser.add_argument("--trial-max-sim-s", type=float, default=1800.0,
                        help="tuning_trial_max_s, simulated seconds (0: no time cap)")
    parser.add_argument("--shard-size", type=int, default=0, help="0: the trial in one shard, the rest in four")
    parser.add_argument("--max-running-requests", type=int, default=0, help="the DAG parameter (0: the tuner decides)")
    parser.add_argument("--time-scale", type=float, default=20.0, help="simulated seconds per wall second")
    parser.add_argument("--load-sim-s", type=float, default=50.0, help="simulated seconds a server takes to load")
    parser.add_argument("--output-mean-tokens", type=float, default=None,
                        help="the simulator's mean output length (default: its own, the seed workload's)")
    parser.add_argument("--dir", default=".bench-tuning-trial")
    parser.add_argument("--keep-completions", action="store_true", help="keep every run's completions on disk")
    args = parse_args(parser, SMOKE)
    root = Path(args.dir).resolve()
    shutil.rmtree(root, ignore_errors=True)
    sim = {"time_scale": args.time_scale, "load_seconds": args.load_sim_s / args.time_scale}
    if args.output_mean_tokens:
        sim["output_mean_tokens"] = args.output_mean_tokens
    environment = SimEnvironment(root=root, gpus_per_node=args.gpus, prompts=args.prompts, sim=sim).prepare().start()
    env = airflow_env(root / "airflow", environment.settings_env())
    trial_prompts = math.ceil(args.prompts * args.trial_share)
    shard_size = args.shard_size or max(trial_prompts, math.ceil((args.prompts - trial_prompts) / 4))
    common = {"prompts_path": str(environment.prompts_path), "shard_size": shard_size, "max_tokens": 4096,
              "ready_timeout_s": 300, "reuse_completions": "never", "tuning_trial_share": args.trial_share,
              "max_running_requests": args.max_running_requests,
              "tuning_trial_window_s": args.window_sim_s / args.time_scale,
              "tuning_trial_max_s": args.trial_max_sim_s / args.time_scale,
              "sample_interval_s": args.sample_sim_s / args.time_scale}
    fleet = environment.fleet()
    try:
        prepare_airflow(root / "airflow", env)
        dag = load_dag(env)

        def arm(name: str, fleet_document: dict | None = None, **params) -> tuple[Path, dict]:
            fleet_path = root / f"fleet-{name}.json"
            fleet_path.write_text(json.dumps(fleet_document or fleet))
            conf = full_conf(**{**common, **params}, fleet_file=str(fleet_path),
                             output_root=str(root / "output" / name))
            started = time.monotonic()
            run_dir = run_arm(dag, conf, root / f"{name}.log")
            report = json.loads(RunLayout(run_dir).report_json.read_text())
            print(f"{name}: {per_gpu_rate(report):,.0f} output tokens/s per GPU (wall) over "
                  f"{report['timing']['generation_seconds']:.0f} s of generation, caps {caps_in_use(report)}, "
                  f"{report['totals']['completions']} completions, {time.monotonic() - started:.0f} s "
                  f"(log {root / f'{name}.log'})", flush=True)
            if not args.keep_completions:  # the figures come from the report, the stats and the decision
                shutil.rmtree(RunLayout(run_dir).kind_dir("completions"), ignore_errors=True)
            return run_dir, report

        print(f"{args.prompts} prompts on {args.gpus} simulated B200 servers, time scale {args.time_scale:g}, trial "
              f"share {args.trial_share:g}, windows of {args.window_sim_s:g} simulated s, shards of {shard_size}",
              flush=True)
        tries = []
        for index in range(args.tries):
            run_dir, report = arm("trial" if index == 0 else f"trial-{index + 1}", tuning_trial=True)
            figures = trial_figures(run_dir, report)
            print("\n".join([f"  {figures['reason']}", *score_lines(figures),
                             f"  the relaunch round: {figures['relaunch']}"]), flush=True)
            tries.append((run_dir, report, figures))
        trial_dir, trial_report, trial = tries[0]
        _, incumbent_report = arm("incumbent", tuning_trial=False)
        _, auto_report = arm("auto", tuning_trial=False, tuning="sglang_defaults")
        if trial["winner"] == INCUMBENT:
            print("fixed: the winner is the incumbent, so the incumbent-only run is the job on it from the start")
            fixed_report = incumbent_report
        else:
            document, params = fixed_fleet(fleet, candidate_plan(trial_dir, trial["winner"]),
                                           candidate_plan(trial_dir, INCUMBENT))
            print(f"fixed: {trial['winner']} from the start: server.extra_args {document['server']['extra_args']}"
                  + "".join(f", {name} {value}" for name, value in params.items()), flush=True)
            _, fixed_report = arm("fixed", document, tuning_trial=False, **params)
        tie_share = min(TRIAL_SHARE_MAX, trial_prompts / args.tie_prompts)  # the same trial on a job of its own
        tie_path = write_synthetic_prompts(root / "tie-prompts.jsonl", args.tie_prompts)
        tie_dir, tie_report = arm("tie", tuning_trial=True, tuning_candidates=TIE_CANDIDATES,
                                  prompts_path=str(tie_path), tuning_trial_share=tie_share,
                                  shard_size=max(1, math.ceil(args.tie_prompts * tie_share)))
        tie = trial_figures(tie_dir, tie_report)
        print("\n".join([f"  {tie['reason']}", *score_lines(tie)]))
    finally:
        environment.stop()

    decisions = Counter(figures["winner"] for _, _, figures in tries)
    print(f"decisions of {len(tries)} trial run(s) of the same job: "
          + ", ".join(f"{name} x{count}" for name, count in decisions.most_common()))
    chosen, incumbent, auto = per_gpu_rate(fixed_report), per_gpu_rate(incumbent_report), per_gpu_rate(auto_report)
    ratios = [per_gpu_rate(report) / chosen for _, report, _ in tries]
    round_s = "none" if trial["round_s"] is None else f"{trial['round_s']:.1f} s"
    costs = trial_costs(trial)
    if costs is not None:
        print(f"what the trial cost the job: its share at its split fleet's speed {costs['trial']:.1%}, the relaunch "
              f"round {costs['round']:.1%}; 1 - both = {costs['expected_ratio']:.3f}")
    simulated_min = trial_report["timing"]["generation_seconds"] * args.time_scale / 60
    print(f"the trial run: {simulated_min:,.0f} simulated minutes of generation, its relaunch round (the trial's last "
          f"completion to the next request) {round_s} wall; whole job against the winner fixed, per try: "
          + ", ".join(f"{ratio:.3f}" for ratio in ratios))
    print(f"{BENCH_NAME} chosen={trial['winner']} gain_vs_incumbent={chosen / incumbent:.3f} "
          f"gain_vs_auto={chosen / auto:.3f} trial_share={trial['share']:.3f} whole_job_ratio={ratios[0]:.3f} "
          f"tie_kept_incumbent={'yes' if tie['winner'] == INCUMBENT else 'no'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
