"""Tonight's plan for every server of the fleet, in the run's tuning mode: one call for the DAG's derive_plan.

``tuned`` (the default) plans each server for the workload (docs/sglang-scheduler.md §7): it learns from the
previous successful run (its completions' lengths, its plan record, the servers' own scheduler lines read on
every node) and moves each server one bounded step from there, then records tonight's plan for the next run.
``sglang_defaults`` plans each server with SGLang's automatic sizing. Every server starts from the calibration
an earlier readback measured for its GPU, SGLang version, model and tp (``tuning/calibration.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fleetgen.nodes import probe
from fleetgen.nodes.fleet import FleetSpec, ServerSlot
from fleetgen.outputs import RunLayout, calibration_file
from fleetgen.tuning import workload_history
from fleetgen.tuning.calibration import CalibrationStore, model_key
from fleetgen.tuning.model_files import ModelFiles
from fleetgen.tuning.plan import ServerPlan, TunerBounds, Workload
from fleetgen.tuning.planner import plan_server, resolved_page_size
from fleetgen.tuning.profile import LaunchOptions, MemoryProfile, profile_model
from fleetgen.tuning.workload import decode_reserve_tokens


@dataclass(frozen=True)
class FleetPlanRun:
    """Where this run's plan learns from and is recorded: the output root (earlier runs, calibrations) and the
    run's own folder; ``run_on_node(node, command) -> stdout`` reads the servers' logs on a node."""

    output_root: Path
    layout: RunLayout
    run_on_node: Callable[[str, str], str]
    pin_full_context: bool = False


def plan_fleet(spec: FleetSpec, inventories: dict[str, dict], model: ModelFiles, options: LaunchOptions,
               workload: Workload, bounds: TunerBounds, run: FleetPlanRun,
               log: logging.Logger) -> list[ServerPlan]:
    """One plan per server of ``spec`` (``inventories``: the probe's, by node), in ``spec.servers()`` order."""
    profile = _profile(spec, model, options)
    calibrations = CalibrationStore(calibration_file(run.output_root))
    plan_for = {slot.name: _server_planner(slot, probe.select_gpus(inventories[slot.node], slot.gpu_ids), spec,
                                           profile, options, workload, calibrations, log)
                for slot in spec.servers()}
    if bounds.mode != "tuned":
        return [plan_with(bounds) for plan_with in plan_for.values()]
    first = spec.servers()[0]
    page_size = resolved_page_size(profile, options, probe.select_gpus(inventories[first.node], first.gpu_ids),
                                   bounds)
    learned = workload_history.learn_from_previous_run(
        Path(run.output_root).expanduser(), run.layout, page_size=page_size,
        reserve_tokens=decode_reserve_tokens(profile.spec_steps, profile.spec_topk, profile.draft_tokens, page_size),
        log_dir=spec.server.log_dir, ports_by_node={node.name: list(node.ports) for node in spec.nodes},
        run_on_node=run.run_on_node)
    log.info("Workload mode: %s, %d server(s) observed", learned.source, len(learned.seen))
    plans = workload_history.plan_workload_fleet(plan_for, bounds, demand=learned.demand, seen=learned.seen,
                                                 record=learned.record, pin_full_context=run.pin_full_context)
    workload_history.write_plan_record(run.layout, plans)
    return plans


def first_server_plans(spec: FleetSpec, inventories: dict[str, dict], model: ModelFiles, options: LaunchOptions,
                       workloads: tuple[Workload, ...], bounds: TunerBounds, output_root: Path) -> list[ServerPlan]:
    """The first server's plan from its own memory alone (no earlier run to learn from: the full-context plan of
    a fleet's first night) for each of ``workloads``: what a change of the workload alone does to a server."""
    profile = _profile(spec, model, options)
    calibrations = CalibrationStore(calibration_file(output_root))
    first = spec.servers()[0]
    gpus = probe.select_gpus(inventories[first.node], first.gpu_ids)
    quiet = logging.Logger("what_if", level=logging.CRITICAL)  # plan_fleet logs the calibration line, once
    return [_server_planner(first, gpus, spec, profile, options, workload, calibrations, quiet)(bounds)
            for workload in workloads]


def _profile(spec: FleetSpec, model: ModelFiles, options: LaunchOptions) -> MemoryProfile:
    return profile_model(model.config, model.weights_bytes, options, config_path=f"{spec.model.path}/config.json",
                         hf_quant_config=model.hf_quant_config)


def _server_planner(slot: ServerSlot, gpus: list[dict], spec: FleetSpec, profile: MemoryProfile,
                    options: LaunchOptions, workload: Workload, calibrations: CalibrationStore,
                    log: logging.Logger) -> Callable[[TunerBounds], ServerPlan]:
    """``slot``'s plan for given bounds, starting from the calibration its GPU type last measured."""
    measured = calibrations.latest(str(gpus[0]["name"]), model_key(spec.model.path), spec.server.tp_size)
    if measured:
        log.info("Calibration for %s from an earlier readback: %d bytes less pre-load memory", slot.name,
                 measured["correction_bytes"])
    correction = int(measured["correction_bytes"]) if measured else 0

    def plan_with(bounds: TunerBounds) -> ServerPlan:
        return plan_server(host=slot.node, gpu_ids=list(slot.gpu_ids), port=slot.port, gpus=gpus, profile=profile,
                           options=options, workload=workload, bounds=bounds, calibration_bytes=correction)

    return plan_with
