"""What tonight's plan left out or warns about, kept in the run folder for the report (``RunLayout.plan_notes``):
the nodes left out because they could not be reached (the DAG parameter ``skip_unreachable_nodes``) and the prompt
whose length cuts every server's cap (``LongPromptCost``; ``max_cap_cut_factor`` sets such prompts aside)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass

from fleetgen.outputs import RunLayout
from fleetgen.tuning.plan import ServerPlan, Workload

# One prompt that halves every server's running requests is worth a warning in the log and the report.
CAP_CUT_WARNING = 2.0


@dataclass(frozen=True)
class LongPromptCost:
    """The longest prompt and what it does to the first server's plan: the context and cap with and without it."""

    id: str
    line: int
    prompt_tokens: int  # estimated
    server: str
    context_with: int | None  # --context-length (None: the fleet's server.extra_args fix it)
    context_without: int | None
    cap_with: int  # max_running_requests
    cap_without: int

    @classmethod
    def of(cls, longest: dict, with_it: ServerPlan, without_it: ServerPlan) -> LongPromptCost | None:
        """The cost of ``longest`` (the scan's ``longest``), or None when it cuts the cap less than CAP_CUT_WARNING."""
        cap_with, cap_without = (int(plan.expected["max_running_requests"]) for plan in (with_it, without_it))
        if cap_without < CAP_CUT_WARNING * cap_with:
            return None
        return cls(id=str(longest["id"]), line=int(longest["line"]), prompt_tokens=int(longest["prompt_tokens"]),
                   server=with_it.server, context_with=with_it.flags.get("--context-length"),
                   context_without=without_it.flags.get("--context-length"), cap_with=cap_with,
                   cap_without=cap_without)

    def describe(self) -> str:
        return (f"prompt {self.id!r} (line {self.line}, ~{self.prompt_tokens} tokens estimated) sets every server's "
                f"context: --context-length {self.context_with} with it, {self.context_without} without; "
                f"max_running_requests of {self.server} {self.cap_with} with it, {self.cap_without} without it. "
                f"Set the DAG parameter max_cap_cut_factor (e.g. 4) to set such prompts aside into rejects.jsonl, "
                f"or shorten it")


def without_longest(workload: Workload, runner_up_prompt_tokens: int | None) -> Workload | None:
    """The workload as it would be without its longest prompt, or None when that prompt cannot cut the cap by
    CAP_CUT_WARNING: the cap falls at most as fast as one request's full context grows (KV for each running
    request at that context), so a request under CAP_CUT_WARNING times the next longest cannot."""
    if not runner_up_prompt_tokens or runner_up_prompt_tokens >= workload.prompt_tokens_max:
        return None
    if workload.full_context_tokens < CAP_CUT_WARNING * (runner_up_prompt_tokens + workload.max_output_tokens):
        return None
    return dataclasses.replace(workload, prompt_tokens_max=runner_up_prompt_tokens,
                               prompt_tokens_mean=min(workload.prompt_tokens_mean, runner_up_prompt_tokens))


def write_plan_notes(layout: RunLayout, *, nodes_left_out: dict[str, str], long_prompt: LongPromptCost | None,
                     tuning_trial: list[str] = ()) -> None:
    """``tuning_trial``: what the tuning trial does tonight, or why there is none (airflow/trial_tasks.py); left out
    when there is nothing to say (the trial is off)."""
    notes = {"nodes_left_out": [{"node": node, "reason": reason} for node, reason in nodes_left_out.items()],
             "long_prompt": asdict(long_prompt) | {"warning": long_prompt.describe()} if long_prompt else None}
    if tuning_trial:
        notes["tuning_trial"] = list(tuning_trial)
    layout.plan_notes.write_text(json.dumps(notes))


def read_plan_notes(layout: RunLayout) -> dict:
    """The notes derive_plan wrote; empty ones when it wrote none (a run planned before they existed)."""
    try:
        return json.loads(layout.plan_notes.read_text())
    except (OSError, ValueError):
        return {"nodes_left_out": [], "long_prompt": None}
