"""Tonight's plan for every server of the fleet, in the run's tuning mode: one call for the DAG's derive_plan.

``tuned`` (the default) plans each server for the workload (docs/sglang-scheduler.md §7): it learns from the
previous successful run (its completions' lengths, its plan record, the servers' own scheduler lines read on
every node) and moves each server one bounded step from there, then records tonight's plan for the next run.
``sglang_defaults`` plans each server with SGLang's automatic sizing. Every server starts from the calibration
an earlier readback measured for its GPU, SGLang version, model and tp (``tuning/calibration.py``).

``plan_fleet_candidates`` plans the tuning trial's candidates (``tuning/candidates.py``) the same way: every
candidate for every server, each a whole plan for its own options, so that the trial's decision can put any server
on the winner without probing again.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from fleetgen.nodes import probe
from fleetgen.nodes.fleet import FleetSpec, ServerSlot
from fleetgen.outputs import RunLayout, calibration_file
from fleetgen.tuning import workload_history
from fleetgen.errors import FleetgenError
from fleetgen.tuning.calibration import CalibrationStore, model_key
from fleetgen.tuning.candidates import Candidate, edit_args
from fleetgen.tuning.model_files import ModelFiles
from fleetgen.tuning.plan import INCUMBENT, ServerPlan, TunerBounds, Workload
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
    planning = _FleetPlanning.begin(spec, inventories, model, options, workload, bounds, run, log)
    plans = planning.plans(options, log=log)
    if bounds.mode == "tuned":
        workload_history.write_plan_record(run.layout, plans)
    return plans


def plan_fleet_candidates(spec: FleetSpec, inventories: dict[str, dict], model: ModelFiles,
                          candidates: Sequence[Candidate], workload: Workload, bounds: TunerBounds,
                          run: FleetPlanRun, log: logging.Logger) -> CandidatePlans:
    """Every candidate's plan for every server (``candidates[0]``: the fleet file's own, ``INCUMBENT``), each a whole
    plan for its own options by the same arithmetic as ``plan_fleet``; the plan record is the caller's to write
    (the plans that run tonight). A cap candidate scales the incumbent's cap on each server. A candidate that
    cannot be planned, or plans exactly the incumbent's launch on every server, is left out, saying why."""
    base_args = tuple(spec.server.extra_args)
    options = options_for(spec, base_args)
    planning = _FleetPlanning.begin(spec, inventories, model, options, workload, bounds, run, log)
    incumbent = planning.plans(options, log=log, candidate=INCUMBENT, extra_args=base_args)
    plans, skipped = {INCUMBENT: incumbent}, {}
    quiet = logging.Logger("candidate", level=logging.CRITICAL)  # the incumbent logged each calibration line
    for candidate in candidates[1:]:
        try:
            if candidate.cap_share is not None:
                planned = [_capped(plan, candidate, base_args) for plan in incumbent]
            elif candidate.mode is not None:
                planned = planning.plans(options, log=quiet, candidate=candidate.name, extra_args=base_args,
                                         mode=candidate.mode)
            else:
                args = candidate.launch_args(base_args)
                planned = planning.plans(options_for(spec, args), log=quiet, candidate=candidate.name,
                                         extra_args=args)
        except FleetgenError as error:
            skipped[candidate.name] = f"cannot be planned: {error.message}"
            continue
        if all(_same_launch(plan, base) for plan, base in zip(planned, incumbent)):
            skipped[candidate.name] = "plans the incumbent's very launch on every server"
            continue
        plans[candidate.name] = planned
    return CandidatePlans(plans, skipped)


def options_for(spec: FleetSpec, extra_args: Sequence[str]) -> LaunchOptions:
    """The memory-relevant options of a launch with ``extra_args`` on the fleet's tp size."""
    return dataclasses.replace(LaunchOptions.from_args(list(extra_args)), tp_size=spec.server.tp_size)


@dataclass(frozen=True)
class CandidatePlans:
    """``plans``: candidate -> one plan per server in the fleet's order (the incumbent first); ``skipped``:
    candidate -> why it is no candidate tonight."""

    plans: dict[str, list[ServerPlan]]
    skipped: dict[str, str]


def _same_launch(plan: ServerPlan, other: ServerPlan) -> bool:
    return plan.command_args() == other.command_args() and plan.extra_args == other.extra_args


def _capped(plan: ServerPlan, candidate: Candidate, base_args: tuple[str, ...]) -> ServerPlan:
    """``plan`` re-planned with its request cap at ``candidate.cap_share`` of its own (at least 1): through the
    bounds it was planned with, or, when the fleet's args pin --max-running-requests, through that flag."""
    cap = max(1, math.floor(plan.expected["max_running_requests"] * candidate.cap_share))
    inputs = plan.inputs
    options = LaunchOptions.from_dict(inputs["options"])
    bounds = TunerBounds(**inputs["bounds"])
    args: tuple[str, ...] = base_args
    if options.max_running_requests is not None:
        args = edit_args(base_args, {"--max-running-requests": cap})
        options = options.replace(max_running_requests=cap)
    else:
        bounds = dataclasses.replace(bounds, max_running_requests=min(cap, bounds.max_running_requests or cap))
    return plan_server(host=plan.host, gpu_ids=list(plan.gpu_ids), port=plan.port, gpus=inputs["gpus"],
                       profile=MemoryProfile.from_dict(inputs["profile"]), options=options,
                       workload=Workload(**inputs["workload"]), bounds=bounds,
                       calibration_bytes=int(inputs["adjust"]["calibration_bytes"]), candidate=candidate.name,
                       extra_args=args)


@dataclass(frozen=True)
class _FleetPlanning:
    """What every candidate's plans share tonight: the fleet, its GPUs, the model, the workload, the calibrations
    and, in the tuned mode, what the previous run taught (read once, over SSH)."""

    spec: FleetSpec
    inventories: dict[str, dict]
    model: ModelFiles
    workload: Workload
    bounds: TunerBounds
    calibrations: CalibrationStore
    learned: workload_history.Learned | None
    pin_full_context: bool

    @classmethod
    def begin(cls, spec: FleetSpec, inventories: dict[str, dict], model: ModelFiles, options: LaunchOptions,
              workload: Workload, bounds: TunerBounds, run: FleetPlanRun, log: logging.Logger) -> _FleetPlanning:
        learned = None
        if bounds.mode == "tuned":
            # The KV demand is learnt for the fleet file's options: another candidate's decode reserve differs by a
            # few tokens per request (fewer without speculation), which leaves its demand on the safe side.
            profile = model_profile(spec, model, options)
            first = spec.servers()[0]
            page_size = resolved_page_size(profile, options, probe.select_gpus(inventories[first.node],
                                                                                first.gpu_ids), bounds)
            learned = workload_history.learn_from_previous_run(
                Path(run.output_root).expanduser(), run.layout, page_size=page_size,
                reserve_tokens=decode_reserve_tokens(profile.spec_steps, profile.spec_topk, profile.draft_tokens,
                                                     page_size),
                log_dir=spec.server.log_dir, ports_by_node={node.name: list(node.ports) for node in spec.nodes},
                run_on_node=run.run_on_node)
            log.info("Workload mode: %s, %d server(s) observed", learned.source, len(learned.seen))
        return cls(spec, inventories, model, workload, bounds, CalibrationStore(calibration_file(run.output_root)),
                   learned, run.pin_full_context)

    def plans(self, options: LaunchOptions, *, log: logging.Logger, candidate: str = INCUMBENT,
              extra_args: Sequence[str] | None = None, mode: str | None = None) -> list[ServerPlan]:
        """Every server's plan for ``options`` (read from ``extra_args``; None: the fleet's own), in the tuning
        ``mode`` (None: the run's)."""
        profile = model_profile(self.spec, self.model, options)
        plan_for = {slot.name: _server_planner(slot, probe.select_gpus(self.inventories[slot.node], slot.gpu_ids),
                                               self.spec, profile, options, self.workload, self.calibrations, log,
                                               candidate=candidate, extra_args=extra_args)
                    for slot in self.spec.servers()}
        if mode is not None and mode != self.bounds.mode:  # what was learnt sizes the tuned mode's servers only
            return [plan_with(dataclasses.replace(self.bounds, mode=mode)) for plan_with in plan_for.values()]
        if self.learned is None:
            return [plan_with(self.bounds) for plan_with in plan_for.values()]
        return workload_history.plan_workload_fleet(plan_for, self.bounds, demand=self.learned.demand,
                                                    seen=self.learned.seen, record=self.learned.record,
                                                    pin_full_context=self.pin_full_context)


def first_server_plans(spec: FleetSpec, inventories: dict[str, dict], model: ModelFiles, options: LaunchOptions,
                       workloads: tuple[Workload, ...], bounds: TunerBounds, output_root: Path) -> list[ServerPlan]:
    """The first server's plan from its own memory alone (no earlier run to learn from: the full-context plan of
    a fleet's first night) for each of ``workloads``: what a change of the workload alone does to a server."""
    profile = model_profile(spec, model, options)
    calibrations = CalibrationStore(calibration_file(output_root))
    first = spec.servers()[0]
    gpus = probe.select_gpus(inventories[first.node], first.gpu_ids)
    quiet = logging.Logger("what_if", level=logging.CRITICAL)  # plan_fleet logs the calibration line, once
    return [_server_planner(first, gpus, spec, profile, options, workload, calibrations, quiet)(bounds)
            for workload in workloads]


def model_profile(spec: FleetSpec, model: ModelFiles, options: LaunchOptions) -> MemoryProfile:
    return profile_model(model.config, model.weights_bytes, options, config_path=f"{spec.model.path}/config.json",
                         hf_quant_config=model.hf_quant_config)


def _server_planner(slot: ServerSlot, gpus: list[dict], spec: FleetSpec, profile: MemoryProfile,
                    options: LaunchOptions, workload: Workload, calibrations: CalibrationStore,
                    log: logging.Logger, *, candidate: str = INCUMBENT,
                    extra_args: Sequence[str] | None = None) -> Callable[[TunerBounds], ServerPlan]:
    """``slot``'s plan for given bounds, starting from the calibration its GPU type last measured."""
    measured = calibrations.latest(str(gpus[0]["name"]), model_key(spec.model.path), spec.server.tp_size)
    if measured:
        log.info("Calibration for %s from an earlier readback: %d bytes less pre-load memory", slot.name,
                 measured["correction_bytes"])
    correction = int(measured["correction_bytes"]) if measured else 0

    def plan_with(bounds: TunerBounds) -> ServerPlan:
        return plan_server(host=slot.node, gpu_ids=list(slot.gpu_ids), port=slot.port, gpus=gpus, profile=profile,
                           options=options, workload=workload, bounds=bounds, calibration_bytes=correction,
                           candidate=candidate, extra_args=None if extra_args is None else list(extra_args))

    return plan_with
