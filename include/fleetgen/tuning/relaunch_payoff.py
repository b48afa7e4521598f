"""Whether tonight's relaunch round pays for itself: what the rest of the job gains on the trial's winner against
what the fleet loses while the round runs (docs/tuning-trial.md §7, step 4).

The round stops every server on a losing configuration and starts it on the winner, and the rest of the job waits
for it on every server (the DAG's ``relaunch`` group runs before ``generate_shard``). In server-seconds at the
winner's speed:

    cost = servers x round_s
    gain = sum over the moved servers of max(0, 1 - median(its candidate) / median(winner)) x rest_s

``round_s`` is the first round's measured launch-to-ready time of its slowest server (``first_round_s``: the stop
and the tasks around it come on top, so the cost is a lower bound and the rule leans to relaunching), ``rest_s``
the rest of the job at the trial's own pace (``rest_seconds``), each median the trial's windows of that candidate.
A relaunch is left out only when all of that was measured and the gain does not beat the cost; a moved server
whose candidate gave no window, or a round or pace not measured, relaunches as the decision says.

Pure: the decide task reads the samples and the server times and writes the estimate into the decision file.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from fleetgen.tuning.trial import REQUESTS

WHEN_IT_PAYS, ALWAYS = "when_it_pays", "always"
POLICIES = (WHEN_IT_PAYS, ALWAYS)  # the DAG parameter tuning_trial_relaunch (fleetgen.airflow.run_config)
POLICY_PARAMETER = "tuning_trial_relaunch"


def first_round_s(server_times: dict[str, list[dict]]) -> float | None:
    """The longest launch-to-ready among the servers the first round launched (``outputs.read_server_times``: each
    server's events in time order); None when it launched none (every server kept from an earlier run)."""
    spans = []
    for events in server_times.values():
        launched = next((event["t"] for event in events if event["event"] == "launched"), None)
        if launched is None:
            continue
        ready = next((event["t"] for event in events if event["event"] == "ready" and event["t"] >= launched), None)
        if ready is not None:
            spans.append(ready - launched)
    return max(spans) if spans else None


def trial_completions(samples: Iterable[dict]) -> tuple[int, float]:
    """(requests the servers finished, seconds from the first to the last row) over the trial's metrics rows. Each
    server's finished-requests counter is summed by its rises from row to row in time order: a restart's fall adds
    nothing, two shards' rows of one server interleave without counting a request twice."""
    by_server: dict[str, list[dict]] = {}
    times = []
    for row in samples:
        by_server.setdefault(str(row["server"]), []).append(row)
        times.append(float(row["t"]))
    finished = 0
    for rows in by_server.values():
        rows.sort(key=lambda row: row["t"])
        finished += sum(max(0, later[REQUESTS] - earlier[REQUESTS]) for earlier, later in zip(rows, rows[1:]))
    return int(finished), (max(times) - min(times)) if times else 0.0


def rest_seconds(total_prompts: int | None, finished: int, seconds: float) -> float | None:
    """The rest of the job at the trial's pace: the prompts the trial did not finish, at its requests per second;
    None when the job's size or the pace is unknown."""
    if total_prompts is None or finished <= 0 or seconds <= 0:
        return None
    return max(0, total_prompts - finished) * seconds / finished


def median_rate(rates: list[float] | None) -> float | None:
    return statistics.median(rates) if rates else None


@dataclass(frozen=True)
class RelaunchEstimate:
    """The round's cost and gain for the servers the decision moves (``moved``: server -> the candidate it ran)."""

    moved: dict[str, str]
    servers: int                     # every server of the fleet waits through the round
    round_s: float | None            # the first round's slowest launch-to-ready, measured
    rest_s: float | None             # the rest of the job at the trial's pace
    shortfall: dict[str, float | None]  # per moved server: 1 - its candidate's median / the winner's (None: unmeasured)

    @property
    def cost_s(self) -> float | None:
        return None if self.round_s is None else self.servers * self.round_s

    @property
    def gain_s(self) -> float | None:
        if self.rest_s is None or any(value is None for value in self.shortfall.values()):
            return None
        return sum(max(0.0, value) * self.rest_s for value in self.shortfall.values())

    @property
    def pays(self) -> bool:
        """Relaunch unless the measurement says the round costs at least what it gains."""
        cost, gain = self.cost_s, self.gain_s
        return not self.moved or cost is None or gain is None or gain > cost

    def reason(self) -> str:
        if not self.moved:
            return "no server moves"
        cost, gain = self.cost_s, self.gain_s
        if cost is None:
            return "the first round launched no server, so the round's length is not measured: relaunching"
        if gain is None:
            unmeasured = sorted(self.moved[server] for server, value in self.shortfall.items() if value is None)
            what = (f"{', '.join(dict.fromkeys(unmeasured))} gave no steady window" if unmeasured else
                    "the job's size or the trial's pace is not known")
            return f"{what}: relaunching"
        verdict = "relaunching" if gain > cost else (
            f"keeping {', '.join(sorted(self.moved))} on {', '.join(sorted(set(self.moved.values())))} for the rest "
            f"of the job (set {POLICY_PARAMETER} to {ALWAYS} to relaunch anyway)")
        return (f"relaunching would idle {self.servers} server(s) for ~{self.round_s:.0f} s (the first round's "
                f"launch-to-ready) = {cost:.0f} server-s, to gain {gain:.0f} server-s over the ~{self.rest_s:.0f} s "
                f"left at the trial's pace: {verdict}")

    def to_dict(self) -> dict:
        def rounded(value: float | None, digits: int = 1) -> float | None:
            return None if value is None else round(value, digits)

        return {"moved": dict(self.moved), "servers": self.servers, "round_s": rounded(self.round_s),
                "rest_s": rounded(self.rest_s), "cost_server_s": rounded(self.cost_s),
                "gain_server_s": rounded(self.gain_s),
                "shortfall": {server: rounded(value, 4) for server, value in self.shortfall.items()},
                "pays": self.pays, "reason": self.reason()}


def estimate(*, winner: str, moved: dict[str, str], pooled: dict[str, list[float]], servers: int,
             round_s: float | None, rest_s: float | None) -> RelaunchEstimate:
    """The estimate for ``moved`` (server -> the candidate it ran) from each candidate's pooled window rates."""
    best = median_rate(pooled.get(winner))
    shortfall = {}
    for server, ran in moved.items():
        own = median_rate(pooled.get(ran))
        shortfall[server] = None if best is None or own is None or best <= 0 else 1 - own / best
    return RelaunchEstimate(moved=dict(moved), servers=servers, round_s=round_s, rest_s=rest_s, shortfall=shortfall)
