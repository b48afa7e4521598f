"""Workload mode: size the running requests to the KV the workload really holds, learned night by night.

SGLang does not need every running request's full context in the KV pool: it admits against the
held KV plus a decaying share of the running requests' remaining budgets and retracts when decode
runs out (docs/sglang-scheduler.md §3, §4; this mode: §7). So the pool only has to hold what ``n``
running requests hold at once, and every request the pool does not have to cover at full context frees memory for the
Mamba slots and speculative buffers of another request.

**Objective**: expected output tokens/s. Decode is memory-bound with a step time that grows
affinely with the batch, so tokens/s rise with the number of running requests ``n``; the optimum
is the largest ``n`` whose KV demand fits the pool left after its own state slots and buffers.

**Bound**: at a decode step in steady state each running request is a length-biased draw from the
workload (a request generating ``O`` tokens is running for ``O`` tokens' worth of steps) at a
uniform point of its output, holding ``ceil_page(prompt + U x O + decode reserve)`` tokens. The
sum over ``n`` such requests is near-normal (mean ``n mu``, deviation ``sqrt(n) sigma``); the plan
asks ``n mu + z sqrt(n) sigma <= pool`` with ``z`` for ``OVERFLOW_PROBABILITY`` = 1e-4 per decode
step. A retraction event retracts about one request; a request lives at most ``max_tokens`` steps
(one token per step, the worst case), so the expected retractions per request are at most
``1e-4 x max_tokens / n``: under 1 % for ``n >= 41`` at 4096 tokens, far under it when speculative
decoding yields several tokens per step.

**Learning**: on a fleet it has not seen it runs the full-context plan. Each later run moves the
request cap toward the target by at most ``STEP_SHARE`` of the previous cap, never past what the
previous run observed (its peak KV held per running request, scaled to the new cap, must fit the
new pool), and steps back by one step, remembering a ceiling, when that run retracted more than
``RETRACTION_BOUND`` of its requests.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Callable, Iterable

from fleetgen.errors import ConfigError
from fleetgen.tuning.plan import ServerPlan, TunerBounds

OVERFLOW_PROBABILITY = 1e-4          # per decode step: P(KV the running requests hold > pool)
OVERFLOW_Z = NormalDist().inv_cdf(1 - OVERFLOW_PROBABILITY)
RETRACTION_BOUND = 0.01              # retracted / finished requests of one run above which we step back
STEP_SHARE = 0.25                    # one run moves the cap by at most a quarter of the previous cap


def decode_reserve_tokens(spec_steps: int, spec_topk: int, draft_tokens: int, page_size: int) -> int:
    """KV a running request keeps allocated past its committed length: one token, or under EAGLE/MTP
    ``2 x max(num_steps x topk, num_draft_tokens)``
    (SGLang ``mem_cache/allocation_sizing.py::get_alloc_reserve_per_decode``)."""
    if not draft_tokens:
        return 1
    steps, topk = max(1, spec_steps), max(1, spec_topk)
    if page_size == 1 or topk == 1:
        return 2 * max(steps * topk, draft_tokens)
    return 2 * max(((page_size - 1) + steps + page_size - 1) // page_size * page_size * topk, draft_tokens)


@dataclass(frozen=True)
class KvDemand:
    """KV tokens one running request holds at a random decode step: mean and deviation."""

    mean: float
    std: float
    requests: int
    prompt_tokens_mean: float
    output_tokens_mean: float

    @classmethod
    def from_lengths(cls, prompt_tokens: Iterable[float], output_tokens: Iterable[float], *, page_size: int,
                     reserve_tokens: int) -> "KvDemand":
        """From per-request prompt and output lengths (a run's stats). Each request weighs its output
        length (the steps it is running); its held KV is uniform over prompt + [0, output]; page
        rounding adds half a page on average and a uniform page's variance."""
        pairs = [(float(p), float(o)) for p, o in zip(prompt_tokens, output_tokens)
                 if math.isfinite(float(p)) and math.isfinite(float(o)) and o > 0]
        if not pairs:
            raise ConfigError("workload mode: the previous run's stats have no finished request with its "
                              "prompt and output lengths", hint="run once with pin_full_context_plan")
        weight = sum(o for _, o in pairs)
        first = sum(o * (p + o / 2) for p, o in pairs) / weight
        second = sum(o * (p * p + p * o + o * o / 3) for p, o in pairs) / weight
        variance = max(0.0, second - first * first) + page_size ** 2 / 12
        return cls(mean=first + reserve_tokens + page_size / 2, std=math.sqrt(variance), requests=len(pairs),
                   prompt_tokens_mean=sum(p for p, _ in pairs) / len(pairs),
                   output_tokens_mean=weight / len(pairs))

    @classmethod
    def from_stats(cls, stats, *, page_size: int, reserve_tokens: int) -> "KvDemand":
        """From a run's stats table (``fleetgen.validation.stats_table.load_stats``): every completion's
        prompt and completion tokens."""
        rows = stats.dropna(subset=["prompt_tokens", "completion_tokens"])
        return cls.from_lengths(rows["prompt_tokens"].tolist(), rows["completion_tokens"].tolist(),
                                page_size=page_size, reserve_tokens=reserve_tokens)

    def needed(self, requests: int, z: float = OVERFLOW_Z) -> int:
        return math.ceil(requests * self.mean + z * math.sqrt(requests) * self.std)

    def overflow_probability(self, requests: int, pool_tokens: int) -> float:
        """Per decode step, normal approximation of P(held KV of ``requests`` running > pool)."""
        spread = math.sqrt(requests) * self.std
        if spread == 0:
            return 0.0 if requests * self.mean <= pool_tokens else 1.0
        return 1 - NormalDist().cdf((pool_tokens - requests * self.mean) / spread)

    def expected_retraction_rate(self, requests: int, pool_tokens: int) -> float:
        """Retracted / finished requests, one token per step (the worst case): overflow probability x
        steps a request lives / requests finishing per step."""
        return min(1.0, self.overflow_probability(requests, pool_tokens) * self.output_tokens_mean / requests)

    def bounds(self, bounds: TunerBounds) -> TunerBounds:
        return dataclasses.replace(bounds, kv_tokens_mean=self.mean, kv_tokens_std=self.std,
                                   kv_overflow_z=OVERFLOW_Z)


@dataclass(frozen=True)
class RunObservation:
    """What one server did in the previous run: its cap, pool, peak KV held and retractions
    (``sglang:num_used_tokens`` peak, ``sglang:num_retracted_requests_total``, finished requests)."""

    max_running_requests: int
    max_total_num_tokens: int
    peak_used_tokens: int
    retracted_requests: int
    finished_requests: int

    @property
    def retraction_rate(self) -> float:
        return self.retracted_requests / max(1, self.finished_requests)

    def to_dict(self) -> dict:
        return asdict(self)


def parse_metrics(text: str) -> dict[str, float]:
    """SGLang's Prometheus text (``/metrics``) -> {metric name: value summed over its label sets}."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_part, _, value = line.rpartition(" ")
        name = name_part.split("{", 1)[0].strip()
        try:
            values[name] = values.get(name, 0.0) + float(value)
        except ValueError:
            continue
    return values


@dataclass(frozen=True)
class WorkloadStep:
    """Where the plan is on its path, and why."""

    full_context_cap: int
    previous_cap: int | None
    cap: int
    target_cap: int
    ceiling: int | None          # a cap that retracted too often: never reached again
    reason: str
    settled: bool

    def to_dict(self) -> dict:
        return asdict(self)


def step_size(cap: int) -> int:
    return max(1, math.ceil(cap * STEP_SHARE))


def next_cap(*, full_context_cap: int, target_cap: int, previous: RunObservation | None,
             ceiling: int | None, pool_tokens_at: Callable[[int], int]) -> WorkloadStep:
    """Tonight's request cap from the previous run (None: a fleet not seen yet).

    ``pool_tokens_at(n)``: the KV pool tokens of the plan with ``n`` running requests.
    """
    if previous is None:
        return WorkloadStep(full_context_cap, None, full_context_cap, target_cap, ceiling,
                            "no previous run on this fleet: the full-context plan", False)
    last = previous.max_running_requests
    if previous.retraction_rate > RETRACTION_BOUND:
        # never below the full-context plan: its pool holds every request at full context
        cap = max(full_context_cap, last - step_size(last))
        if last > full_context_cap:
            ceiling = last if ceiling is None else min(last, ceiling)
        return WorkloadStep(full_context_cap, last, cap, target_cap, ceiling,
                            f"{previous.retracted_requests} retractions in {previous.finished_requests} requests "
                            f"({previous.retraction_rate:.2%} > {RETRACTION_BOUND:.0%}): one step back from {last}",
                            False)
    goal = max(full_context_cap, target_cap if ceiling is None else min(target_cap, ceiling - 1))
    if goal <= last:
        cap, reason = max(goal, 1), f"target {goal} at or below last run's {last}"
    else:
        cap, reason = min(goal, last + step_size(last)), f"one step (+{STEP_SHARE:.0%}) from {last} toward {goal}"
        per_request_peak = previous.peak_used_tokens / last
        while cap > last and math.ceil(per_request_peak * cap) > pool_tokens_at(cap):
            cap -= 1
            reason = (f"last run's peak {previous.peak_used_tokens} KV tokens at cap {last} "
                      f"({per_request_peak:,.0f}/request) bounds the step to {cap}")
    return WorkloadStep(full_context_cap, last, cap, target_cap, ceiling, reason, cap == last)


# -- plans and their table ---------------------------------------------------------------------------

def workload_rows(full: ServerPlan, tonight: ServerPlan, target: ServerPlan, demand: KvDemand | None,
                  step: WorkloadStep) -> list[dict]:
    """Rows of the workload table: the full-context plan, tonight's plan and the target, each with its
    request cap, KV pool, the KV its requests need at the workload and the expected retraction rate."""
    rows = []
    for name, plan in (("full-context plan", full), ("tonight's plan", tonight), ("target", target)):
        requests = plan.expected["max_running_requests"]
        pool = plan.expected["max_total_num_tokens"]
        rows.append({"plan": name, "max_running_requests": requests, "max_total_num_tokens": pool,
                     "kv_needed_tokens": demand.needed(requests) if demand else None,
                     "expected_retraction_rate": demand.expected_retraction_rate(requests, pool) if demand else None,
                     "flags": " ".join(plan.command_args())})
    return rows


def render_workload_table(workload: dict) -> str:
    """The table ``plan.inputs["workload_mode"]`` holds, as text for the task log."""
    step, rows = workload["step"], workload["rows"]
    lines = [f"  workload mode: {step['reason']}" + (" (settled)" if step["settled"] else ""),
             f"  {'plan':<18} {'requests':>8} {'KV pool':>10} {'KV needed':>10} {'retractions':>11}"]
    for row in rows:
        needed = f"{row['kv_needed_tokens']:,}" if row["kv_needed_tokens"] is not None else "-"
        rate = f"{row['expected_retraction_rate']:.3%}" if row["expected_retraction_rate"] is not None else "-"
        lines.append(f"  {row['plan']:<18} {row['max_running_requests']:>8} {row['max_total_num_tokens']:>10,} "
                     f"{needed:>10} {rate:>11}")
    return "\n".join(lines)


def plan_workload_server(plan_with: Callable[[TunerBounds], ServerPlan], bounds: TunerBounds, *,
                         demand: KvDemand | None, previous: RunObservation | None,
                         ceiling: int | None = None, pin_full_context: bool = False) -> ServerPlan:
    """Tonight's plan for one server. ``plan_with(bounds)`` is ``plan_server`` for that server.

    The plan's ``inputs["workload_mode"]`` keeps the step, the table rows and the observation it learnt
    from; ``render_budget_table`` shows them under the budget.
    """
    full = plan_with(bounds)
    full_cap = full.expected["max_running_requests"]
    if pin_full_context or demand is None:
        step = WorkloadStep(full_cap, previous.max_running_requests if previous else None, full_cap, full_cap,
                            ceiling, "pinned to the full-context plan" if pin_full_context
                            else "no workload statistics yet: the full-context plan", False)
        return _annotate(full, full, full, full, demand, step, previous)
    demand_bounds = demand.bounds(bounds)
    target = plan_with(demand_bounds)
    cache: dict[int, ServerPlan] = {}

    def capped(requests: int) -> ServerPlan:
        if requests not in cache:
            cache[requests] = plan_with(dataclasses.replace(demand_bounds, max_running_requests=requests))
        return cache[requests]

    step = next_cap(full_context_cap=full_cap, target_cap=target.expected["max_running_requests"],
                    previous=previous, ceiling=ceiling,
                    pool_tokens_at=lambda n: capped(n).expected["max_total_num_tokens"])
    tonight = full if step.cap == full_cap and previous is None else capped(step.cap)
    return _annotate(tonight, full, tonight, target, demand, step, previous)


def _annotate(plan: ServerPlan, full: ServerPlan, tonight: ServerPlan, target: ServerPlan,
              demand: KvDemand | None, step: WorkloadStep, previous: RunObservation | None) -> ServerPlan:
    rows = workload_rows(full, tonight, target, demand, step)
    workload = {"step": step.to_dict(), "rows": rows, "demand": asdict(demand) if demand else None,
                "previous": previous.to_dict() if previous else None}
    return dataclasses.replace(plan, inputs={**plan.inputs, "workload_mode": workload})
