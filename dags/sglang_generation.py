"""sglang_generation: tune SGLang servers to the GPU memory they have, relaunch them, generate, validate, report.

Wiring only: every task calls fleetgen (include/fleetgen). Nothing here reads files or connects anywhere.
"""

from __future__ import annotations

import inspect
import os
from datetime import timedelta

import pendulum
from airflow.sdk import DAG, Asset, TaskGroup, task
from airflow.timetables.trigger import CronTriggerTimetable

from fleetgen.airflow import failures, generate_tasks, server_tasks, tasks, trial_tasks, validate_tasks
from fleetgen.airflow.context import fail_fast
from fleetgen.airflow.operators import WAIT_READY_DOC, WaitReadyOperator
from fleetgen.airflow.params import dag_params
from fleetgen.airflow.run_storage import PREVIOUS_REPORTS, PREVIOUS_RUN, PROMPTS, on_run_storage
from fleetgen.tuning.planner import MAX_BACKOFF_ATTEMPTS
from fleetgen.airflow.task_labels import NODE_LABEL, SERVER_LABEL, SHARD_LABEL

DOC_MD = f"""
### SGLang offline generation on a GPU fleet
1. **tune**: `load_fleet` reads the fleet description, `probe_gpus` runs `nvidia-smi` on every node over SSH,
   `scan_prompts` validates the prompts file (prompts too long for the context go to `rejects.jsonl`),
   `derive_plan` sizes `--mem-fraction-static`,
   `--max-mamba-cache-size`, `--max-running-requests`… from the memory budget and logs the budget table.
   With **dry_run** the run stops here.
2. **servers**: keep our servers already running tonight's plan (their `/server_info` flags, model path and SGLang
   version equal it, `/health` is 200; **relaunch_servers** forces a full relaunch); stop the others (pid file +
   command line check), verify the memory came back, launch one server per GPU/TP group under `setsid`, then wait
   (deferred) until each is ready and read back the *effective* limits from `/server_info`. A memory error re-plans
   that server one step smaller ({MAX_BACKOFF_ATTEMPTS} times at most).
   With 3 servers or more and **tuning_trial** on, the plan names challengers (speculative decoding off, one draft
   step fewer, the cap at 3/4 and 1/2 of what memory holds, SGLang's own sizing, **tuning_candidates**): the
   incumbent runs on most servers, each challenger on one.
3. **trial**: `generate.trial_shard` generates the first **tuning_trial_share** of the prompts on that split fleet
   (its completions are the job's), starting none past **tuning_trial_max_s** (what it leaves goes to
   `generate_shard`); `decide` measures each server's steady output tokens/s per GPU from its
   `/metrics`, keeps a challenger only when clearly faster (**tuning_trial_min_gain**), and the `relaunch` group
   stops the servers on losing configurations and starts them on the winner (the others are kept), unless the
   trial measured that the round costs the fleet more than it gains (**tuning_trial_relaunch**).
4. **generate**: one mapped task per shard; each first copies the completions of the last successful run whose
   prompt, model (`model_identity`: weights, config, tokenizer, chat template, SGLang version…) and sampling are
   unchanged
   (**reuse_completions**), then keeps every server at its effective limit × headroom and resumes from its
   checkpoint when retried. Each shard also samples the servers' `/metrics` and the nodes' `nvidia-smi`.
5. **validate**: Great Expectations over the per-completion stats (one completion per prompt, token and finish
   reason bounds); **report**: throughput overall / per GPU / per server and the comparison with the previous run;
   **batch_api_files**: the results as OpenAI Batch API output and error files (`batch/`).

Outputs: `{{output_root}}/{{run_id}}/` (`completions/`, `errors/`, `stats/`, `validation/`, `report/`).
"""

# Every parameter is declared once, in fleetgen.airflow.run_config (form title, section, bounds, description).
PARAMS = dag_params()

# The nightly schedule and its timezone come from the deployment's environment (Astro: .env), not a
# Variable: reading a Variable here would hit the metadata DB at every parse.
SCHEDULE = CronTriggerTimetable(os.environ.get("FLEETGEN_SCHEDULE", "0 2 * * *"),
                                timezone=os.environ.get("FLEETGEN_TIMEZONE", "UTC"))
# Downstream training DAGs can be scheduled on this Asset; each event's extra names the run's folder and its Parquet
# dataset (docs/output-formats.md §10). The URI stays fixed: Airflow knows an asset by name and URI, and one taken
# from the deployment's output root would leave the asset inactive (its tasks failing) whenever that root changes.
GENERATED_DATASET = Asset(name="sglang_generation_completions", uri="file:///fleetgen/sglang_generation/completions",
                          group="fleetgen")


def _task(python_callable, *, kind=task, reads=(), **kwargs):
    """A task documented by its callable's docstring (a mapped task does not take it by itself) whose deterministic
    errors fail it at once (fail_fast), run on its run's storage (on_run_storage: on an object store, a private copy
    of the run holding what ``reads`` names, airflow/run_storage.py; ``reads=None``: a task that only shapes its
    arguments and touches no file of the run, so no copy). Every Python task goes through here, so that
    these rules live in one place. fail_fast
    changes nothing for node_names, flatten and run_outcome, which raise none of those errors (run_outcome's RunFailed
    is not one); go_live's only one, a ConfigError from the run's params, load_fleet raises first."""
    return kind(fail_fast(on_run_storage(python_callable, reads=reads)), doc_md=inspect.getdoc(python_callable),
                **kwargs)


# What the tasks that read more than the run's small files read of a run on an object store (airflow/run_storage.py).
TRIAL_READS = ["stats", "metrics"]
VALIDATE_READS = [PROMPTS, "stats", "errors"]
# The plan learns from the previous successful run (its measured prompt tokens, KV demand and caps), the report
# compares with it and with the newest earlier run under SGLang's own sizing.
PLAN_READS = [PROMPTS, PREVIOUS_RUN]
REPORT_READS = ["completions", "stats", "errors", "events", "metrics", "gpu", "reuse", PREVIOUS_REPORTS]
BATCH_READS = ["completions", "errors"]

# The fleet description as the tasks that need it read it: load_fleet's XCom, pulled when the task renders.
FLEET = "{{ ti.xcom_pull(task_ids='load_fleet') }}"
# The plans in use at the end, for release_servers (it runs whatever happened): the trial's decision, else tonight's
# (None when derive_plan did not get to run). Both name the same servers; the decision moves none.
PLANS = "{{ ti.xcom_pull(task_ids='trial.decide') or ti.xcom_pull(task_ids='tune.derive_plan') }}"

DEFAULT_ARGS = {
    "owner": "ml-infra",
    "retries": 2,
    # Environment, not I/O: lets tests retry without waiting. Deterministic errors never retry (fail_fast).
    "retry_delay": timedelta(seconds=float(os.environ.get("FLEETGEN_RETRY_DELAY_S", "20"))),
    "on_failure_callback": failures.describe_failure,
    "on_retry_callback": failures.describe_retry,  # a try that fails and is retried leaves its line too
}

with DAG(
    dag_id="sglang_generation",
    description="Tune SGLang servers to their GPUs, relaunch them, generate in shards, validate, report.",
    doc_md=DOC_MD,
    schedule=SCHEDULE,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    params=PARAMS,
    tags=["sglang", "generation", "gpu"],
    render_template_as_native_obj=True,
) as dag:
    # The fleet description reaches the tasks that need it through a template, not as an argument: one edge
    # from load_fleet instead of one to nearly every task, so the graph reads like the job.
    fleet = _task(tasks.load_fleet, task_id="load_fleet")()
    nodes = _task(tasks.node_names, task_id="node_names", reads=None)(fleet)

    with TaskGroup("tune") as tune:
        inventories = _task(tasks.probe_gpus, task_id="probe_gpus", map_index_template=NODE_LABEL).partial(
            fleet=FLEET).expand(node=nodes)
        # Reads the model's config.json over SSH (its context length) besides the prompts file: transient
        # errors retry, the prompts file's own problems fail at once (fail_fast).
        prompt_scan = _task(tasks.scan_prompts, task_id="scan_prompts", reads=[PROMPTS])(FLEET)
        identity = _task(tasks.model_identity, task_id="model_identity")(
            FLEET)
        # The model identity keys the tuning trials of earlier nights (tuning/trial_history.py).
        plans = _task(tasks.derive_plan, task_id="derive_plan", reads=PLAN_READS)(
            FLEET, inventories, prompt_scan, identity)
        live = _task(tasks.go_live, kind=task.short_circuit, task_id="go_live")()
        plans >> live
    fleet >> [prompt_scan, identity]

    with TaskGroup("servers") as servers:
        stopped = _task(server_tasks.stop_servers, task_id="stop_servers", map_index_template=NODE_LABEL).partial(
            fleet=FLEET, plans=plans).expand(node=nodes)
        # Retried with the default retries: a try finds the servers an earlier one launched (server_tasks).
        launched = _task(server_tasks.launch_servers, task_id="launch_servers",
                         map_index_template=NODE_LABEL).partial(
            fleet=FLEET, plans=plans, stopped=stopped).expand(node=nodes)
        to_wait = _task(server_tasks.flatten, task_id="servers_to_wait", reads=None)(launched)
        readiness = WaitReadyOperator.partial(
            task_id="wait_ready", fleet=FLEET, retries=0,  # its timeout: the run's ready_timeout_s
            map_index_template=SERVER_LABEL, doc_md=WAIT_READY_DOC,
            # unset: the trigger's default hold against Airflow's fast-resume race (airflow/triggers.py)
            resume_settle_s=os.environ.get("FLEETGEN_RESUME_SETTLE_S"),
        ).expand(server=to_wait)
        live >> stopped >> launched

    shard_task = {"retries": 3, "pool": "fleetgen_fleet", "max_active_tis_per_dagrun": 16,
                  "map_index_template": SHARD_LABEL}
    with TaskGroup("generate") as generate:
        # The trial's shards: none without a trial, and the mapped task is then skipped.
        trial_shards = _task(generate_tasks.plan_trial_shards, task_id="plan_trial_shards", reads=[PROMPTS])(
            prompt_scan, plans)
        trial_results = _task(generate_tasks.trial_shard, task_id="trial_shard", **shard_task).partial(
            readiness=readiness.output, fleet=FLEET, model_identity=identity).expand(shard=trial_shards)
        readiness >> trial_shards

    with TaskGroup("trial") as trial:
        # none_failed: it also runs when there were no trial shards (it says why and keeps tonight's plans).
        decided = _task(trial_tasks.decide, task_id="decide", reads=TRIAL_READS, trigger_rule="none_failed")(
            plans, readiness.output, trial_shards, prompt_scan)
        trial_results >> decided
        # Skips only the relaunch group's first task (the rest follows by its trigger rules).
        needed = _task(trial_tasks.relaunch_needed, kind=task.short_circuit, task_id="relaunch_needed", reads=None,
                       ignore_downstream_trigger_rules=False)(plans, decided)

    with TaskGroup("relaunch") as relaunch:
        stopped_again = _task(server_tasks.stop_servers, task_id="stop_servers",
                              map_index_template=NODE_LABEL).partial(
            fleet=FLEET, plans=decided, trial_plans=plans).expand(node=nodes)
        launched_again = _task(server_tasks.launch_servers, task_id="launch_servers",
                               map_index_template=NODE_LABEL).partial(
            fleet=FLEET, plans=decided, stopped=stopped_again).expand(node=nodes)
        to_wait_again = _task(server_tasks.flatten, task_id="servers_to_wait", reads=None)(launched_again)
        readiness_again = WaitReadyOperator.partial(
            task_id="wait_ready", fleet=FLEET, retries=0, map_index_template=SERVER_LABEL, doc_md=WAIT_READY_DOC,
            resume_settle_s=os.environ.get("FLEETGEN_RESUME_SETTLE_S"),
        ).expand(server=to_wait_again)
        needed >> stopped_again
        # none_failed: the first round's servers when the relaunch round was skipped.
        in_use = _task(trial_tasks.servers_in_use, task_id="servers_in_use", trigger_rule="none_failed",
                       reads=None)(readiness.output, readiness_again.output)

    with generate:
        shards = _task(generate_tasks.plan_shards, task_id="plan_shards", reads=[PROMPTS])(
            prompt_scan, plans)
        results = _task(generate_tasks.generate_shard, task_id="generate_shard", **shard_task).partial(
            readiness=in_use, fleet=FLEET, model_identity=identity).expand(shard=shards)
        readiness >> shards

    with TaskGroup("validate") as validate_group:
        # none_failed: the trial's shard task is skipped on a night without a trial.
        validation = _task(validate_tasks.validate, task_id="validate", reads=VALIDATE_READS, retries=0,
                           trigger_rule="none_failed")(prompt_scan, results)
        trial_results >> validation
        run_report = _task(validate_tasks.report, task_id="report", reads=REPORT_READS, retries=1,
                           outlets=[GENERATED_DATASET], trigger_rule="none_failed")(
            decided, in_use, results, validation, identity, FLEET, trial_results)
        batch_files = _task(validate_tasks.batch_api_files, task_id="batch_api_files", reads=BATCH_READS, retries=1)()
        validation >> batch_files

    released = _task(server_tasks.release_servers, task_id="release_servers", trigger_rule="all_done",
                    map_index_template=NODE_LABEL).partial(
        fleet=FLEET, plans=PLANS).expand(node=nodes)
    [run_report, readiness, readiness_again, in_use] >> released
    outcome = _task(failures.run_outcome, task_id="run_outcome", trigger_rule="one_failed", retries=0)()
    [run_report, released, batch_files] >> outcome
