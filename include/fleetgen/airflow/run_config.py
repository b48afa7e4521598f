"""The run configuration: every DAG parameter declared once, read once into typed groups.

Each parameter is one annotated field of a group below (``Inputs``, ``Tuning``, ``Generation``,
``Thresholds``): its ``setting(...)`` gives the trigger form's title, section, description, default, bounds
and choices, and the same declaration checks the value a run receives. ``fleetgen.airflow.params`` turns the
declarations into the DAG's ``Param``s; nothing else states a bound or a choice (SGLang's ``ServerArgs``,
one field per flag, is the model). No Airflow import: the params arrive as a plain mapping.

Adding a parameter:
1. add a field with ``setting(...)`` to the group it belongs to, in the order the form should show it;
2. use it where it matters (through ``RunConfig``: ``config.generation.<name>``);
3. if a run's results depend on it, say so where the reuse key is built (``generation_key``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from fleetgen.errors import ConfigError
from fleetgen.json_types import is_json_int, is_json_number
from fleetgen.outputs import OUTPUT_ROOT_VARIABLE, RunLayout, default_output_root, run_folder_name
from fleetgen.report.prices import GpuHourPrice, read_gpu_hour_price
from fleetgen.storage.location import (DEFAULT_STORAGE_CONN_ID, STORAGE_CONN_PARAMETER, STORAGE_CONN_VARIABLE,
                                       Location, ObjectLocation, default_storage_conn_id, is_object_location,
                                       parse_location)
from fleetgen.tuning import TunerBounds
from fleetgen.tuning.model_files import WEIGHTS_HASHES
from fleetgen.tuning.plan import MODES
from fleetgen.tuning.relaunch_payoff import POLICIES as RELAUNCH_POLICIES
from fleetgen.validation.thresholds import ValidationThresholds

INPUTS, TUNING, GENERATION, THRESHOLDS, REPORT = "Inputs", "Tuning", "Generation", "Validation thresholds", "Report"
PROMPTS_PATH_VARIABLE = "FLEETGEN_PROMPTS_PATH"
# reuse_completions: reuse on scheduled runs only (a person's manual run generates everything), always, never.
REUSE_MODES = ("scheduled", "always", "never")
# Roots besides the deployment's output root that an operator lets a run's output_root lie in, separated by
# os.pathsep as in PATH (docs/security-and-ssh.md §6); "/" lets a run write anywhere the worker may.
ALLOW_OUTPUT_ROOTS_VARIABLE = "FLEETGEN_ALLOW_OUTPUT_ROOTS"


@dataclass(frozen=True)
class Setting:
    """One DAG parameter: what the form shows and what a run accepts."""

    name: str
    kind: type                    # bool, int, float, str, Path, list (of JSON objects) or dict (a JSON object)
    default: Any                  # a value, or a callable read when the DAG is parsed (the deployment's env)
    title: str
    section: str
    description: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False        # low itself is refused (top_p > 0)
    choices: tuple[str, ...] = ()
    optional: bool = False        # a text the form may leave empty (null)
    env: str | None = None        # the deployment's environment variable its default comes from

    def default_value(self) -> Any:
        return self.default() if callable(self.default) else self.default

    def allowed(self) -> str:
        """The bounds in words, as the form's description and a refusal state them."""
        if self.choices:
            return f"one of {', '.join(self.choices)}"
        low = f"more than {self.low:,}" if self.low_open else f"{self.low:,}"
        return f"{low} to {self.high:,}" if not self.low_open else f"{low}, at most {self.high:,}"

    def read(self, params: Mapping[str, Any]) -> Any:
        """The checked value of this parameter in ``params``; a ConfigError names it and what it accepts."""
        value = params[self.name]
        if self.kind is list:  # its items are checked by the group that reads them
            if not isinstance(value, list):
                raise self._refuse("must be a list", value)
            return list(value)
        if self.kind is dict:  # its entries too
            if not isinstance(value, dict):
                raise self._refuse("must be an object", value)
            return dict(value)
        if self.kind is bool:
            if not isinstance(value, bool):
                raise self._refuse("must be true or false", value)
            return value
        if self.kind in (int, float):
            number = is_json_int(value) if self.kind is int else is_json_number(value)
            if not (number and (value > self.low if self.low_open else value >= self.low)
                    and value <= self.high):
                raise self._refuse(f"must be {'an integer' if self.kind is int else 'a number'} from "
                                   f"{self.allowed()}", value)
            return self.kind(value)
        if value is None and self.optional:  # the form sends null for an optional field left empty
            return ""
        if not isinstance(value, str) or (not self.optional and not value.strip()):
            raise self._refuse(f"must be {'a' if self.optional else 'a non-empty'} string", value)
        if self.choices and value not in self.choices:
            raise self._refuse(f"must be {self.allowed()}", value)
        return self._location(value.strip()) if self.kind is Path else value.strip()

    def _location(self, text: str) -> Location:
        """A local path (``~`` expanded) or an object store URL (storage/location.py)."""
        try:
            return parse_location(text, parameter=self.name)
        except RuntimeError:  # ~user of a user this worker does not know (pathlib's "Could not determine home")
            raise self._refuse(f"starts with {text.split('/', 1)[0]}, a user without a home directory on this "
                               f"worker", text) from None

    def where_to_set(self) -> str:
        """Where a run's value of this parameter comes from, as a hint says it."""
        deployment = f", or {self.env} of the deployment for scheduled runs" if self.env else ""
        return f"set {self.name} in the trigger form or the run's conf{deployment}"

    def _refuse(self, what: str, value: Any) -> ConfigError:
        return ConfigError(f"DAG parameter {self.name} {what}, got {value!r}", hint=self.where_to_set())


def setting(kind: type, default: Any, title: str, section: str, description: str, *, name: str | None = None,
            **limits: Any) -> Any:
    """A group field declaring its DAG parameter (the field's name unless ``name`` says otherwise)."""
    return field(metadata={"setting": (kind, default, title, section, description, name, limits)})


class _Group:
    """A group of parameters: its fields' ``setting`` declarations, read from the params in one call."""

    @classmethod
    def settings(cls) -> Iterator[tuple[str, Setting]]:
        for item in fields(cls):  # type: ignore[arg-type]
            kind, default, title, section, description, name, limits = item.metadata["setting"]
            yield item.name, Setting(name=name or item.name, kind=kind, default=default, title=title,
                                     section=section, description=description, **limits)

    @classmethod
    def from_params(cls, params: Mapping[str, Any]):
        return cls(**{attribute: spec.read(params) for attribute, spec in cls.settings()})


@dataclass(frozen=True)
class Inputs(_Group):
    prompts_path: Location = setting(
        Path, lambda: os.environ.get(PROMPTS_PATH_VARIABLE, "~/fleetgen/prompts.jsonl"), "Prompts JSONL", INPUTS,
        f"A JSONL of {{id, messages}} or {{id, prompt}}, one per line: a path on the workers or an s3://bucket/key URL "
        f"(read through {STORAGE_CONN_PARAMETER}). Default: ${PROMPTS_PATH_VARIABLE} of the deployment (scheduled "
        f"runs use it).", env=PROMPTS_PATH_VARIABLE)
    output_root: Location = setting(
        Path, default_output_root, "Output root", INPUTS,
        f"Each run writes to <output_root>/<run_id>/: a folder every worker sees, or an s3://bucket/prefix URL "
        f"(written through {STORAGE_CONN_PARAMETER}). Default: ${OUTPUT_ROOT_VARIABLE} of the deployment; "
        f"a run may name a folder inside it (or inside a root ${ALLOW_OUTPUT_ROOTS_VARIABLE} lists), and the results "
        f"view serves only runs of that root itself.")
    storage_conn_id: str = setting(
        str, default_storage_conn_id, "Object store connection", INPUTS,
        f"The Airflow aws connection that reaches the object store when prompts_path or output_root is an s3:// URL "
        f"(its extra's endpoint_url for any S3-compatible store). Unused on local disk. Default: "
        f"${STORAGE_CONN_VARIABLE} of the deployment, else {DEFAULT_STORAGE_CONN_ID}; the results view reads "
        f"through that one only.", name=STORAGE_CONN_PARAMETER, env=STORAGE_CONN_VARIABLE)
    dry_run: bool = setting(bool, False, "Dry run", INPUTS,
                            "Probe and print the plan, then stop: no server is touched.")
    fleet_file: str = setting(
        str, None, "Fleet file", INPUTS,
        "Path (on the Airflow worker) of the fleet YAML. Empty: the Airflow Variable 'fleetgen_fleet' holds it.",
        optional=True)
    relaunch_servers: bool = setting(
        bool, False, "Relaunch every server", INPUTS,
        "Stop and relaunch every server, even one already running tonight's plan (flags, model, SGLang version) "
        "that would otherwise be kept.")
    keep_servers_up: bool = setting(
        bool, True, "Keep servers up", INPUTS,
        "Leave the servers running after the run (a nightly job reuses them). Off: stop them at the end, whether "
        "the run succeeded or not.")
    skip_unreachable_nodes: bool = setting(
        bool, False, "Run on the reachable nodes", INPUTS,
        "A node whose SSH cannot be reached at probe time (after the probe's retries) is left out of tonight's "
        "plan and the run goes on with the others; the report lists it and why. Off: one unreachable node stops "
        "the run. A host key mismatch, a refused login or a missing key file always stops it.")

    def require_prompts_file(self) -> None:
        """A run (a scheduled one above all) whose prompts file is missing, a folder or compressed stops in its
        first task, with one line naming the setting, instead of failing later in scan_prompts."""
        from fleetgen.prompts.scan import compression_of

        path, where = self.prompts_path, (f"set the DAG parameter prompts_path in the trigger form, or "
                                          f"{PROMPTS_PATH_VARIABLE} of the deployment for scheduled runs")
        if is_object_location(path):  # looked up through the store by the task (airflow/run_storage.py)
            return
        if path.is_dir():
            raise ConfigError(f"prompts file {path} is a folder, not a JSONL file: {where} to the file itself")
        if not path.is_file():
            raise ConfigError(f"prompts file {path} not found on this worker: {where}")
        compression = compression_of(path)
        if compression is not None:
            name, tool = compression
            raise ConfigError(f"prompts file {path} is {name}-compressed and compressed input is not read: "
                              f"decompress it (`{tool} {path}`), then {where} to the decompressed JSONL")


@dataclass(frozen=True)
class Tuning(_Group):
    mode: str = setting(str, MODES[0], "Tuning", TUNING,
                        "'tuned': fleetgen sizes the pools; 'sglang_defaults': SGLang's automatic sizing.",
                        name="tuning", choices=MODES)
    memory_margin_mib: int = setting(
        int, 1024, "Memory margin (MiB)", TUNING,
        "Kept free on each GPU beyond SGLang's own reserve; more lowers --mem-fraction-static.", low=0, high=65536)
    max_running_requests: int = setting(
        int, 0, "Max running requests cap", TUNING,
        "Upper bound per server (--max-running-requests, --max-mamba-cache-size); 0 = no bound (the tuner "
        "decides).", low=0, high=4096)
    context_length: int = setting(int, 0, "Context length", TUNING,
                                  "--context-length; 0 = prompt max + max_tokens, rounded up.", low=0, high=1 << 20)
    bf16_ssm_state: bool = setting(bool, False, "bfloat16 SSM state", TUNING,
                                   "Halve Mamba state memory (--mamba-ssm-dtype bfloat16). Changes numerics.")
    no_buffer_radix: bool = setting(
        bool, False, "no_buffer radix strategy", TUNING,
        "--mamba-radix-cache-strategy no_buffer: 3 state slots per request instead of 5, no overlap scheduling.")
    pin_full_context_plan: bool = setting(
        bool, False, "Pin the full-context plan", TUNING,
        "KV for every running request at its full context (conservative). Off: size for the workload, one "
        "bounded step per run from the previous run's lengths, peak KV and retractions.")
    max_cap_cut_factor: float = setting(
        float, 0.0, "Max cap cut by one prompt", TUNING,
        "Set aside (into rejects.jsonl) a prompt whose request needs more than this many times the median request's "
        "tokens: the longest request sets every server's context, so one such prompt would cut every server's "
        "running requests by about that factor. 0: off (a prompt that cuts the caps is only warned about).",
        low=0, high=1000)
    ready_timeout_s: int = setting(int, 1800, "Readiness timeout (s)", TUNING,
                                   "How long a server may take to load before its wait fails.", low=10, high=7200)
    trial: bool = setting(
        bool, True, "Tuning trial", TUNING,
        "Try candidate configurations side by side on the fleet (speculative decoding off, one draft step fewer, "
        "the cap at 3/4 and 1/2, SGLang's own sizing, and tuning_candidates) on the first tuning_trial_share of "
        "the prompts, keep the fastest by measured output tokens/s per GPU and relaunch the other servers on it. "
        "Needs 3 servers or more and the tuned mode. Off: every server runs the fleet file's own flags.",
        name="tuning_trial")
    candidates: list = setting(
        list, list, "Trial candidates", TUNING,
        'More candidates for the trial, each {"name": "...", "flags": {"--flag": value, "--other": null}}: the '
        "fleet's server.extra_args with these flags set (null removes one). Only these may change numerics "
        "(--mamba-ssm-dtype, --kv-cache-dtype, --quantization).", name="tuning_candidates")
    trial_share: float = setting(
        float, 0.03, "Trial share of the prompts", TUNING,
        "The first prompts of the job, as a share of them, that the trial's servers generate (their completions are "
        "the job's) before the servers on losing configurations are relaunched on the winner.",
        name="tuning_trial_share", low=0, high=0.5, low_open=True)
    trial_min_gain: float = setting(
        float, 0.03, "Trial minimum gain", TUNING,
        "A challenger replaces the incumbent only if its median tokens/s per GPU beats the incumbent's by more than "
        "this share (and its lower bound the incumbent's upper bound).", name="tuning_trial_min_gain", low=0, high=1)
    trial_window_s: float = setting(
        float, 60.0, "Trial window (s)", TUNING,
        "The trial measures each server's output tokens/s over windows this long (steady state only; at least 3 "
        "per candidate); sample_interval_s must be shorter.", name="tuning_trial_window_s", low=1, high=3600)
    trial_max_s: float = setting(
        float, 1800.0, "Trial time cap (s)", TUNING,
        "The trial's servers start no more of its prompts this long after its first shard started; the prompts it "
        "left are generated on the winner with the rest of the job. Must hold a warm-up and 3 windows of "
        "tuning_trial_window_s. 0: only tuning_trial_share bounds the trial.", name="tuning_trial_max_s", low=0,
        high=86400)
    trial_relaunch: str = setting(
        str, RELAUNCH_POLICIES[0], "Trial relaunch", TUNING,
        "'when_it_pays': the servers on losing configurations are relaunched on the winner unless the trial measured "
        "that the round (every server waits for it) costs more than it gains over the rest of the job; 'always': "
        "relaunched whatever it costs.", name="tuning_trial_relaunch", choices=RELAUNCH_POLICIES)

    def __post_init__(self) -> None:
        self.listed_candidates()  # a bad entry stops the run at its first task, naming the entry

    def listed_candidates(self):
        """The candidates of ``tuning_candidates``, checked (fleetgen.tuning.candidates.user_candidates)."""
        from fleetgen.nodes.fleet import RESERVED_FLAGS
        from fleetgen.tuning.candidates import user_candidates

        return user_candidates(self.candidates, reserved=RESERVED_FLAGS)

    def bounds(self) -> TunerBounds:
        return TunerBounds(margin_mib=self.memory_margin_mib, max_running_requests=self.max_running_requests or None,
                           context_length=self.context_length or None, bf16_ssm_state=self.bf16_ssm_state,
                           no_buffer_radix=self.no_buffer_radix, mode=self.mode)


@dataclass(frozen=True)
class Generation(_Group):
    max_tokens: int = setting(int, 4096, "Max output tokens", GENERATION,
                              "max_tokens of every request; the tuner sizes KV for prompt + this.", low=1, high=262144)
    temperature: float = setting(float, 0.6, "Temperature", GENERATION,
                                 "Sampling temperature of every request (a prompt may override it).", low=0, high=2)
    top_p: float = setting(float, 0.95, "Top-p", GENERATION,
                           "Nucleus sampling threshold of every request (a prompt may override it).", low=0, high=1,
                           low_open=True)
    shard_size: int = setting(
        int, 5000, "Prompts per shard", GENERATION,
        "Prompts per generate_shard task; grown automatically when the shards would exceed Airflow's [core] "
        "max_map_length.", low=1, high=10_000_000)
    parallel_shards: int = setting(
        int, 0, "Shards at once", GENERATION,
        "0 (auto): running shards split every server's limit between them, recounted from their heartbeats. N: "
        "each shard always takes 1/N. How many run at once is set by the slots of the fleetgen_fleet pool.",
        low=0, high=16)
    headroom: float = setting(float, 1.25, "Queue headroom", GENERATION,
                              "In-flight per server = effective max_running_requests × this.", low=1, high=4)
    reuse_completions: str = setting(
        str, REUSE_MODES[0], "Reuse unchanged completions", GENERATION,
        "Copy a completion from the last successful run instead of generating it again when the prompt, the model "
        "(weights, config, generation config, tokenizer, chat template, SGLang version) and the sampling are "
        "unchanged. 'scheduled': on nightly runs, off for manual ones; 'always'; 'never'.", choices=REUSE_MODES)
    weights_hash: str = setting(
        str, WEIGHTS_HASHES[0], "Weights in the model identity", GENERATION,
        "How the model identity reads the weights on the node: 'header': each safetensors file's size, header and "
        "16 sampled blocks (well under a second); 'full': every byte too (minutes for tens of GB).",
        choices=WEIGHTS_HASHES)
    sample_interval_s: float = setting(
        float, 5.0, "Sampling interval (s)", GENERATION,
        "While generating, every server's /metrics and every node's nvidia-smi are sampled this often for the "
        "occupancy and GPU report; 0: off.", low=0, high=300)


    def reuses(self, run_type: str | None) -> bool:
        """Whether this run copies unchanged completions (``run_type``: Airflow's): ``scheduled`` reuses only
        on runs the schedule started, so a person's manual run generates everything."""
        mode = self.reuse_completions
        return mode == "always" or (mode == "scheduled" and run_type == "scheduled")


@dataclass(frozen=True)
class Thresholds(_Group):
    max_length_share: float = setting(float, 0.2, "Max share truncated (length)", THRESHOLDS,
                                      "Validation fails when more completions than this end by max_tokens.",
                                      low=0, high=1)
    min_reasoning_share: float = setting(float, 0.9, "Min share with reasoning", THRESHOLDS,
                                         "Validation fails when fewer completions carry a reasoning trace.",
                                         low=0, high=1)
    max_empty_answer_share: float = setting(float, 0.2, "Max share of empty answers", THRESHOLDS,
                                            "Validation fails when more completions have an empty answer.",
                                            low=0, high=1)
    max_error_share: float = setting(float, 0.01, "Max share of failed prompts", THRESHOLDS,
                                     "Validation fails when more prompts failed permanently (4xx).", low=0, high=1)


@dataclass(frozen=True)
class Report(_Group):
    gpu_hour_price: dict = setting(
        dict, dict, "GPU-hour prices", REPORT,
        'What one GPU-hour costs, by GPU name as nvidia-smi prints it: {"currency": "USD", "per_gpu_hour": '
        '{"NVIDIA B200": 6.03}}. The report then shows the run\'s cost and its cost per million output tokens, per '
        "server and per tuning trial candidate. Empty: GPU-hours only, no money.")

    def __post_init__(self) -> None:
        self.prices()  # a bad entry stops the run at its first task, naming the entry

    def prices(self) -> GpuHourPrice:
        """The checked prices of ``gpu_hour_price`` (fleetgen.report.prices)."""
        return read_gpu_hour_price(self.gpu_hour_price)


GROUPS: tuple[type[_Group], ...] = (Inputs, Tuning, Generation, Thresholds, Report)


def _listed_roots() -> list[str]:
    """The entries of ``FLEETGEN_ALLOW_OUTPUT_ROOTS``, split at ``os.pathsep`` except inside ``s3://``."""
    text = os.environ.get(ALLOW_OUTPUT_ROOTS_VARIABLE, "")
    return [entry.strip() for entry in re.split(f"{re.escape(os.pathsep)}(?!//)", text) if entry.strip()]


def _configured_roots() -> list[tuple[str, str]]:
    return [(OUTPUT_ROOT_VARIABLE, default_output_root()),
            *((ALLOW_OUTPUT_ROOTS_VARIABLE, entry) for entry in _listed_roots())]


def allowed_output_roots() -> tuple[Path, ...]:
    """The folders a run's ``output_root`` may lie in, resolved: the deployment's output root (the one the results
    view serves, ``outputs.default_output_root``), then each root ``FLEETGEN_ALLOW_OUTPUT_ROOTS`` of the worker's
    environment lists. A listed root that is not an absolute path is refused: it would depend on the worker's
    working folder. Object store roots are ``allowed_object_roots``'."""
    roots = []
    for variable, root in _configured_roots():
        if "://" in root and not root.startswith("file:"):
            continue
        try:
            path = Path(root).expanduser()
            if variable == ALLOW_OUTPUT_ROOTS_VARIABLE and not path.is_absolute():
                raise ValueError("not an absolute path")
            roots.append(path.resolve())
        except (OSError, RuntimeError, ValueError) as error:  # ~user unknown, a symlink loop, a relative path
            separated = f" separated by {os.pathsep!r}" if variable == ALLOW_OUTPUT_ROOTS_VARIABLE else ""
            raise ConfigError(f"{variable} of the worker's environment names {root!r}, which is no folder runs may "
                              f"write in: {error}", hint=f"set {variable} of the deployment to absolute "
                                                         f"paths{separated}") from None
    return tuple(dict.fromkeys(roots))


def allowed_object_roots() -> tuple[ObjectLocation, ...]:
    """The object store prefixes a run's ``output_root`` may lie in: ``FLEETGEN_OUTPUT_ROOT`` when it is an
    ``s3://`` URL, and each such URL ``FLEETGEN_ALLOW_OUTPUT_ROOTS`` lists."""
    return tuple(dict.fromkeys(
        parse_location(root, parameter=variable) for variable, root in _configured_roots()
        if "://" in root and not root.startswith("file:")))


def check_object_root(root: ObjectLocation, run_id: str) -> None:
    """Refuse an object ``output_root`` outside the allowed prefixes (``allowed_object_roots``), as ``run_layout``
    refuses a folder: whoever may trigger a run chooses it, and the workers write there with the deployment's
    connection. The run's own prefix is one plain name below it (``outputs.run_folder_name``)."""
    run_folder_name(run_id)
    allowed = allowed_object_roots()
    if any(root.scheme == prefix.scheme and root.bucket == prefix.bucket
           and (not prefix.key or root.key == prefix.key or root.key.startswith(prefix.key + "/"))
           for prefix in allowed):
        return
    where = ", ".join(map(str, allowed)) or "none (neither variable names an s3:// URL)"
    raise ConfigError(f"DAG parameter output_root {root} lies outside the object store prefixes runs may write in: "
                      f"{where}", hint=f"trigger the run without output_root (its default is {OUTPUT_ROOT_VARIABLE}) "
                                       f"or with a prefix inside an allowed one; to let runs write elsewhere, an "
                                       f"operator adds that s3:// URL to {ALLOW_OUTPUT_ROOTS_VARIABLE} in the "
                                       f"workers' environment")


def run_layout(output_root: str | Path, run_id: str) -> RunLayout:
    """The folder of run ``run_id`` under ``output_root``, once that folder is known to lie in an allowed root
    (``allowed_output_roots``): whoever may trigger a run chooses its ``output_root``, and the workers write there
    (and ``reuse_completions`` reads there) with their own rights. ``~``, ``..`` and symlinks are resolved before
    comparing, so neither they nor a run folder that is a symlink lead out. A refusal is a ConfigError naming
    ``output_root``, the root given, the allowed roots and the setting that allows more."""
    layout = RunLayout.for_run(output_root, run_id)
    allowed = allowed_output_roots()
    where = f"the deployment's {OUTPUT_ROOT_VARIABLE}, {allowed[0]}" + (
        f", and what {ALLOW_OUTPUT_ROOTS_VARIABLE} lists: {', '.join(map(str, allowed[1:]))}" if allowed[1:] else "")
    hint = (f"trigger the run without output_root (its default is {OUTPUT_ROOT_VARIABLE}) or with a folder inside an "
            f"allowed root; to let runs write elsewhere, an operator adds that root to {ALLOW_OUTPUT_ROOTS_VARIABLE} "
            f"in the workers' environment")
    for path, what in ((layout.root.parent, f"DAG parameter output_root {output_root}"),
                       (layout.root, f"the folder {layout.root} of run {run_id}")):
        try:
            resolved = path.resolve()
        except (OSError, RuntimeError) as error:  # a symlink loop
            raise ConfigError(f"{what} cannot be resolved ({error}), so it is not known to lie in an output root "
                              f"runs may write in ({where})", hint=hint) from None
        if not any(resolved.is_relative_to(root) for root in allowed):
            leads = f" (it leads to {resolved})" if resolved != path else ""
            raise ConfigError(f"{what}{leads} lies outside the output roots runs may write in: {where}", hint=hint)
    return layout


@dataclass(frozen=True)
class RunConfig:
    inputs: Inputs
    tuning: Tuning
    generation: Generation
    validation: ValidationThresholds
    report: Report

    @staticmethod
    def settings() -> list[Setting]:
        """Every DAG parameter, in the form's order."""
        return [spec for group in GROUPS for _, spec in group.settings()]

    @classmethod
    def param_names(cls) -> frozenset[str]:
        """Every DAG parameter a run reads; the DAG declares exactly these."""
        return frozenset(spec.name for spec in cls.settings())

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> RunConfig:
        """Validate and group the params; unknown keys (a typo in a REST trigger's conf) are refused."""
        known = cls.param_names()
        unknown = sorted(set(params) - known)
        if unknown:
            raise ConfigError(f"unknown DAG parameter(s) {', '.join(unknown)}; valid ones: {', '.join(sorted(known))}",
                              hint="fix the names in the run's conf")
        missing = sorted(known - set(params))
        if missing:
            raise ConfigError(f"DAG parameter(s) missing: {', '.join(missing)}")
        generation = Generation.from_params(params)
        validation = ValidationThresholds(max_tokens=generation.max_tokens,
                                          **asdict(Thresholds.from_params(params)))
        return cls(inputs=Inputs.from_params(params), tuning=Tuning.from_params(params), generation=generation,
                   validation=validation, report=Report.from_params(params))

    def layout(self, run_id: str) -> RunLayout:
        """The run's folder; refused unless ``output_root`` lies in an allowed root (``run_layout``). A run on an
        object store has its folder in the task's scratch copy (airflow/run_storage.py local_config)."""
        if is_object_location(self.inputs.output_root):
            raise ConfigError(f"the run's output_root {self.inputs.output_root} is on an object store: its tasks "
                              "run on a copy of it (airflow/run_storage.task_run)")
        return run_layout(self.inputs.output_root, run_id)

    def to_dict(self) -> dict:
        inputs = {item.name: getattr(self.inputs, item.name) for item in fields(self.inputs)}
        return {"inputs": {k: str(v) if isinstance(v, (Path, ObjectLocation)) else v for k, v in inputs.items()},
                "tuning": asdict(self.tuning), "generation": asdict(self.generation),
                "validation": asdict(self.validation), "report": asdict(self.report)}


