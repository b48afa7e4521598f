"""sglang_generation: tune SGLang servers to the GPU memory they have, relaunch them, generate, validate, report.

Wiring only: every task calls fleetgen (include/fleetgen). Nothing here reads files or connects anywhere.
"""

from __future__ import annotations

import os
from datetime import timedelta

import pendulum
from airflow.sdk import DAG, Asset, Param, TaskGroup, task
from airflow.timetables.trigger import CronTriggerTimetable

from fleetgen.airflow import failures, server_tasks, tasks
from fleetgen.airflow.operators import WaitReadyOperator

DOC_MD = """
### SGLang offline generation on a GPU fleet
1. **tune**: `load_fleet` reads the fleet description, `probe_gpus` runs `nvidia-smi` on every node over SSH,
   `scan_prompts` validates the prompts file (prompts too long for the context go to `rejects.jsonl`),
   `derive_plan` sizes `--mem-fraction-static`,
   `--max-mamba-cache-size`, `--max-running-requests`… from the memory budget and logs the budget table.
   With **dry_run** the run stops here.
2. **servers**: keep our servers already running tonight's plan (their `/server_info` flags, model path and SGLang
   version equal it, `/health` is 200; **relaunch_servers** forces a full relaunch); stop the others (pid file +
   command line check), verify the memory came back, launch one server per GPU/TP group under `setsid`, then wait (deferred) until each is ready and read back the
   *effective* limits from `/server_info`. A memory error re-plans that server one step smaller (3 times at most).
3. **generate**: one mapped task per shard; each first copies the completions of the last successful run whose
   prompt, model (`model_identity`: path, config and index hashes) and sampling are unchanged
   (**reuse_completions**), then keeps every server at its effective limit × headroom and resumes from its
   checkpoint when retried. Each shard also samples the servers' `/metrics` and the nodes' `nvidia-smi`.
4. **validate**: Great Expectations over the per-completion stats (one completion per prompt, token and finish
   reason bounds); **report**: throughput overall / per GPU / per server and the comparison with the previous run.

Outputs: `{output_root}/{run_id}/` (`completions/`, `errors/`, `stats/`, `validation/`, `report/`).
"""

PARAMS = {
    "fleet_file": Param("", type="string", title="Fleet file",
                        description="Path (on the Airflow worker) of the fleet YAML. Empty: the Airflow Variable "
                                    "'fleetgen_fleet' holds it."),
    "prompts_path": Param(os.environ.get("FLEETGEN_PROMPTS_PATH", "~/fleetgen/prompts.jsonl"), type="string",
                          minLength=1, title="Prompts JSONL",
                          description="Path on the workers of a JSONL of {id, messages} or {id, prompt}, one per "
                                      "line. Default: $FLEETGEN_PROMPTS_PATH of the deployment."),
    "output_root": Param("~/fleetgen-output", type="string", minLength=1, title="Output root",
                         description="Each run writes to <output_root>/<run_id>/."),
    "dry_run": Param(False, type="boolean", title="Dry run",
                     description="Probe and print the plan, then stop: no server is touched."),
    "tuning": Param("tuned", enum=["tuned", "sglang_defaults"], title="Tuning",
                    description="'tuned': fleetgen sizes the pools; 'sglang_defaults': SGLang's automatic sizing."),
    "max_tokens": Param(4096, type="integer", minimum=1, maximum=262144, title="Max output tokens",
                        description="max_tokens of every request; the tuner sizes KV for prompt + this."),
    "temperature": Param(0.6, type="number", minimum=0, maximum=2, title="Temperature",
                         description="Sampling temperature of every request (a prompt may override it)."),
    "top_p": Param(0.95, type="number", exclusiveMinimum=0, maximum=1, title="Top-p",
                   description="Nucleus sampling threshold of every request (a prompt may override it)."),
    "memory_margin_mib": Param(1024, type="integer", minimum=0, maximum=65536, title="Memory margin (MiB)",
                               description="Kept free on each GPU beyond SGLang's own reserve."),
    "max_running_requests": Param(0, type="integer", minimum=0, maximum=4096, title="Max running requests cap",
                                  description="Upper bound per server; 0 = no bound (the tuner decides)."),
    "context_length": Param(0, type="integer", minimum=0, maximum=1048576, title="Context length",
                            description="--context-length; 0 = prompt max + max_tokens, rounded up."),
    "bf16_ssm_state": Param(False, type="boolean", title="bfloat16 SSM state",
                            description="Halve Mamba state memory (--mamba-ssm-dtype bfloat16). Changes numerics."),
    "no_buffer_radix": Param(False, type="boolean", title="no_buffer radix strategy",
                             description="--mamba-radix-cache-strategy no_buffer: 3 state slots per request "
                                         "instead of 5, no overlap scheduling."),
    "pin_full_context_plan": Param(False, type="boolean", title="Pin the full-context plan",
                                   description="KV for every running request at its full context (conservative). "
                                               "Off: size for the workload, one bounded step per run from the "
                                               "previous run's lengths, peak KV and retractions."),
    "shard_size": Param(5000, type="integer", minimum=1, maximum=10_000_000, title="Prompts per shard",
                        description="Prompts per generate_shard task; grown automatically when the shards would "
                                    "exceed Airflow's [core] max_map_length."),
    "parallel_shards": Param(0, type="integer", minimum=0, maximum=16, title="Shards at once",
                             description="0 (auto): running shards split every server's limit between them, "
                                         "recounted every 2 s from their heartbeats. N: each shard always takes "
                                         "1/N. How many run at once is set by the slots of the fleetgen_fleet pool."),
    "headroom": Param(1.25, type="number", minimum=1, maximum=4, title="Queue headroom",
                      description="In-flight per server = effective max_running_requests × this."),
    "reuse_completions": Param("scheduled", enum=["scheduled", "always", "never"], title="Reuse unchanged completions",
                               description="Copy a completion from the last successful run instead of generating it "
                                           "again when the prompt, the model (path, config and index hashes) and "
                                           "the sampling are unchanged. 'scheduled': on nightly runs, off for manual "
                                           "ones; 'always'; 'never'."),
    "sample_interval_s": Param(5.0, type="number", minimum=0, maximum=300, title="Sampling interval (s)",
                               description="While generating, every server's /metrics and every node's nvidia-smi "
                                           "are sampled this often for the occupancy and GPU report; 0: off."),
    "ready_timeout_s": Param(1800, type="integer", minimum=10, maximum=7200, title="Readiness timeout (s)",
                             description="How long a server may take to load before its wait fails."),
    "relaunch_servers": Param(False, type="boolean", title="Relaunch every server",
                              description="Stop and relaunch every server, even one already running tonight's "
                                          "plan (flags, model, SGLang version) that would otherwise be kept."),
    "keep_servers_up": Param(True, type="boolean", title="Keep servers up",
                             description="Leave the servers running after the run (a nightly job reuses them). "
                                         "Off: stop them at the end, whether the run succeeded or not."),
    "max_length_share": Param(0.2, type="number", minimum=0, maximum=1, title="Max share truncated (length)",
                              description="Validation fails when more completions than this end by max_tokens."),
    "min_reasoning_share": Param(0.9, type="number", minimum=0, maximum=1, title="Min share with reasoning",
                                 description="Validation fails when fewer completions carry a reasoning trace."),
    "max_empty_answer_share": Param(0.2, type="number", minimum=0, maximum=1, title="Max share of empty answers",
                                    description="Validation fails when more completions have an empty answer."),
    "max_error_share": Param(0.01, type="number", minimum=0, maximum=1, title="Max share of failed prompts",
                             description="Validation fails when more prompts failed permanently (4xx)."),
}

# The nightly schedule and its timezone come from the deployment's environment (Astro: .env), not a
# Variable: reading a Variable here would hit the metadata DB at every parse.
SCHEDULE = CronTriggerTimetable(os.environ.get("FLEETGEN_SCHEDULE", "0 2 * * *"),
                                timezone=os.environ.get("FLEETGEN_TIMEZONE", "UTC"))
# Downstream training DAGs can be scheduled on this Asset; each event's extra names the run's folder.
GENERATED_DATASET = Asset(name="sglang_generation_completions", uri="file:///fleetgen/sglang_generation/completions",
                          group="fleetgen")

DEFAULT_ARGS = {
    "owner": "ml-infra",
    "retries": 2,
    # Environment, not I/O: lets tests retry without waiting. Deterministic errors never retry (fail_fast).
    "retry_delay": timedelta(seconds=float(os.environ.get("FLEETGEN_RETRY_DELAY_S", "20"))),
    "on_failure_callback": failures.describe_failure,
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
    fleet = task(tasks.load_fleet, task_id="load_fleet")()
    nodes = task(tasks.node_names, task_id="node_names")(fleet)

    with TaskGroup("tune") as tune:
        inventories = task(tasks.probe_gpus, task_id="probe_gpus").partial(fleet=fleet).expand(
            node=nodes)
        # Reads the model's config.json over SSH (its context length) besides the prompts file: transient
        # errors retry, the prompts file's own problems fail at once (fail_fast).
        prompt_scan = task(tasks.scan_prompts, task_id="scan_prompts")(fleet)
        plans = task(tasks.derive_plan, task_id="derive_plan")(fleet, inventories, prompt_scan)
        identity = task(tasks.model_identity, task_id="model_identity")(fleet)
        live = task.short_circuit(tasks.go_live, task_id="go_live")()
        plans >> live

    with TaskGroup("servers") as servers:
        stopped = task(server_tasks.stop_servers, task_id="stop_servers").partial(
            fleet=fleet, plans=plans).expand(node=nodes)
        launched = task(server_tasks.launch_servers, task_id="launch_servers", retries=0).partial(
            fleet=fleet, plans=plans, stopped=stopped).expand(node=nodes)
        to_wait = task(server_tasks.flatten, task_id="servers_to_wait")(launched)
        readiness = WaitReadyOperator.partial(
            task_id="wait_ready", fleet=fleet, timeout_s="{{ params.ready_timeout_s }}", retries=0,
        ).expand(server=to_wait)
        live >> stopped >> launched

    with TaskGroup("generate") as generate:
        shards = task(tasks.plan_shards, task_id="plan_shards")(prompt_scan)
        results = task(tasks.generate_shard, task_id="generate_shard", retries=3, pool="fleetgen_fleet",
                       max_active_tis_per_dagrun=16).partial(
            readiness=readiness.output, fleet=fleet, model_identity=identity).expand(shard=shards)
        readiness >> shards

    with TaskGroup("validate") as validate_group:
        validation = task(tasks.validate, task_id="validate", retries=0)(prompt_scan, results)
        run_report = task(tasks.report, task_id="report", retries=1, outlets=[GENERATED_DATASET])(
            plans, readiness.output, results, validation, identity, fleet)

    released = task(server_tasks.release_servers, task_id="release_servers", trigger_rule="all_done").partial(
        fleet=fleet).expand(node=nodes)
    [run_report, readiness] >> released
    outcome = task(failures.run_outcome, task_id="run_outcome", trigger_rule="one_failed", retries=0)()
    [run_report, released] >> outcome
