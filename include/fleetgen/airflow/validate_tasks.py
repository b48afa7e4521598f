"""Task callables of the ``validate`` group: Great Expectations over the stats, then the run report and the results as
OpenAI Batch API files."""

from __future__ import annotations

import logging

from fleetgen.airflow.generate_tasks import generation_material, generation_settings
from fleetgen.airflow.context import mapped_values, run_context
from fleetgen.airflow.run_storage import current_store_run, run_url, scan_here
from fleetgen.errors import ValidationFailed
from fleetgen.nodes.fleet import fleet_from_json

log = logging.getLogger("fleetgen")


def validate(prompt_scan: dict, shard_results: list[dict]) -> dict:
    """**Great Expectations over the per-completion stats**: one completion per prompt, token and finish-reason bounds,
    the shares set in the *Validation thresholds* section. The Data Docs link opens every expectation.

    *When it fails*: the message lists each failed expectation with its observed value and sample ids.
    """
    from fleetgen.prompts.planned import read_planned_prompts
    from fleetgen.validation.suite import validate_run

    context, config, layout = run_context()
    log.info("Validating %d expected completions in %s with Great Expectations", prompt_scan["count"], layout.root)
    # The prompts the run planned (the scan's byte range, each block checked), not the file as it is now.
    planned = read_planned_prompts(scan_here(prompt_scan, config.inputs.prompts_path))
    try:
        summary = validate_run(layout.root, planned.ids, config.validation, own_max_tokens=planned.own_max_tokens,
                               run_name=context["run_id"],  # the Data Docs name the Airflow run
                               location=run_url(layout))
    except ValidationFailed as failure:
        # The small JSON summary goes to XCom first, so the report and on-call can read it; then fail.
        context["ti"].xcom_push(key="validation_summary", value=failure.summary)
        raise
    log.info("Validation passed: %d rows, every prompt exactly once; Data Docs at %s", summary["rows"],
             summary.get("data_docs"))
    return summary


def batch_api_files() -> dict:
    """**Writes the results as OpenAI Batch API files** in the run's folder, for code written for a hosted provider:
    `batch/output.jsonl` (one response a completion, its body a `chat.completion`) and `batch/errors.jsonl` (the
    prompts set aside at scan time or written off), `custom_id` the prompt's id, whichever format the prompts were in.

    *When it fails*: a file of the run's folder cannot be written (the message names it); clear the task once fixed.
    """
    from fleetgen.report.batch_output import write_batch_files

    _, _, layout = run_context()
    written = write_batch_files(layout)
    log.info("Batch API files: %d response(s) in %s, %d error(s) in %s", written.responses, written.output,
             written.failed, written.errors)
    return written.to_dict()


def report(plans: list[dict], readiness: list[dict], shard_results: list[dict], validation: dict,
           model_identity: dict, fleet: dict, trial_results: list[dict] | None = None) -> dict:
    """**Writes the run report**: throughput overall / per GPU / per server, the tuning used, validation, comparison
    with the previous run. The *Report* link above opens it. Once validation passed, also the completions as a Parquet
    dataset (`dataset/shard-NNNNN.parquet`), announced to downstream DAGs with the Asset event. After a tuning trial,
    `plans` and `readiness` are the servers the rest of the job ran on (a relaunched server keeps the run's launch
    identity, so its completions of both rounds name one launch) and the trial's shards count with the others.
    """
    from fleetgen.generate.reuse import accepted_launches, write_reuse_index
    from fleetgen.report.build import build_report
    from fleetgen.report.parquet_dataset import write_parquet_dataset
    from fleetgen.report.previous import find_previous_report

    from fleetgen.validation.outcome import read_summary, why_not_passed

    context, config, layout = run_context()
    # What validate wrote, not its XCom: a validate marked success by hand returned nothing (or failed first).
    validation = read_summary(layout)
    not_passed = why_not_passed(layout, validation)
    if not_passed is None:  # only a validated run's completions may be reused from now on
        settings = generation_settings(config, fleet_from_json(fleet))
        # the launches the shards accepted completions from, so that a later run reuses them only under their model
        indexed = write_reuse_index(layout, material=generation_material(model_identity, settings),
                                    run_id=context["run_id"], launches=accepted_launches(mapped_values(readiness)))
        log.info("Indexed %d completion(s) for later runs to reuse (%s)", indexed, layout.reuse_index)
        dataset = write_parquet_dataset(layout)
        log.info("Parquet dataset: %d completion(s) in %d file(s) under %s", dataset.rows, dataset.files,
                 dataset.folder)
    else:
        log.warning("This run is not validated: %s. Its completions are not indexed for later runs to reuse; "
                    "clear validate to run it again once the cause is fixed", not_passed)
    previous = find_previous_report(config.inputs.output_root, layout.root.name)
    log.info("Writing the run report to %s (previous run: %s)", layout.report_dir, previous or "none")
    # Throughput is measured over the generation itself (first request sent to last completion), not
    # the run's wall time, which also holds server start-up and validation.
    summary = build_report(layout.root, run_id=context["run_id"], plan=list(plans), readiness=mapped_values(readiness),
                           shard_results=mapped_values(trial_results or []) + mapped_values(shard_results),
                           validation=validation, previous_report=previous,
                           gpu_hour_price=config.report.prices(), location=run_url(layout))
    for asset in context["task"].outlets:  # the finished dataset, for downstream training DAGs
        on_store = current_store_run() is not None  # the completions are then in the shards' commit logs
        context["outlet_events"][asset].extra = {"run_id": context["run_id"], "out_dir": run_url(layout),
                                                 "completions": None if on_store else str(layout.kind_dir("completions")),
                                                 "dataset": run_url(layout, "dataset") if not_passed is None else None,
                                                 "rows": (validation or {}).get("rows"), "report": summary["report_json"]}
    log.info("Report: %s; %.1f output tokens/s overall", summary["report_md"], summary["tokens_per_s"])
    return summary
