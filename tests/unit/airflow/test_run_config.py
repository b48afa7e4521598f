"""The run configuration: DAG params read once into typed groups, each value checked with its name."""

from pathlib import Path

import pytest

from fleetgen.airflow.run_config import RunConfig
from fleetgen.errors import ConfigError

DEFAULTS = {spec.name: spec.default_value() for spec in RunConfig.settings()}
PARAMS = {**DEFAULTS, "fleet_file": "", "prompts_path": "~/p.jsonl", "output_root": "/out"}


def test_params_become_typed_groups_and_domain_objects():
    config = RunConfig.from_params(PARAMS)
    assert config.inputs.prompts_path == Path("~/p.jsonl").expanduser()
    assert config.tuning.bounds().max_running_requests is None and config.tuning.bounds().context_length is None
    assert config.validation.max_tokens == 4096 and config.validation.max_error_share == 0.01
    assert config.layout("manual__2026-01-01T00:00:00+00:00").root == Path("/out/manual__2026-01-01T00_00_00_00_00")
    bounded = RunConfig.from_params({**PARAMS, "max_running_requests": 40, "context_length": 8192})
    assert (bounded.tuning.bounds().max_running_requests, bounded.tuning.bounds().context_length) == (40, 8192)
    assert config.tuning.pin_full_context_plan is False
    assert RunConfig.from_params({**PARAMS, "pin_full_context_plan": True}).tuning.pin_full_context_plan is True


def test_unknown_keys_are_refused_with_the_valid_ones():
    with pytest.raises(ConfigError, match=r"unknown DAG parameter\(s\) max_token, shardsize; valid ones: .*max_tokens"):
        RunConfig.from_params({**PARAMS, "max_token": 10, "shardsize": 3})


@pytest.mark.parametrize("name, value, message", [
    ("top_p", 0, r"top_p must be a number from more than 0, at most 1, got 0"),
    ("headroom", 0.5, r"headroom must be a number from 1 to 4, got 0.5"),
    ("max_tokens", True, r"max_tokens must be an integer"),
    ("max_tokens", 2.0, r"max_tokens must be an integer"),
    ("shard_size", 0, r"shard_size must be an integer from 1 to 10,000,000"),
    ("prompts_path", " ", r"prompts_path must be a non-empty string"),
    ("dry_run", "yes", r"dry_run must be true or false"),
    ("max_error_share", 1.5, r"max_error_share must be a number from 0 to 1"),
    ("temperature", float("nan"), r"temperature must be a number"),
    ("tuning", "fast", r"tuning must be one of tuned, sglang_defaults"),
    ("pin_full_context_plan", "yes", r"pin_full_context_plan must be true or false"),
])
def test_each_bad_value_is_named(name, value, message):
    with pytest.raises(ConfigError, match=message):
        config = RunConfig.from_params({**PARAMS, name: value})
        config.tuning.bounds()


def test_the_declared_defaults_make_a_valid_run():
    config = RunConfig.from_params(DEFAULTS)
    assert (config.tuning.mode, config.generation.reuse_completions, config.inputs.fleet_file) == (
        "tuned", "scheduled", "")
    assert config.validation.max_empty_answer_share == 0.2 and config.generation.max_tokens == 4096


def test_the_form_and_the_run_accept_and_refuse_the_same_values_at_every_bound():
    from fleetgen.airflow.params import dag_params
    from airflow.sdk.definitions.param import ParamValidationError

    form = dag_params()
    assert list(form) == [spec.name for spec in RunConfig.settings()]
    checked = 0
    for spec in RunConfig.settings():
        if spec.kind not in (int, float):
            continue
        step = 1 if spec.kind is int else 1e-9
        inside = [spec.high] + ([] if spec.low_open else [spec.low])
        outside = [spec.high + step, spec.low if spec.low_open else spec.low - step]
        for value in inside:
            form[spec.name].resolve(value)
            RunConfig.from_params({**PARAMS, spec.name: value})
        for value in outside:
            with pytest.raises(ParamValidationError):
                form[spec.name].resolve(value)
            with pytest.raises(ConfigError, match=f"DAG parameter {spec.name} "):
                RunConfig.from_params({**PARAMS, spec.name: value})
        checked += 1
    assert checked == 15


def test_a_choice_the_form_offers_is_one_the_run_accepts():
    from fleetgen.airflow.params import dag_params

    form = dag_params()
    for name in ("tuning", "reuse_completions"):
        for choice in form[name].schema["enum"]:
            RunConfig.from_params({**PARAMS, name: choice})
        with pytest.raises(ConfigError, match=f"DAG parameter {name} must be one of"):
            RunConfig.from_params({**PARAMS, name: "other"})


def test_an_empty_fleet_file_from_the_form_means_the_variable():
    assert RunConfig.from_params({**PARAMS, "fleet_file": None}).inputs.fleet_file == ""


def test_a_missing_prompts_file_fails_in_one_line_naming_the_setting(tmp_path):
    config = RunConfig.from_params({**PARAMS, "prompts_path": str(tmp_path / "absent.jsonl")})
    with pytest.raises(ConfigError) as caught:
        config.inputs.require_prompts_file()
    assert "\n" not in str(caught.value)
    assert "prompts_path" in str(caught.value) and "FLEETGEN_PROMPTS_PATH" in str(caught.value)
    (tmp_path / "absent.jsonl").write_text("")
    config.inputs.require_prompts_file()


@pytest.mark.parametrize("mode, run_type, reuses", [
    ("scheduled", "scheduled", True), ("scheduled", "manual", False), ("scheduled", None, False),
    ("always", "manual", True), ("never", "scheduled", False)])
def test_reuse_follows_the_mode_and_who_started_the_run(mode, run_type, reuses):
    assert RunConfig.from_params({**PARAMS, "reuse_completions": mode}).generation.reuses(run_type) is reuses
