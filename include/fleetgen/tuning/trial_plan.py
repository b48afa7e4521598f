"""Tonight's plan with a tuning trial: every candidate planned for every server, the fleet split between them.

``plan_trial`` names tonight's candidates (``candidates.default_candidates`` for the fleet's own args, the user's
``tuning_candidates``), plans each for every server (``fleet_plan.plan_fleet_candidates``), reads what earlier
trials of the same key decided (``trial_history``: the last winner is tonight's incumbent, a challenger tried before
is not tried again) and splits the fleet (``candidates.choose_split``). Every candidate's plans are kept in the
run's ``RunLayout.candidate_plans`` so that the decide task can put a losing server on the winner without probing
again; docs/tuning-trial.md §7 describes the file.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from fleetgen.errors import ConfigError
from fleetgen.nodes.fleet import FleetSpec
from fleetgen.outputs import RunLayout
from fleetgen.tuning.candidates import Candidate, TrialSplit, candidate_set, choose_split, default_candidates
from fleetgen.tuning.fleet_plan import FleetPlanRun, model_profile, options_for, plan_fleet_candidates
from fleetgen.tuning.model_files import ModelFiles
from fleetgen.tuning.plan import ServerPlan, TunerBounds, Workload
from fleetgen.tuning.trial_history import TrialHistory, TrialKey


@dataclass(frozen=True)
class TrialPlan:
    """Tonight's split (``split``), every candidate's plan per server (``plans``: candidate -> server -> plan, the
    fleet's server order), what each candidate changes (``described``), the candidates left out and why
    (``skipped``) and the history key the trial is recorded under (None: its workload bucket was not known when
    planning; the decide task reads it off the trial's own completions)."""

    split: TrialSplit
    plans: dict[str, dict[str, ServerPlan]]
    described: dict[str, str]
    skipped: dict[str, str]
    key: TrialKey | None
    key_parts: dict

    def tonight(self) -> list[ServerPlan]:
        """Each server's plan on the candidate the split gives it, in the fleet's server order."""
        return [self.plans[candidate][server] for server, candidate in self.split.assignment.items()]

    def plan_for(self, candidate: str, server: str) -> ServerPlan:
        try:
            return self.plans[candidate][server]
        except KeyError:
            raise ConfigError(f"the run's candidate plans hold no plan of {candidate} for {server}", server=server,
                              hint="the plans were derived for another fleet: clear the run's derive_plan") from None

    def to_dict(self) -> dict:
        return {"split": self.split.to_dict(), "described": dict(self.described), "skipped": dict(self.skipped),
                "key": None if self.key is None else asdict(self.key), "key_parts": dict(self.key_parts),
                "plans": {name: {server: plan.to_dict() for server, plan in by_server.items()}
                          for name, by_server in self.plans.items()}}

    @classmethod
    def from_dict(cls, data: dict) -> TrialPlan:
        try:
            return cls(split=TrialSplit.from_dict(data["split"]), described=dict(data["described"]),
                       skipped=dict(data["skipped"]), key=None if data["key"] is None else TrialKey(**data["key"]),
                       key_parts=dict(data["key_parts"]),
                       plans={name: {server: ServerPlan.from_dict(plan) for server, plan in by_server.items()}
                              for name, by_server in data["plans"].items()})
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise ConfigError(f"not a tuning trial's candidate plans: {type(error).__name__} {error}",
                              hint="derive_plan writes them; clear the run's derive_plan") from None


@dataclass(frozen=True)
class TrialPace:
    """How fast an earlier run on the same servers finished requests (``requests_per_s``: per server, its completions
    over its generation span), and tonight's window: what turns the trial's prompts into its length."""

    requests_per_s: float
    window_s: float
    source: str  # the run it was measured in

    def describe(self) -> str:
        return f"at run {self.source}'s {self.requests_per_s:.3g} requests/s per server"


def plan_trial(spec: FleetSpec, inventories: dict[str, dict], model: ModelFiles, workload: Workload,
               bounds: TunerBounds, run: FleetPlanRun, log: logging.Logger, *, listed: Sequence[Candidate],
               history: TrialHistory, key: TrialKey | None, key_parts: dict, trial_prompts: int,
               pace: TrialPace | None = None) -> TrialPlan:
    """Tonight's candidates planned and the fleet split between them (see the module's docstring). With fewer
    ``trial_prompts`` than the split needs to measure every server (``prompts_needed``, at ``pace`` when an earlier
    run measured one), no trial: relaunching a challenger's server for a trial that cannot judge it would cost a
    relaunch for nothing."""
    base_args = tuple(spec.server.extra_args)
    profile = model_profile(spec, model, options_for(spec, base_args))
    speculative = (profile.spec_steps, profile.spec_topk, profile.draft_tokens) if profile.draft_tokens else None
    candidates = candidate_set(default_candidates(base_args, speculative,
                                                  eagle_family=options_for(spec, base_args).eagle_family), listed)
    planned = plan_fleet_candidates(spec, inventories, model, candidates, workload, bounds, run, log)
    servers = [slot.name for slot in spec.servers()]
    last_winner = history.latest_winner(key) if key is not None else None
    tried = history.tried(key) if key is not None else set()
    split = choose_split(servers, list(planned.plans), last_winner=last_winner, tried=tried)
    by_server = {name: dict(zip(servers, plans)) for name, plans in planned.plans.items()}
    if split.trial:
        needed = prompts_needed(split, by_server, pace)
        if trial_prompts < needed:
            split = without_trial(split, (
                f"no tuning trial: its {trial_prompts} prompt(s) cannot measure these servers (their caps need "
                f"{needed} for a warm-up and the windows a decision needs"
                f"{', ' + pace.describe() if pace is not None else ''}); raise tuning_trial_share"))
    return TrialPlan(split=split, described={c.name: c.describe() for c in candidates if c.name in planned.plans},
                     skipped=dict(planned.skipped), key=key, key_parts=dict(key_parts), plans=by_server)


def prompts_needed(split: TrialSplit, plans: dict[str, dict[str, ServerPlan]], pace: TrialPace | None = None) -> int:
    """The fewest trial prompts that can give every server of ``split`` its warm-up and ``MIN_WINDOWS`` windows: per
    server ``WARMUP_TURNOVERS + MIN_WINDOWS`` turnovers of its batch (its cap of completions each; a window shorter
    than one turnover sees the counter step for part of the batch only, tuning/trial.py).

    With an earlier run's ``pace``, also long enough in time: the trial's servers share one queue, so it lasts its
    prompts over the fleet's requests per second, and each server needs its warm-up turnover, ``MIN_WINDOWS``
    windows of ``pace.window_s`` and the drain's turnover at the end (no longer at its batch). A server's turnover
    takes its cap over its requests per second, the earlier run's (the throughput a candidate is tried for; Little's
    law): a larger cap, a longer turnover. The larger of the two counts."""
    from fleetgen.tuning.trial import MIN_WINDOWS, WARMUP_TURNOVERS

    caps = [plans[candidate][server].expected["max_running_requests"] for server, candidate in split.assignment.items()]
    turnovers = sum((WARMUP_TURNOVERS + MIN_WINDOWS) * cap for cap in caps)
    if pace is None or pace.requests_per_s <= 0 or not caps:
        return turnovers
    longest_s = max((WARMUP_TURNOVERS + 1) * cap / pace.requests_per_s + MIN_WINDOWS * pace.window_s for cap in caps)
    return max(turnovers, math.ceil(len(caps) * pace.requests_per_s * longest_s))


def without_trial(split: TrialSplit, why: str) -> TrialSplit:
    """``split`` with every server on its incumbent and ``why`` noted instead of the split's own last note (the one
    that said which challenger runs where)."""
    return TrialSplit(split.incumbent, {server: split.incumbent for server in split.assignment}, (),
                      (*split.notes[:-1], why))


def write_trial_plan(layout: RunLayout, trial: TrialPlan) -> None:
    layout.root.mkdir(parents=True, exist_ok=True)
    partial = layout.candidate_plans.with_suffix(".partial")
    partial.write_text(json.dumps(trial.to_dict(), sort_keys=True))
    partial.replace(layout.candidate_plans)


def read_trial_plan(layout: RunLayout) -> TrialPlan | None:
    """The candidate plans derive_plan wrote, or None when it wrote none (the trial was off)."""
    try:
        text = layout.candidate_plans.read_text()
    except FileNotFoundError:
        return None
    try:
        return TrialPlan.from_dict(json.loads(text))
    except ValueError as error:
        raise ConfigError(f"{layout.candidate_plans} is not JSON: {error}", path=str(layout.candidate_plans),
                          hint="derive_plan writes it; clear the run's derive_plan") from None
