"""The tuning trial's measurement and decision: steady-state output tokens/s per GPU, scored conservatively.

Pure: the caller reads the run's files (``metrics/shard-NNNNN.jsonl``, through ``fleetgen.outputs``) and writes
the decision (``RunLayout.trial_decision``); docs/tuning-trial.md states the rules.

- **Windows.** A server's rate is the increase of SGLang's ``sglang:generation_tokens_total`` over a window of
  ``window_s`` seconds, divided by the window's length and by the server's GPUs. Rows from several shards sampling
  the same server interleave; the counter is absolute, so the rows are taken in time order. A counter that falls
  below half is a restart, a change of cap a relaunch, a gap longer than a window a time nobody saw: no window
  spans one.
- **Steady state.** Only stretches where every row has the server at its batch: its running requests at
  ``min_running_share`` of its cap or more, or requests waiting in its queue (SGLang reads its running gauge after
  an admission without the requests just admitted; the queue's drain at the end has neither). SGLang adds a request's
  output tokens to the counter when the request finishes, so for a request's lifetime after the batch fills the
  counter lags the work: the first ``cap`` completions of each stretch (one turnover of the batch) are warm-up.
- **Score.** median - 1.4826 x MAD over at least ``MIN_WINDOWS`` windows pooled over a candidate's servers, the
  score of vLLM's ``benchmarks/sweep/tune_speculative_k.py``, which also refuses a relative MAD over 0.10.
- **Decision.** A challenger wins only when its lower bound beats the incumbent's upper bound and its median beats
  the incumbent's by more than ``min_gain``; among several, the highest lower bound. Anything else keeps the
  incumbent (ties, noise, too few windows): no flapping.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field

from fleetgen.errors import ConfigError

GENERATION_TOKENS = "generation_tokens"  # the sample row's fields (fleetgen.generate.server_metrics.SAMPLE_FIELDS)
REQUESTS = "requests"
MIN_WINDOWS = 3            # tune_speculative_k's minimum of runs per cell
MAD_SCALE = 1.4826         # MAD -> standard deviation of a normal distribution (tune_speculative_k)
MAX_RELATIVE_MAD = 0.10    # tune_speculative_k's limit on MAD / median
STEADY_RUNNING_SHARE = 0.9  # running requests / cap at or above which a server is at its batch
WARMUP_TURNOVERS = 1       # completions, in caps, left out at the start of each steady stretch
# The DAG parameters a decision's reason points to (declared in fleetgen.airflow.run_config).
SHARE_PARAMETER, WINDOW_PARAMETER = "tuning_trial_share", "tuning_trial_window_s"


@dataclass(frozen=True)
class RateScore:
    """One candidate's measured output tokens/s per GPU."""

    candidate: str
    windows: int            # steady-state windows scored
    median: float
    mad: float              # median absolute deviation
    lower: float            # median - 1.4826 * MAD (vLLM's tune_speculative_k score)
    upper: float            # median + 1.4826 * MAD

    @property
    def relative_mad(self) -> float:
        if self.mad == 0:
            return 0.0
        return self.mad / self.median if self.median > 0 else math.inf

    @property
    def noisy(self) -> bool:
        """Too noisy to judge: its windows spread more than ``MAX_RELATIVE_MAD`` of its median."""
        return self.relative_mad > MAX_RELATIVE_MAD

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> RateScore:
        return cls(candidate=str(data["candidate"]), windows=int(data["windows"]), median=float(data["median"]),
                   mad=float(data["mad"]), lower=float(data["lower"]), upper=float(data["upper"]))


def _is_steady(row: dict, share: float) -> bool:
    """At its batch: running at ``share`` of the cap, or requests left waiting in the server's queue. After an
    admission SGLang sets its running gauge to the batch without the requests just admitted
    (sglang/srt/managers/scheduler.py passes the batch before they join to ``PrefillStats.from_adder``,
    scheduler_components/metrics_reporter.py ``report_prefill_stats`` publishes it): a server at its cap that just
    admitted k requests reads cap - k, so a cap of 8 turning over two at a time reads 6 and a cap of 1 reads 0.
    Requests still waiting after that admission mean the batch (or the memory) is full."""
    return row["cap"] > 0 and (row["running"] >= share * row["cap"] or (row.get("queue") or 0) > 0)


def _breaks(previous: dict, row: dict, window_s: float) -> bool:
    """No window spans a restart, a relaunch (another cap) or a gap nobody sampled. A restart starts the counters
    at zero: the output tokens fall below half. A smaller fall is two shards' rows crossing (a row's ``t`` is when
    its scrape was sent; a slower answer read a later count), not a restart."""
    return (row[GENERATION_TOKENS] < previous[GENERATION_TOKENS] / 2 or row["cap"] != previous["cap"]
            or row["t"] - previous["t"] > window_s)


# The same two rules under public names for the report's end of the job (fleetgen.report.drain). The private
# names stay: mutation/reasons.toml keys its accepted mutants by them.
is_at_batch = _is_steady
breaks_window = _breaks


def server_window_rates(rows: list[dict], *, window_s: float,
                        min_running_share: float = STEADY_RUNNING_SHARE) -> list[float]:
    """One server's output tokens/s in each steady-state window (its rows in any order)."""
    rates: list[float] = []
    stretch = window = previous = None  # first row of the steady stretch, of the open window; the row before
    for row in sorted(rows, key=lambda row: row["t"]):
        steady = _is_steady(row, min_running_share)
        if not steady or (previous is not None and _breaks(previous, row, window_s)):
            stretch = window = None
        if steady:
            if stretch is None:
                stretch = row
            if window is None:
                if row[REQUESTS] - stretch[REQUESTS] >= WARMUP_TURNOVERS * row["cap"]:
                    window = row
            elif row["t"] - window["t"] >= window_s:
                rates.append((row[GENERATION_TOKENS] - window[GENERATION_TOKENS]) / (row["t"] - window["t"]))
                window = row
        previous = row
    return rates


def steady_window_rates(samples: list[dict], *, window_s: float, gpus_per_server: dict[str, int],
                        min_running_share: float = STEADY_RUNNING_SHARE) -> dict[str, list[float]]:
    """server -> output tokens/s per GPU in each steady-state window (warm-up and the queue's drain left out).

    ``samples`` are ``metrics/`` rows (``MetricsSample.row``); rows without both counters (a server that does
    not report them) or without running requests are not used. Every server with usable rows is in the result,
    with an empty list when none of its windows was steady."""
    if window_s <= 0:
        raise ConfigError(f"the trial's measuring window must be positive seconds, got {window_s}")
    by_server: dict[str, list[dict]] = {}
    for row in samples:
        if all(row.get(name) is not None for name in ("t", "server", "cap", "running", GENERATION_TOKENS, REQUESTS)):
            by_server.setdefault(str(row["server"]), []).append(row)
    rates = {}
    for server, rows in sorted(by_server.items()):
        gpus = gpus_per_server.get(server)
        if not gpus or gpus < 1:
            raise ConfigError(f"the trial has no GPU count for server {server}, whose metrics it measured",
                              server=server, hint="pass every sampled server's tensor-parallel size")
        rates[server] = [rate / gpus for rate in server_window_rates(rows, window_s=window_s,
                                                                     min_running_share=min_running_share)]
    return rates


def pooled_rates(rates_by_server: dict[str, list[float]], candidate_of: dict[str, str]) -> dict[str, list[float]]:
    """candidate -> the windows of all its servers (``candidate_of``: server -> candidate); a candidate whose
    servers gave no windows is there with none."""
    pooled: dict[str, list[float]] = {candidate: [] for candidate in candidate_of.values()}
    for server, candidate in candidate_of.items():
        pooled[candidate] += rates_by_server.get(server, [])
    return pooled


def score(candidate: str, rates: list[float]) -> RateScore | None:
    """The conservative score of ``rates``; None with fewer than ``MIN_WINDOWS`` windows (too few to judge)."""
    if len(rates) < MIN_WINDOWS:
        return None
    median = statistics.median(rates)
    mad = statistics.median(abs(rate - median) for rate in rates)
    return RateScore(candidate=candidate, windows=len(rates), median=median, mad=mad,
                     lower=median - MAD_SCALE * mad, upper=median + MAD_SCALE * mad)


@dataclass(frozen=True)
class TrialDecision:
    incumbent: str
    winner: str
    scores: dict[str, RateScore]
    reason: str              # one sentence a user reads in the log and the report
    min_gain: float = 0.0
    unscored: dict[str, int] = field(default_factory=dict)  # candidate -> its windows, fewer than MIN_WINDOWS

    @property
    def changed(self) -> bool:
        return self.winner != self.incumbent

    @property
    def candidates(self) -> set[str]:
        """Every candidate that ran in the trial, scored or not."""
        return {self.incumbent, *self.scores, *self.unscored}

    @property
    def gain(self) -> float | None:
        """The winner's median over the incumbent's, minus one (0 when the incumbent is kept and scored)."""
        winner, incumbent = self.scores.get(self.winner), self.scores.get(self.incumbent)
        if winner is None or incumbent is None or incumbent.median <= 0:
            return None
        return winner.median / incumbent.median - 1

    def to_dict(self) -> dict:
        return {"incumbent": self.incumbent, "winner": self.winner, "reason": self.reason, "min_gain": self.min_gain,
                "scores": {name: value.to_dict() for name, value in sorted(self.scores.items())},
                "unscored": dict(sorted(self.unscored.items()))}

    @classmethod
    def from_dict(cls, data: dict) -> TrialDecision:
        """The decision ``to_dict`` wrote; ConfigError naming what is missing or malformed."""
        try:
            return cls(incumbent=str(data["incumbent"]), winner=str(data["winner"]), reason=str(data["reason"]),
                       scores={str(name): RateScore.from_dict(value) for name, value in data["scores"].items()},
                       min_gain=float(data.get("min_gain", 0.0)),
                       unscored={str(name): int(count) for name, count in (data.get("unscored") or {}).items()})
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise ConfigError(f"not a tuning trial decision: {type(error).__name__} {error}",
                              hint="the decide task writes it; re-run the run's decide task") from None


def _per_gpu(value: float) -> str:
    return f"{value:,.0f} tokens/s per GPU"


def _why_kept(incumbent: RateScore, scores: dict[str, RateScore], unscored: dict[str, int], min_gain: float) -> str:
    """Why no challenger replaced a scored, steady incumbent: the best challenger's shortfall, or none measured."""
    challengers = [value for name, value in scores.items() if name != incumbent.candidate]
    if not challengers:
        few = ", ".join(f"{name} ({count})" for name, count in sorted(unscored.items()))
        return (f"kept {incumbent.candidate} ({_per_gpu(incumbent.median)}): no challenger gave {MIN_WINDOWS} "
                f"steady-state windows" + (f" (windows: {few})" if few else ""))
    best = max(sorted(challengers, key=lambda value: value.candidate), key=lambda value: value.median)
    gain = best.median / incumbent.median - 1 if incumbent.median > 0 else 0.0
    if best.noisy:
        why = f"its windows spread {best.relative_mad:.0%} (MAD / median), more than {MAX_RELATIVE_MAD:.0%}: too noisy"
    elif best.median <= incumbent.median * (1 + min_gain):
        why = f"its median is {gain:+.1%}, not more than the {min_gain:.0%} a change needs"
    else:
        why = (f"its lower bound {best.lower:,.0f} does not beat the incumbent's upper bound {incumbent.upper:,.0f} "
               f"(median {gain:+.1%})")
    return f"kept {incumbent.candidate} ({_per_gpu(incumbent.median)}): the best challenger, {best.candidate}, {why}"


def decide(rates_by_candidate: dict[str, list[float]], *, incumbent: str, min_gain: float) -> TrialDecision:
    """The trial's decision from each candidate's windows (``pooled_rates``): see the module's docstring."""
    scores, unscored = {}, {}
    for name, rates in sorted(rates_by_candidate.items()):
        judged = score(name, rates)
        if judged is None:
            unscored[name] = len(rates)
        else:
            scores[name] = judged
    base = scores.get(incumbent)
    if base is None:
        count = len(rates_by_candidate.get(incumbent, []))
        return TrialDecision(incumbent, incumbent, scores, reason=(
            f"kept {incumbent}: it gave {count} steady-state window(s), fewer than the {MIN_WINDOWS} a comparison "
            f"needs (raise the DAG parameter {SHARE_PARAMETER} for a longer trial, or lower {WINDOW_PARAMETER})"),
            min_gain=min_gain, unscored=unscored)
    if base.noisy:
        return TrialDecision(incumbent, incumbent, scores, reason=(
            f"kept {incumbent}: its own windows spread {base.relative_mad:.0%} (MAD / median), more than "
            f"{MAX_RELATIVE_MAD:.0%}, too noisy to judge a challenger against (longer windows average more "
            f"completions: raise the DAG parameter {WINDOW_PARAMETER})"), min_gain=min_gain, unscored=unscored)
    winners = [value for name, value in scores.items() if name != incumbent and not value.noisy
               and value.lower > base.upper and value.median > base.median * (1 + min_gain)]
    if not winners:
        return TrialDecision(incumbent, incumbent, scores, reason=_why_kept(base, scores, unscored, min_gain),
                             min_gain=min_gain, unscored=unscored)
    best = max(winners, key=lambda value: (value.lower, value.median))  # scores are in name order: ties by name
    return TrialDecision(incumbent, best.candidate, scores, reason=(
        f"{best.candidate} replaces {incumbent}: {_per_gpu(best.median)} against {base.median:,.0f} "
        f"({best.median / base.median - 1:+.1%}), its lower bound {best.lower:,.0f} above the incumbent's upper "
        f"bound {base.upper:,.0f} over {best.windows} and {base.windows} windows"), min_gain=min_gain,
        unscored=unscored)


def decision_record(decision: TrialDecision, *, servers: dict[str, dict], samples: list[dict], decided_at: float,
                    auto_sizing: str | None = None, window_s: float | None = None) -> dict:
    """What ``RunLayout.trial_decision`` holds: the decision, when it was taken, which candidate (if any) is SGLang's
    own automatic sizing, and per server of the trial its candidate, cap and GPUs (``servers``: server ->
    {"candidate", "cap", "gpus"}) with the seconds it was sampled in the trial (first to last metrics row of
    ``samples``, the trial's rows), which the report charges to the trial's cost; ``window_s``, the windows the
    trial measured, is the one the report measures the configuration in use with."""
    seen: dict[str, list[float]] = {}
    for row in samples:
        if row.get("server") in servers and row.get("t") is not None:
            seen.setdefault(row["server"], []).append(float(row["t"]))
    per_server = {server: {"candidate": str(entry["candidate"]), "cap": entry.get("cap"),
                           "gpus": int(entry.get("gpus") or 1),
                           "trial_seconds": round(max(seen[server]) - min(seen[server]), 3) if server in seen else 0.0}
                  for server, entry in sorted(servers.items())}
    return {**decision.to_dict(), "decided_at": decided_at, "auto_sizing": auto_sizing, "window_s": window_s,
            "servers": per_server}


def skipped_record(why: str) -> dict:
    """What ``RunLayout.trial_decision`` holds when no trial ran: why (off by its DAG parameter, too few servers)."""
    return {"skipped": why}
