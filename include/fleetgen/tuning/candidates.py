"""The tuning trial's candidate configurations, and how tonight's fleet is split between them (docs/tuning-trial.md).

The memory arithmetic says what fits; only a measurement on the fleet says what is fastest (issue 30, the public
figures in docs/tuning-trial.md). So besides the fleet file's own configuration (``INCUMBENT``: its
``server.extra_args`` as written) the plan names a few challengers, each a named edit of those args (or of the
tuner's bounds) that ``fleetgen.tuning.fleet_plan.plan_fleet_candidates`` plans as a whole plan for its options:

- ``no_speculation``: every ``--speculative-*`` flag removed: its state slots per request, and so its cap, re-planned;
- ``draft_minus_1``: one draft step (and token) fewer, when speculating with an EAGLE-family algorithm and >= 2 steps;
- ``cap_3_4`` / ``cap_1_2``: the request cap at 3/4 and 1/2 of what memory holds (the knee: a batch past the point
  where decode stops getting faster only queues);
- ``sglang_auto``: the fleet's own args sized by SGLang itself (no ``--mem-fraction-static`` or
  ``--max-running-requests`` of the tuner's): the baseline the tuner's sizing is measured against, and a
  configuration like any other should it be the fastest;
- whatever the user lists in the DAG parameter ``tuning_candidates``: ``{"name", "flags": {"--flag": value, or
  null to remove it}}``.

The default candidates are lossless: they change speed, never the distribution of the text (speculative decoding
is exact, and a cap or a chunk size only schedules). Flags that change numerics (``NUMERICS_FLAGS``) are tried only
when the user lists them. Every name means the same configuration night after night, since the record of trials
(``fleetgen.tuning.trial_history``) is keyed by it.

``choose_split`` puts the incumbent on most servers and each challenger on one.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from fleetgen.errors import ConfigError
from fleetgen.tuning.plan import INCUMBENT, MODES, SGLANG_DEFAULTS, format_flag_value

__all__ = ["INCUMBENT", "NO_SPECULATION", "DRAFT_MINUS_1", "CAP_3_4", "CAP_1_2", "SGLANG_AUTO", "DEFAULT_ORDER",
           "NUMERICS_FLAGS",
           "LOSSLESS_FLAGS", "MIN_TRIAL_SERVERS", "Candidate", "TrialSplit", "edit_args", "default_candidates",
           "user_candidates", "candidate_set", "choose_split", "CANDIDATES_PARAMETER"]

NO_SPECULATION = "no_speculation"
DRAFT_MINUS_1 = "draft_minus_1"
CAP_3_4 = "cap_3_4"
CAP_1_2 = "cap_1_2"
SGLANG_AUTO = "sglang_auto"
# The default challengers in the order they are tried (one server each, the first untried first): speculation's
# gain falls with the batch and turns into a loss on some models above 20-32 (docs/tuning-trial.md), so turning it
# off is asked first; then a shallower draft; then the knee; then SGLang's own sizing, the baseline.
DEFAULT_ORDER = (NO_SPECULATION, DRAFT_MINUS_1, CAP_3_4, CAP_1_2, SGLANG_AUTO)
CAP_SHARES = {CAP_3_4: 0.75, CAP_1_2: 0.5}
SPECULATIVE_PREFIX = "--speculative-"
# Flags whose value changes the numbers the model computes (bf16 SSM state, a narrower KV cache, another weight
# quantization): a candidate only when the user lists it.
NUMERICS_FLAGS = frozenset({"--mamba-ssm-dtype", "--kv-cache-dtype", "--quantization"})
# What the default candidates may change: speculation and its depth, the caps, the chunk and decode-graph sizes.
LOSSLESS_FLAGS = frozenset({"--speculative-algorithm", "--speculative-num-steps", "--speculative-eagle-topk",
                            "--speculative-num-draft-tokens", "--speculative-draft-model-path",
                            "--max-running-requests", "--max-mamba-cache-size", "--chunked-prefill-size",
                            "--cuda-graph-max-bs-decode"})
# A trial needs the incumbent on more servers than the challengers: with fewer, no server is spared.
MIN_TRIAL_SERVERS = 3
CANDIDATES_PARAMETER = "tuning_candidates"
# Flags the launcher sets itself (the fleet file refuses them in server.extra_args too, nodes/fleet.py); --config
# carries the API key when the fleet has one.
_NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")


@dataclass(frozen=True)
class Candidate:
    """One configuration: ``changes`` to the fleet's extra args (flag -> value; True: a bare switch; None: removed),
    or, with ``cap_share``, the incumbent's request cap scaled by it, or, with ``mode``, the fleet's args planned in
    that tuning mode (``sglang_defaults``: SGLang sizes the server). ``listed``: named in ``tuning_candidates``."""

    name: str
    changes: tuple[tuple[str, object], ...] = ()
    cap_share: float | None = None
    listed: bool = False
    mode: str | None = None

    def __post_init__(self) -> None:
        if self.mode is not None and self.mode not in MODES:
            raise ConfigError(f"candidate {self.name}: mode must be one of {MODES}, got {self.mode!r}")

    @property
    def flags(self) -> dict[str, object]:
        return dict(self.changes)

    @property
    def changes_numerics(self) -> bool:
        return any(flag in NUMERICS_FLAGS for flag, _ in self.changes)

    def launch_args(self, base_args: Sequence[str]) -> tuple[str, ...]:
        """The fleet's ``base_args`` with this candidate's changes."""
        return edit_args(base_args, self.flags)

    def describe(self) -> str:
        """The change in words, for the log and the plan notes."""
        if self.cap_share is not None:
            return f"the request cap at {self.cap_share:g} of what memory holds"
        if self.mode == SGLANG_DEFAULTS:
            return ("the fleet file's own server.extra_args sized by SGLang itself (no --mem-fraction-static or "
                    "--max-running-requests of the tuner's)")
        if not self.changes:
            return "the fleet file's own server.extra_args"
        words = [f"{flag} removed" if value is None else flag if value is True else
                 f"{flag} {format_flag_value(value)}" for flag, value in self.changes]
        return ", ".join(words) + (" (changes numerics)" if self.changes_numerics else "")

    def to_dict(self) -> dict:
        return {"name": self.name, "flags": self.flags, "cap_share": self.cap_share, "listed": self.listed,
                "mode": self.mode}


def _items(args: Sequence[str]) -> list[tuple[str | None, list[str]]]:
    """``args`` as (flag, its words) items; a word that is no flag's value stands alone (flag None). A flag's value
    is the next word when that does not start with ``--`` (SGLang has no positional arguments; ``-1`` is a value)."""
    items: list[tuple[str | None, list[str]]] = []
    words = [str(arg) for arg in args]
    index = 0
    while index < len(words):
        word = words[index]
        if not word.startswith("--"):
            items.append((None, [word]))
            index += 1
            continue
        name = word.split("=", 1)[0]
        if "=" not in word and index + 1 < len(words) and not words[index + 1].startswith("--"):
            items.append((name, [word, words[index + 1]]))
            index += 2
        else:
            items.append((name, [word]))
            index += 1
    return items


def _flag_words(flag: str, value: object) -> list[str]:
    if value is None:
        return []
    return [flag] if value is True else [flag, format_flag_value(value)]


def edit_args(args: Sequence[str], changes: Mapping[str, object]) -> tuple[str, ...]:
    """``args`` with each flag of ``changes`` set where it stood (its later repeats dropped), appended when it was
    not there, or removed (value None)."""
    edited: list[str] = []
    done: set[str] = set()
    for name, words in _items(args):
        if name is None or name not in changes:
            edited += words
        elif name not in done:
            done.add(name)
            edited += _flag_words(name, changes[name])
    for name, value in changes.items():
        if name not in done:
            edited += _flag_words(name, value)
    return tuple(edited)


def flags_of(args: Sequence[str]) -> dict[str, str | bool]:
    """The flags ``args`` set (the last of a repeated flag wins): value words, or True for a bare switch."""
    flags: dict[str, str | bool] = {}
    for name, words in _items(args):
        if name is not None:
            flags[name] = words[0].split("=", 1)[1] if "=" in words[0] else (words[1] if len(words) > 1 else True)
    return flags


def default_candidates(base_args: Sequence[str], speculative: tuple[int, int, int] | None, *,
                       eagle_family: bool) -> list[Candidate]:
    """The default challengers that apply to the fleet's ``base_args``, in ``DEFAULT_ORDER``. ``speculative``:
    (steps, topk, draft tokens) as SGLang resolves them for the fleet's options (None without speculation)."""
    found: dict[str, Candidate] = {}
    if speculative is not None:
        removed = tuple((flag, None) for flag in flags_of(base_args) if flag.startswith(SPECULATIVE_PREFIX))
        found[NO_SPECULATION] = Candidate(NO_SPECULATION, removed)
        steps, topk, draft = speculative
        if eagle_family and steps >= 2:
            # With top-k 1 SGLang forces draft tokens = steps + 1 (speculative_hook._handle_eagle_family).
            found[DRAFT_MINUS_1] = Candidate(DRAFT_MINUS_1, (
                ("--speculative-num-steps", steps - 1), ("--speculative-eagle-topk", topk),
                ("--speculative-num-draft-tokens", steps if topk == 1 else max(2, draft - 1))))
    for name, share in CAP_SHARES.items():
        found[name] = Candidate(name, cap_share=share)
    found[SGLANG_AUTO] = Candidate(SGLANG_AUTO, mode=SGLANG_DEFAULTS)
    candidates = [found[name] for name in DEFAULT_ORDER if name in found]
    for candidate in candidates:  # by construction; kept as a check, the promise the docs make
        if any(flag not in LOSSLESS_FLAGS for flag, _ in candidate.changes):
            raise ConfigError(f"default candidate {candidate.name} changes {candidate.flags}, outside the lossless "
                              "flags", hint="list a candidate that changes numerics in tuning_candidates")
    return candidates


def _refuse(position: int, entry: object, what: str) -> ConfigError:
    return ConfigError(f"DAG parameter {CANDIDATES_PARAMETER}[{position}] {what}, got {entry!r}",
                       hint=f"set {CANDIDATES_PARAMETER} in the trigger form or the run's conf to a list of "
                            '{"name": "...", "flags": {"--flag": value, "--other": null}} (null removes a flag)')


def user_candidates(entries: object, *, reserved: Sequence[str] = ()) -> list[Candidate]:
    """The candidates of the DAG parameter ``tuning_candidates``, checked: each a ``{"name", "flags"}`` object with a
    name of its own (lower case, digits, _; none of the default names) and flags that start with ``--``, that the
    launcher does not set itself (``reserved``: the fleet's own, and ``--config``), with a value that is a string,
    a number, true (a bare switch) or null (removed). Every refusal names the parameter and the entry."""
    if not isinstance(entries, list):
        raise ConfigError(f"DAG parameter {CANDIDATES_PARAMETER} must be a list, got {entries!r}",
                          hint=f"set {CANDIDATES_PARAMETER} to a list of {{name, flags}} objects, or [] for none")
    taken = {INCUMBENT, *DEFAULT_ORDER}
    candidates = []
    for position, entry in enumerate(entries):
        if not isinstance(entry, dict) or set(entry) != {"name", "flags"}:
            raise _refuse(position, entry, 'must be an object with exactly the keys "name" and "flags"')
        name, flags = entry["name"], entry["flags"]
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise _refuse(position, name, "name must be 1-40 lower-case letters, digits or _, starting with a letter")
        if name in taken:
            raise _refuse(position, name, f"name {name} is taken (by a default candidate or an earlier entry)")
        taken.add(name)
        if not isinstance(flags, dict) or not flags:
            raise _refuse(position, flags, f"({name}) flags must be a non-empty object of flag -> value")
        for flag, value in flags.items():
            if not isinstance(flag, str) or not re.fullmatch(r"--[a-z0-9][a-z0-9-]*", flag):
                raise _refuse(position, flag, f"({name}) a flag must be a long SGLang flag such as --page-size")
            if flag in reserved or flag == "--config":
                raise _refuse(position, flag, f"({name}) sets {flag}, which the launch decides itself")
            if not (value is None or value is True or isinstance(value, str) and value and not value.startswith("--")
                    or isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)):
                raise _refuse(position, value, f"({name}) {flag} must be a string, a number, true (a bare switch) "
                                               "or null (removed)")
        candidates.append(Candidate(name, tuple(flags.items()), listed=True))
    return candidates


def candidate_set(defaults: Sequence[Candidate], listed: Sequence[Candidate]) -> list[Candidate]:
    """Every candidate of tonight in priority order: the incumbent, the user's (asked for by name), the defaults."""
    return [Candidate(INCUMBENT), *listed, *defaults]


@dataclass(frozen=True)
class TrialSplit:
    """Which candidate each server runs tonight (``assignment``, in the fleet's server order) and why."""

    incumbent: str
    assignment: dict[str, str]
    challengers: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def trial(self) -> bool:
        return bool(self.challengers)

    def to_dict(self) -> dict:
        return {"incumbent": self.incumbent, "assignment": dict(self.assignment),
                "challengers": list(self.challengers), "notes": list(self.notes)}

    @classmethod
    def from_dict(cls, data: dict) -> TrialSplit:
        return cls(incumbent=str(data["incumbent"]), assignment={str(k): str(v) for k, v in data["assignment"].items()},
                   challengers=tuple(data.get("challengers", ())), notes=tuple(data.get("notes", ())))


def choose_split(servers: Sequence[str], candidates: Sequence[str], *, last_winner: str | None,
                 tried: set[str]) -> TrialSplit:
    """The split of ``servers`` (the fleet's order) between ``candidates`` (tonight's, in priority order, the fleet
    file's own first).

    The incumbent is the last recorded winner for this fleet, model and workload (``last_winner``), else the fleet
    file's own configuration. With N servers at most (N-1)//2 challengers run, one server each (the last servers),
    so the incumbent keeps most; once a trial was recorded (``tried`` is not empty) one server a night is spent on
    the next challenger never tried. Fewer than ``MIN_TRIAL_SERVERS`` servers, or nothing left to try: no trial."""
    notes: list[str] = []
    incumbent = INCUMBENT
    if last_winner is not None:
        if last_winner in candidates:
            incumbent = last_winner
            if last_winner != INCUMBENT:
                notes.append(f"incumbent {last_winner}: the winner of the last trial for this fleet, model and "
                             "workload")
        else:
            notes.append(f"the last trial's winner {last_winner} is not a candidate tonight (its flags no longer "
                         f"apply, or tuning_candidates no longer lists it): the incumbent is {INCUMBENT}")
    everyone = {server: incumbent for server in servers}
    if len(servers) < MIN_TRIAL_SERVERS:
        notes.append(f"no tuning trial: {len(servers)} server(s), and a trial needs at least {MIN_TRIAL_SERVERS} (the "
                     "incumbent on most, each challenger on one)")
        return TrialSplit(incumbent, everyone, (), tuple(notes))
    pending = [name for name in candidates if name != incumbent and name not in tried]
    room = (len(servers) - 1) // 2
    if tried:
        room = min(room, 1)
    challengers = tuple(pending[:room])
    if not challengers:
        notes.append("no tuning trial: every candidate was tried before for this fleet, model and workload"
                     if tried else "no tuning trial: no candidate besides the incumbent applies to this fleet")
        return TrialSplit(incumbent, everyone, (), tuple(notes))
    on_challengers = servers[len(servers) - len(challengers):]
    assignment = {**everyone, **dict(zip(on_challengers, challengers))}
    notes.append(f"tuning trial: {incumbent} on {len(servers) - len(challengers)} server(s), "
                 + ", ".join(f"{name} on {server}" for server, name in zip(on_challengers, challengers))
                 + (f"; not tried tonight: {', '.join(pending[room:])}" if pending[room:] else ""))
    return TrialSplit(incumbent, assignment, challengers, tuple(notes))
