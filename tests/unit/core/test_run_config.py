"""The run configuration: DAG params read once into typed groups, each value checked with its name."""

from pathlib import Path

import pytest

from fleetgen.airflow.run_config import RunConfig
from fleetgen.errors import ConfigError

PARAMS = {"fleet_file": "", "prompts_path": "~/p.jsonl", "output_root": "/out", "dry_run": False,
          "keep_servers_up": True, "relaunch_servers": False, "sample_interval_s": 5.0, "reuse_completions": "scheduled", "tuning": "tuned", "memory_margin_mib": 1024, "max_running_requests": 0,
          "context_length": 0, "bf16_ssm_state": False, "no_buffer_radix": False, "ready_timeout_s": 1800,
          "pin_full_context_plan": False,
          "max_tokens": 4096, "temperature": 0.6, "top_p": 0.95, "shard_size": 5000, "parallel_shards": 0,
          "headroom": 1.25, "max_length_share": 0.2, "min_reasoning_share": 0.9, "max_empty_answer_share": 0.2,
          "max_error_share": 0.01}


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
    ("top_p", 0, r"top_p must be a number in \(0, 1\]"),
    ("headroom", 0.5, r"headroom must be a number in \[1, 4\]"),
    ("max_tokens", True, r"max_tokens must be an integer"),
    ("shard_size", 0, r"shard_size must be an integer in \[1, 10000000\]"),
    ("prompts_path", " ", r"prompts_path must be a non-empty string"),
    ("dry_run", "yes", r"dry_run must be true or false"),
    ("max_error_share", 1.5, r"max_error_share must be a number in \[0, 1\]"),
    ("tuning", "fast", r"tuning must be one of tuned, sglang_defaults"),
    ("pin_full_context_plan", "yes", r"pin_full_context_plan must be true or false"),
])
def test_each_bad_value_is_named(name, value, message):
    with pytest.raises(ConfigError, match=message):
        config = RunConfig.from_params({**PARAMS, name: value})
        config.tuning.bounds()


def test_the_dag_declares_exactly_the_params_a_run_reads():
    assert RunConfig.param_names() == frozenset(PARAMS)


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
