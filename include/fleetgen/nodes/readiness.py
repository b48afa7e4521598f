"""Readiness of SGLang servers: fatal log lines, ``/server_info`` readback. Pure functions.

The fatal messages are SGLang 0.5.23's own (docs/sglang-memory-model.md §5.2 lists them with the source
of each); a line that matches fails the wait at once with that line, instead of waiting out a timeout.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from fleetgen.errors import FailureKind, ServerError
from fleetgen.nodes import launch_identity

K = FailureKind
# (kind, needle). Specific causes first: the first specific match in a log wins over a generic one.
# The messages are SGLang 0.5.23's (docs/sglang-memory-model.md §5.2).
_SPECIFIC = (
    (K.OOM_WEIGHTS, "Loaded weights leave no GPU memory for the KV cache"),
    (K.OOM_KV, "Not enough memory. Please try to increase --mem-fraction-static"),
    # pool_configurator.validate_swa_pool_size: the sliding-window pool is smaller than one window (§2.5)
    (K.OOM_KV, "cannot hold even one request: the prefill admission floor is sliding_window_size"),
    (K.OOM_MAMBA, "Not enough GPU memory for hybrid (mamba/linear-attention) state cache"),
    (K.OOM_MAMBA, "Hybrid (mamba/linear-attention) state cache is too small to serve any requests"),
    (K.OOM_CUDA_GRAPH, "Capture cuda graph failed"),
    (K.OOM_RUNTIME, "CUDA out of memory"),
    (K.OOM_RUNTIME, "OutOfMemoryError"),
    (K.BAD_ARGS, "error: unrecognized arguments"),
    (K.BAD_ARGS, "error: ambiguous option"),
    (K.BAD_ARGS, "error: argument"),
    (K.BAD_ARGS, "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"),
    (K.PORT_IN_USE, "Address already in use"),
    (K.PORT_IN_USE, "address already in use"),  # uvicorn's wording
)
_GENERIC = (
    (K.EXITED, re.compile(r"scheduler died during initialization")),
    (K.EXITED, re.compile(r"Initialization failed\.")),
    (K.EXITED, re.compile(r"^Traceback \(most recent call last\)")),
    # The launcher's line once a scheduler raised; it then SIGKILLs its own process tree
    # (sglang/srt/entrypoints/engine.py::launch_phase_sigquit_handler).
    (K.EXITED, re.compile(r"Received sigquit from a child process")),
)
# The line that ends a traceback ("ValueError: Unrecognized model in /models/x ..."): it names the cause, so
# it wins over the generic lines above. A scheduler's traceback is one logger line whose first line carries
# the timestamp ("[...] Scheduler hit an exception: Traceback ..."); its exception line stands alone.
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception): \S")


@dataclass(frozen=True)
class FatalLine:
    kind: FailureKind
    line: str
    line_number: int  # 1-based, within the lines scanned

    @property
    def hint(self) -> str:
        return self.kind.hint


def find_fatal(lines: list[str]) -> FatalLine | None:
    """The most telling fatal line in a log excerpt, or None while the server is still healthy.

    The first line with a known cause (``_SPECIFIC``) wins; else the first exception that ended a
    traceback (the root cause: a scheduler's exception comes before the launcher's lines); else the
    first generic line.
    """
    generic: FatalLine | None = None
    exception: FatalLine | None = None
    for number, line in enumerate(lines, start=1):
        for kind, needle in _SPECIFIC:
            if needle in line:
                return FatalLine(kind, line.strip(), number)
        if exception is None and _EXCEPTION_LINE.search(line):
            exception = FatalLine(K.EXITED, line.strip(), number)
        if generic is None:
            for kind, pattern in _GENERIC:
                if pattern.search(line):
                    generic = FatalLine(kind, line.strip(), number)
                    break
    return exception or generic


@dataclass(frozen=True)
class RankLimits:
    """One attention-DP rank's limits, from ``internal_states[i]``."""

    max_running_requests: int | None  # effective_max_running_requests_per_dp: the cap that binds
    max_total_num_tokens: int | None
    max_mamba_cache_size: int | None
    # memory_usage.token_capacity_swa: the sliding-window pool's tokens (docs/sglang-memory-model.md §2.5)
    swa_max_total_num_tokens: int | None = None

    def to_dict(self) -> dict:
        data = {"max_running_requests": self.max_running_requests,
                "max_total_num_tokens": self.max_total_num_tokens, "max_mamba_cache_size": self.max_mamba_cache_size}
        if self.swa_max_total_num_tokens is not None:
            data["swa_max_total_num_tokens"] = self.swa_max_total_num_tokens
        return data


@dataclass(frozen=True)
class ServerInfo:
    """``/server_info`` read once: the effective limits per data-parallel rank, and the server's version.

    The top-level ``max_running_requests`` is the *requested* value: the cap that binds is each rank's
    ``internal_states[i].effective_max_running_requests_per_dp`` (docs/sglang-memory-model.md §5.5).
    ``max_total_num_tokens`` comes from the top level (the scheduler's handshake) when present.
    """

    server: str
    ranks: tuple[RankLimits, ...]
    top_level_total_tokens: int | None
    context_length: int | None
    version: str | None
    # The simulated node (include/sglang_sim) adds internal_states[i]["sim"], its capacity model; SGLang
    # has no such key. A report built on such servers says its figures are simulated.
    simulated: bool = False

    @property
    def effective_max_running_requests(self) -> int:
        return sum(rank.max_running_requests or 0 for rank in self.ranks)

    @property
    def max_total_num_tokens(self) -> int | None:
        if self.top_level_total_tokens is not None:
            return self.top_level_total_tokens
        per_rank = [rank.max_total_num_tokens for rank in self.ranks]
        return None if None in per_rank else sum(per_rank)

    @property
    def max_mamba_cache_size(self) -> int | None:
        per_rank = [rank.max_mamba_cache_size for rank in self.ranks]
        return None if None in per_rank else sum(per_rank)

    def to_dict(self) -> dict:
        """The readiness result's limits (XCom): totals over the ranks, and each rank."""
        return {"effective_max_running_requests": self.effective_max_running_requests,
                "max_total_num_tokens": self.max_total_num_tokens, "max_mamba_cache_size": self.max_mamba_cache_size,
                "context_length": self.context_length, "version": self.version, "dp_ranks": len(self.ranks),
                **({"simulated": True} if self.simulated else {}),  # only the simulator's servers carry it
                "ranks": [rank.to_dict() for rank in self.ranks],
                "top_level_total_tokens": self.top_level_total_tokens}

    @classmethod
    def from_dict(cls, data: dict, *, server: str) -> ServerInfo:
        ranks = tuple(RankLimits(**rank) for rank in data.get("ranks") or ())
        return cls(server=server, ranks=ranks, top_level_total_tokens=data.get("top_level_total_tokens"),
                   context_length=data.get("context_length"), version=data.get("version"),
                   simulated=bool(data.get("simulated")))


def _int_or_none(value, *, server: str, field: str) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ServerError(f"/server_info {field} is not a number: {value!r}", server=server) from None


def parse_server_info(info: dict, *, server: str) -> ServerInfo:
    """``/server_info`` body -> ServerInfo; raises ServerError naming the server when it cannot be read."""
    states = info.get("internal_states") if isinstance(info, dict) else None
    if not isinstance(states, list) or not states:
        raise ServerError("/server_info has no internal_states: is this SGLang >= 0.5.15?", server=server,
                          hint="fleetgen reads effective_max_running_requests_per_dp from internal_states")
    ranks = []
    for index, state in enumerate(states):
        state = state if isinstance(state, dict) else {}
        where = f"internal_states[{index}]"
        memory = state.get("memory_usage") if isinstance(state.get("memory_usage"), dict) else {}
        requests = _int_or_none(state.get("effective_max_running_requests_per_dp"), server=server,
                                field=f"{where}.effective_max_running_requests_per_dp")
        if requests is None:
            raise ServerError(f"/server_info {where} lacks effective_max_running_requests_per_dp", server=server)
        ranks.append(RankLimits(
            max_running_requests=requests,
            max_total_num_tokens=_int_or_none(state.get("max_total_num_tokens"), server=server,
                                              field=f"{where}.max_total_num_tokens"),
            max_mamba_cache_size=_int_or_none(state.get("max_mamba_cache_size"), server=server,
                                              field=f"{where}.max_mamba_cache_size"),
            swa_max_total_num_tokens=_int_or_none(memory.get("token_capacity_swa"), server=server,
                                                  field=f"{where}.memory_usage.token_capacity_swa")))
    parsed = ServerInfo(
        server=server, ranks=tuple(ranks),
        top_level_total_tokens=_int_or_none(info.get("max_total_num_tokens"), server=server,
                                            field="max_total_num_tokens"),
        context_length=_int_or_none(info.get("context_length") or states[0].get("context_length"), server=server,
                                    field="context_length"),
        version=info.get("version"),
        simulated=any(isinstance(state, dict) and "sim" in state for state in states))
    if parsed.max_total_num_tokens is None:
        raise ServerError("/server_info has no max_total_num_tokens", server=server)
    return parsed


LOG_LINE_CHARS = 400  # SGLang's server_args line alone runs to thousands of characters


def format_log_excerpt(lines: list[str], limit: int = 50) -> str:
    tail = lines[-limit:]
    return "\n".join(f"    | {line[:LOG_LINE_CHARS]}{' …' if len(line) > LOG_LINE_CHARS else ''}" for line in tail)


# Values SGLang rewrites while resolving its arguments: (server_args field, value given) -> value reported.
# NEXTN is run as EAGLE (sglang/srt/arg_groups/speculative_hook.py).
_REPORTED_AS = {("speculative_algorithm", "NEXTN"): "EAGLE"}
# Flags SGLang accepts under a second name, and the field that name sets (sglang/srt/arg_groups/fields/model.py,
# parallel.py): /server_info names the field, not the alias.
_ALIAS_FIELDS = {"--model": "model_path", "--tensor-parallel-size": "tp_size", "--pipeline-parallel-size": "pp_size",
                 "--data-parallel-size": "dp_size", "--expert-parallel-size": "ep_size", "--ep": "ep_size",
                 "--attention-data-parallel-size": "attn_dp_size", "--enable-hicache": "enable_hierarchical_cache"}


def args_as_flags(args: list[str] | tuple[str, ...]) -> dict[str, object]:
    """``["--tp-size", "2", "--enable-metrics"]`` -> ``{"--tp-size": "2", "--enable-metrics": True}``."""
    flags: dict[str, object] = {}
    index = 0
    while index < len(args):
        word = args[index]
        if not word.startswith("--"):
            index += 1
            continue
        if "=" in word:
            name, value = word.split("=", 1)
            flags[name] = value
        elif index + 1 < len(args) and not args[index + 1].startswith("--"):
            flags[word] = args[index + 1]
            index += 1
        else:
            flags[word] = True
        index += 1
    return flags


def _same(field: str, expected: object, reported: object) -> bool:
    if isinstance(expected, str):
        expected = _REPORTED_AS.get((field, expected), expected)
    if expected is True or isinstance(reported, bool):
        return reported is True if expected is True else str(expected).lower() == str(reported).lower()
    try:
        return math.isclose(float(expected), float(reported), rel_tol=1e-9, abs_tol=1e-9)
    except (TypeError, ValueError):
        return str(expected) == str(reported)


def flag_field(flag: str) -> str:
    """The ``/server_info`` field a launch flag sets: ``--max-running-requests`` -> ``max_running_requests``."""
    return _ALIAS_FIELDS.get(flag) or flag.lstrip("-").replace("-", "_")


# What a launch is known by besides its planned flags: the checkpoint it loaded, the launch identity fleetgen
# gave it (nodes/launch_identity.py's field), and its start-up durations in seconds (load_weight, kv_cache_allocation,
# ...; sglang/srt/observability/startup_time.py), set once when it started, so a restart with the very same command
# line reads otherwise. SGLang reports every server-args field in /server_info (sglang/srt/utils/common.py
# build_server_info: server_args.resolved_dict()) and startup_time beside them (entrypoints/http_server.py).
LAUNCH_FIELDS = ("model_path", launch_identity.FIELD, "startup_time")


def launch_fields(info: dict, flags: dict[str, object]) -> dict[str, object]:
    """What identifies the launch behind a ``/server_info`` body, as it reported it: its model path, its launch
    identity and the field of every flag the plan set (``max_running_requests``, ``mem_fraction_static``, ...)."""
    names = LAUNCH_FIELDS + tuple(flag_field(flag) for flag in sorted(flags))
    return {name: info.get(name) for name in dict.fromkeys(names)}


def launch_changes(read: dict[str, object], info: dict) -> list[str]:
    """How a fresh ``/server_info`` differs from the launch read earlier (``launch_fields``); empty when it is
    the same launch. Each line names the field, what was read then and what the server reports now."""
    return [f"{name}: read {value!r}, now {info.get(name)!r}" for name, value in read.items()
            if info.get(name) != value]


def launch_differences(info: dict, expected_flags: dict[str, object], *, expected_version: str | None) -> list[str]:
    """How a running server's ``/server_info`` differs from tonight's launch flags (every flag of the
    launch command, model path included) and from the SGLang version installed on its node; empty when
    the server runs exactly tonight's plan."""
    differences = []
    for flag, expected in expected_flags.items():
        field = flag_field(flag)
        if field not in info:
            differences.append(f"{flag}: the server does not report {field}")
        elif not _same(field, expected, info[field]):
            differences.append(f"{flag}: running {info[field]!r}, tonight {expected!r}")
    if expected_version is not None and info.get("version") != expected_version:
        differences.append(f"version: running {info.get('version')!r}, installed {expected_version!r}")
    return differences
