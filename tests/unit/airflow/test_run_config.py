"""The run configuration: DAG params read once into typed groups, each value checked with its name."""

import re
from pathlib import Path

import pytest

from fleetgen.airflow.run_config import RunConfig
from fleetgen.errors import ConfigError

DEFAULTS = {spec.name: spec.default_value() for spec in RunConfig.settings()}
PARAMS = {**DEFAULTS, "fleet_file": "", "prompts_path": "~/p.jsonl", "output_root": "/out"}


def test_params_become_typed_groups_and_domain_objects(monkeypatch):
    monkeypatch.setenv("FLEETGEN_OUTPUT_ROOT", "/out")
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
    assert checked == 20


def test_a_choice_the_form_offers_is_one_the_run_accepts():
    from fleetgen.airflow.params import dag_params

    form = dag_params()
    for name in ("tuning", "reuse_completions", "tuning_trial_relaunch"):
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


# Every numeric parameter: (default, lowest accepted, highest accepted, whether the low end itself is refused).
NUMERIC_DECLARATIONS = {
    "memory_margin_mib": (1024, 0, 65536, False), "max_running_requests": (0, 0, 4096, False),
    "context_length": (0, 0, 1 << 20, False), "ready_timeout_s": (1800, 10, 7200, False),
    "max_cap_cut_factor": (0.0, 0, 1000, False),
    "tuning_trial_share": (0.03, 0, 0.5, True), "tuning_trial_min_gain": (0.03, 0, 1, False),
    "tuning_trial_window_s": (60.0, 1, 3600, False),
    "tuning_trial_max_s": (1800.0, 0, 86400, False),
    "max_tokens": (4096, 1, 262144, False), "temperature": (0.6, 0, 2, False), "top_p": (0.95, 0, 1, True),
    "shard_size": (5000, 1, 10_000_000, False), "parallel_shards": (0, 0, 16, False),
    "headroom": (1.25, 1, 4, False), "sample_interval_s": (5.0, 0, 300, False),
    "max_length_share": (0.2, 0, 1, False), "min_reasoning_share": (0.9, 0, 1, False),
    "max_empty_answer_share": (0.2, 0, 1, False), "max_error_share": (0.01, 0, 1, False),
}


def _specs():
    # Read in each test, not at import: mutation runs import the module once, before a mutant is chosen.
    return {spec.name: spec for spec in RunConfig.settings()}


@pytest.mark.parametrize("name", NUMERIC_DECLARATIONS)
def test_each_number_has_its_declared_default_and_exact_bounds(name):
    default, low, high, low_open = NUMERIC_DECLARATIONS[name]
    spec = _specs()[name]
    assert (spec.default_value(), spec.low, spec.high, spec.low_open) == (default, low, high, low_open)
    step = 1 if spec.kind is int else 1e-6
    accepted = [high, low + step] + ([] if low_open else [low])
    for value in accepted:
        assert RunConfig.from_params({**PARAMS, name: value}).to_dict()[_group_of(name)][_attribute_of(name)] == value
    for value in [high + step, low - step] + ([low] if low_open else []):
        with pytest.raises(ConfigError, match=f"DAG parameter {name} must be"):
            RunConfig.from_params({**PARAMS, name: value})


def _group_of(name):
    from fleetgen.airflow.run_config import Generation, Inputs, Thresholds, Tuning

    groups = {Inputs: "inputs", Tuning: "tuning", Generation: "generation", Thresholds: "validation"}
    return next(key for group, key in groups.items() if name in {spec.name for _, spec in group.settings()})


def _attribute_of(name):
    """The group field a parameter fills (``tuning`` fills ``mode``, ``tuning_trial_share`` ``trial_share``)."""
    from fleetgen.airflow.run_config import GROUPS

    return next(attribute for group in GROUPS for attribute, spec in group.settings() if spec.name == name)


def test_the_declared_numbers_are_every_number_of_the_form():
    assert {name for name, spec in _specs().items() if spec.kind in (int, float)} == set(NUMERIC_DECLARATIONS)


@pytest.mark.parametrize("name", NUMERIC_DECLARATIONS)
@pytest.mark.parametrize("value", [True, False])
def test_json_true_or_false_is_not_a_number(name, value):
    with pytest.raises(ConfigError) as caught:
        RunConfig.from_params({**PARAMS, name: value})
    assert caught.value.message.endswith(f", got {value!r}")
    assert caught.value.hint == f"set {name} in the trigger form or the run's conf"


@pytest.mark.parametrize("value", ["4096", None, float("inf"), [4096]])
def test_a_number_of_another_type_is_refused_with_what_was_sent(value):
    with pytest.raises(ConfigError) as caught:
        RunConfig.from_params({**PARAMS, "max_tokens": value})
    assert caught.value.message == f"DAG parameter max_tokens must be an integer from 1 to 262,144, got {value!r}"


def test_an_infinite_number_is_refused_even_where_there_is_no_finite_bound_to_pass():
    with pytest.raises(ConfigError, match="DAG parameter temperature must be a number from 0 to 2, got -inf"):
        RunConfig.from_params({**PARAMS, "temperature": float("-inf")})


def test_a_whole_number_where_a_fraction_is_allowed_is_read_as_a_float():
    config = RunConfig.from_params({**PARAMS, "headroom": 2, "top_p": 1, "max_error_share": 0})
    assert (config.generation.headroom, config.generation.top_p, config.validation.max_error_share) == (2.0, 1.0, 0.0)
    assert all(isinstance(v, float) for v in (config.generation.headroom, config.generation.top_p,
                                              config.validation.max_error_share))
    assert type(config.generation.max_tokens) is int


def test_the_bounds_read_in_words_with_thousands_separated():
    assert _specs()["shard_size"].allowed() == "1 to 10,000,000"
    assert _specs()["top_p"].allowed() == "more than 0, at most 1"
    assert _specs()["reuse_completions"].allowed() == "one of scheduled, always, never"
    with pytest.raises(ConfigError) as caught:
        RunConfig.from_params({**PARAMS, "top_p": 1.5})
    assert caught.value.message == "DAG parameter top_p must be a number from more than 0, at most 1, got 1.5"


def test_each_threshold_reaches_its_own_place_in_the_validation():
    config = RunConfig.from_params({**PARAMS, "max_tokens": 512, "max_length_share": 0.11,
                                    "min_reasoning_share": 0.22, "max_empty_answer_share": 0.33,
                                    "max_error_share": 0.44})
    validation = config.validation
    assert (validation.max_tokens, validation.max_length_share, validation.min_reasoning_share,
            validation.max_empty_answer_share, validation.max_error_share) == (512, 0.11, 0.22, 0.33, 0.44)


def test_each_tuning_choice_reaches_the_tuners_bounds():
    config = RunConfig.from_params({**PARAMS, "memory_margin_mib": 0, "max_running_requests": 1,
                                    "context_length": 1, "bf16_ssm_state": True, "no_buffer_radix": True,
                                    "tuning": "sglang_defaults", "ready_timeout_s": 10})
    bounds = config.tuning.bounds()
    assert (bounds.margin_mib, bounds.max_running_requests, bounds.context_length, bounds.bf16_ssm_state,
            bounds.no_buffer_radix, bounds.mode) == (0, 1, 1, True, True, "sglang_defaults")
    assert config.tuning.ready_timeout_s == 10
    defaults = RunConfig.from_params(PARAMS).tuning.bounds()
    assert (defaults.margin_mib, defaults.bf16_ssm_state, defaults.no_buffer_radix, defaults.mode) == (
        1024, False, False, "tuned")


def test_each_switch_and_text_reaches_its_group():
    config = RunConfig.from_params({**PARAMS, "dry_run": True, "relaunch_servers": True, "keep_servers_up": False,
                                    "fleet_file": "  /etc/fleet.yaml ", "output_root": " ~/out ",
                                    "prompts_path": "/p.jsonl", "weights_hash": "full", "reuse_completions": "never",
                                    "parallel_shards": 3, "shard_size": 7, "sample_interval_s": 0,
                                    "temperature": 0, "top_p": 0.5, "headroom": 4})
    inputs, generation = config.inputs, config.generation
    assert (inputs.dry_run, inputs.relaunch_servers, inputs.keep_servers_up) == (True, True, False)
    assert inputs.fleet_file == "/etc/fleet.yaml" and inputs.output_root == Path("~/out").expanduser()
    assert inputs.prompts_path == Path("/p.jsonl")
    assert (generation.weights_hash, generation.reuse_completions, generation.parallel_shards,
            generation.shard_size, generation.sample_interval_s, generation.temperature, generation.top_p,
            generation.headroom) == ("full", "never", 3, 7, 0.0, 0.0, 0.5, 4.0)


def test_the_switches_default_to_a_normal_nightly_run():
    config = RunConfig.from_params(PARAMS)
    assert (config.inputs.dry_run, config.inputs.relaunch_servers, config.inputs.keep_servers_up) == (
        False, False, True)
    assert (config.tuning.bf16_ssm_state, config.tuning.no_buffer_radix) == (False, False)
    assert (config.generation.weights_hash, config.generation.reuse_completions) == ("header", "scheduled")


@pytest.mark.parametrize("value", [None, 3, "", "   "])
def test_a_required_text_must_be_a_non_empty_string(value):
    with pytest.raises(ConfigError) as caught:
        RunConfig.from_params({**PARAMS, "output_root": value})
    assert caught.value.message == f"DAG parameter output_root must be a non-empty string, got {value!r}"


@pytest.mark.parametrize("value, read", [(None, ""), ("", ""), ("  ", ""), (" f.yaml ", "f.yaml")])
def test_an_optional_text_may_be_empty_or_null(value, read):
    assert RunConfig.from_params({**PARAMS, "fleet_file": value}).inputs.fleet_file == read


def test_an_optional_text_must_still_be_text():
    with pytest.raises(ConfigError) as caught:
        RunConfig.from_params({**PARAMS, "fleet_file": 3})
    assert caught.value.message == "DAG parameter fleet_file must be a string, got 3"


@pytest.mark.parametrize("name, value", [("dry_run", 1), ("keep_servers_up", "true"), ("relaunch_servers", None)])
def test_a_switch_must_be_true_or_false_not_one_or_a_word(name, value):
    with pytest.raises(ConfigError) as caught:
        RunConfig.from_params({**PARAMS, name: value})
    assert caught.value.message == f"DAG parameter {name} must be true or false, got {value!r}"


def test_a_choice_is_matched_exactly():
    for value in (" tuned", "Tuned", None):
        with pytest.raises(ConfigError, match="DAG parameter tuning must"):
            RunConfig.from_params({**PARAMS, "tuning": value})
    with pytest.raises(ConfigError) as caught:
        RunConfig.from_params({**PARAMS, "weights_hash": "sampled"})
    assert caught.value.message == "DAG parameter weights_hash must be one of header, full, got 'sampled'"


def test_missing_parameters_are_named_in_order():
    params = {k: v for k, v in PARAMS.items() if k not in ("top_p", "dry_run", "max_tokens")}
    with pytest.raises(ConfigError) as caught:
        RunConfig.from_params(params)
    assert caught.value.message == "DAG parameter(s) missing: dry_run, max_tokens, top_p"
    assert RunConfig.param_names() == frozenset(_specs()) and len(_specs()) == 38


def test_unknown_parameters_are_refused_before_missing_ones_with_how_to_fix():
    with pytest.raises(ConfigError) as caught:
        RunConfig.from_params({"zeta": 1, "alpha": 2})
    assert caught.value.message.startswith("unknown DAG parameter(s) alpha, zeta; valid ones: bf16_ssm_state, context_length, dry_run,")
    assert caught.value.hint == "fix the names in the run's conf"


def test_a_default_read_from_the_deployment_is_read_each_time(monkeypatch):
    monkeypatch.setenv("FLEETGEN_PROMPTS_PATH", "/a.jsonl")
    monkeypatch.setenv("FLEETGEN_OUTPUT_ROOT", "/runs")
    assert (_specs()["prompts_path"].default_value(), _specs()["output_root"].default_value()) == ("/a.jsonl", "/runs")
    monkeypatch.delenv("FLEETGEN_PROMPTS_PATH")
    assert _specs()["prompts_path"].default_value() == "~/fleetgen/prompts.jsonl"
    assert _specs()["fleet_file"].default_value() is None and _specs()["tuning"].default_value() == "tuned"


def test_the_form_reads_top_to_bottom_in_sections():
    assert list(_specs())[:8] == ["prompts_path", "output_root", "storage_conn_id", "dry_run", "fleet_file",
                                   "relaunch_servers", "keep_servers_up", "skip_unreachable_nodes"]
    assert [spec.section for spec in _specs().values()] == (
        ["Inputs"] * 8 + ["Tuning"] * 16 + ["Generation"] * 9 + ["Validation thresholds"] * 4 + ["Report"])


def test_the_configuration_as_a_dict_holds_every_group_with_paths_as_text():
    config = RunConfig.from_params({**PARAMS, "output_root": "/out", "prompts_path": "/p.jsonl"})
    as_dict = config.to_dict()
    assert as_dict["inputs"] == {"prompts_path": "/p.jsonl", "output_root": "/out", "storage_conn_id": "aws_default",
                                 "dry_run": False,
                                 "fleet_file": "", "relaunch_servers": False, "keep_servers_up": True,
                                 "skip_unreachable_nodes": False}
    assert as_dict["tuning"]["mode"] == "tuned" and as_dict["generation"]["shard_size"] == 5000
    assert as_dict["validation"]["max_tokens"] == 4096 and as_dict["validation"]["max_error_share"] == 0.01
    assert as_dict["report"] == {"gpu_hour_price": {}}
    assert set(as_dict) == {"inputs", "tuning", "generation", "validation", "report"}


def test_a_folder_is_not_a_prompts_file_and_is_named_a_folder(tmp_path):
    config = RunConfig.from_params({**PARAMS, "prompts_path": str(tmp_path)})
    with pytest.raises(ConfigError) as caught:
        config.inputs.require_prompts_file()
    assert str(caught.value) == (
        f"prompts file {tmp_path} is a folder, not a JSONL file: set the DAG parameter prompts_path in the trigger "
        f"form, or FLEETGEN_PROMPTS_PATH of the deployment for scheduled runs to the file itself")


@pytest.mark.parametrize("compress, name, tool", [
    ("gzip", "gzip", "gunzip -k"), ("bz2", "bzip2", "bunzip2 -k"), ("lzma", "xz", "unxz -k")])
def test_a_compressed_prompts_file_is_refused_saying_how_to_decompress_it(tmp_path, compress, name, tool):
    import importlib

    path = tmp_path / "prompts.jsonl.gz"
    path.write_bytes(importlib.import_module(compress).compress(b'{"id": "a", "prompt": "hi"}\n'))
    config = RunConfig.from_params({**PARAMS, "prompts_path": str(path)})
    with pytest.raises(ConfigError) as caught:
        config.inputs.require_prompts_file()
    assert str(caught.value) == (
        f"prompts file {path} is {name}-compressed and compressed input is not read: decompress it "
        f"(`{tool} {path}`), then set the DAG parameter prompts_path in the trigger form, or FLEETGEN_PROMPTS_PATH "
        f"of the deployment for scheduled runs to the decompressed JSONL")


def test_a_plain_prompts_file_named_gz_is_read_by_what_it_holds(tmp_path):
    path = tmp_path / "prompts.gz"
    path.write_text('{"id": "a", "prompt": "hi"}\n')
    RunConfig.from_params({**PARAMS, "prompts_path": str(path)}).inputs.require_prompts_file()


@pytest.mark.parametrize("name", ["prompts_path", "output_root"])
def test_a_path_under_the_home_of_an_unknown_user_is_a_config_error_naming_the_parameter(name):
    with pytest.raises(ConfigError) as caught:
        RunConfig.from_params({**PARAMS, name: "~nosuchuser-fleetgen/prompts.jsonl"})
    assert str(caught.value).startswith(
        f"DAG parameter {name} starts with ~nosuchuser-fleetgen, a user without a home directory on this worker, "
        f"got '~nosuchuser-fleetgen/prompts.jsonl'\nWhat to check next: set {name} in the trigger form or the run's "
        f"conf")
    assert ("FLEETGEN_PROMPTS_PATH" in str(caught.value)) == (name == "prompts_path")


def test_the_form_says_what_a_zero_means_where_zero_is_not_a_size():
    descriptions = {name: spec.description for name, spec in _specs().items()}
    assert "0 = no bound" in descriptions["max_running_requests"]
    assert "0 = prompt max + max_tokens" in descriptions["context_length"]
    assert descriptions["parallel_shards"].startswith("0 (auto)") and descriptions["sample_interval_s"].endswith("0: off.")
    assert all(isinstance(text, str) and text.strip() for text in descriptions.values())


# --- where a run may write: output_root inside the deployment's output root ----------------------------------------

RUN = "manual__2026-01-01T00:00:00+00:00"


@pytest.fixture
def deployment(tmp_path, monkeypatch):
    """The deployment's FLEETGEN_OUTPUT_ROOT (tmp/deployment) and a folder outside it (tmp/elsewhere)."""
    root, elsewhere = tmp_path / "deployment", tmp_path / "elsewhere"
    root.mkdir()
    elsewhere.mkdir()
    monkeypatch.setenv("FLEETGEN_OUTPUT_ROOT", str(root))
    monkeypatch.delenv("FLEETGEN_ALLOW_OUTPUT_ROOTS", raising=False)
    return root, elsewhere


def _layout(output_root) -> Path:
    return RunConfig.from_params({**PARAMS, "output_root": str(output_root)}).layout(RUN).root


HINT = ("trigger the run without output_root (its default is FLEETGEN_OUTPUT_ROOT) or with a folder inside an allowed "
        "root; to let runs write elsewhere, an operator adds that root to FLEETGEN_ALLOW_OUTPUT_ROOTS in the workers' "
        "environment")


def test_an_output_root_outside_the_deployments_is_refused_naming_the_parameter_the_roots_and_the_setting(deployment):
    root, elsewhere = deployment
    with pytest.raises(ConfigError) as caught:
        _layout(elsewhere)
    assert caught.value.message == (f"DAG parameter output_root {elsewhere} lies outside the output roots runs may "
                                    f"write in: the deployment's FLEETGEN_OUTPUT_ROOT, {root}")
    assert caught.value.hint == HINT
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("inside", ["", "nightly", "team/a/b"])
def test_the_deployments_root_and_any_folder_inside_it_are_a_runs_to_write_in(deployment, inside):
    root, _ = deployment
    assert _layout(root / inside if inside else root) == (root / inside if inside else root) / \
        "manual__2026-01-01T00_00_00_00_00"


def test_dot_dot_and_a_symlink_inside_the_root_do_not_lead_out(deployment):
    root, elsewhere = deployment
    (root / "away").symlink_to(elsewhere)
    (root / "here").symlink_to(root / "nightly", target_is_directory=True)
    for escape in (f"{root}/../elsewhere", root / "away", root / "away" / "deeper"):
        with pytest.raises(ConfigError, match=re.escape(f"(it leads to {elsewhere}")):
            _layout(escape)
    assert _layout(root / "here").parent == root / "here"  # a symlink that stays inside is the run's to use


def test_a_run_folder_that_is_a_symlink_leading_out_is_refused(deployment):
    root, elsewhere = deployment
    (root / "manual__2026-01-01T00_00_00_00_00").symlink_to(elsewhere)
    with pytest.raises(ConfigError) as caught:
        _layout(root)
    assert caught.value.message == (
        f"the folder {root}/manual__2026-01-01T00_00_00_00_00 of run {RUN} (it leads to {elsewhere}) lies outside "
        f"the output roots runs may write in: the deployment's FLEETGEN_OUTPUT_ROOT, {root}")


def test_a_home_relative_output_root_is_judged_where_it_leads(deployment, tmp_path, monkeypatch):
    root, elsewhere = deployment
    monkeypatch.setenv("HOME", str(tmp_path))
    assert _layout("~/deployment/x").parent == root / "x"
    with pytest.raises(ConfigError, match=f"output_root {re.escape(str(elsewhere))} lies outside"):
        _layout("~/elsewhere")


def test_a_deployment_root_reached_through_a_symlink_allows_its_real_folder_too(deployment, tmp_path, monkeypatch):
    root, _ = deployment
    (tmp_path / "link").symlink_to(root)
    monkeypatch.setenv("FLEETGEN_OUTPUT_ROOT", str(tmp_path / "link"))
    assert _layout(root / "x").parent == root / "x" and _layout(tmp_path / "link").parent == tmp_path / "link"


def test_an_operator_lists_other_roots_runs_may_write_in(deployment, tmp_path, monkeypatch):
    root, elsewhere = deployment
    scratch = tmp_path / "scratch"
    monkeypatch.setenv("FLEETGEN_ALLOW_OUTPUT_ROOTS", f"{elsewhere}:  :{scratch}")
    assert _layout(elsewhere / "x").parent == elsewhere / "x" and _layout(scratch).parent == scratch
    with pytest.raises(ConfigError) as caught:
        _layout(tmp_path / "other")
    assert caught.value.message.endswith(f"the deployment's FLEETGEN_OUTPUT_ROOT, {root}, and what "
                                         f"FLEETGEN_ALLOW_OUTPUT_ROOTS lists: {elsewhere}, {scratch}")


def test_a_relative_root_in_the_operators_list_is_refused_naming_the_setting(deployment, monkeypatch):
    root, _ = deployment
    monkeypatch.setenv("FLEETGEN_ALLOW_OUTPUT_ROOTS", "runs")
    with pytest.raises(ConfigError) as caught:
        _layout(root)
    assert str(caught.value) == ("FLEETGEN_ALLOW_OUTPUT_ROOTS of the worker's environment names 'runs', which is no "
                                 "folder runs may write in: not an absolute path\nWhat to check next: set "
                                 "FLEETGEN_ALLOW_OUTPUT_ROOTS of the deployment to absolute paths separated by ':'")


def test_without_a_deployment_root_runs_write_under_the_default_one_only(tmp_path, monkeypatch):
    monkeypatch.delenv("FLEETGEN_OUTPUT_ROOT", raising=False)
    monkeypatch.delenv("FLEETGEN_ALLOW_OUTPUT_ROOTS", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert _layout("~/fleetgen-output").parent == tmp_path / "fleetgen-output"
    default_root = f"the deployment's FLEETGEN_OUTPUT_ROOT, {tmp_path}/fleetgen-output"
    with pytest.raises(ConfigError, match=re.escape(default_root)):
        _layout(tmp_path / "out")


def test_the_tuning_trial_is_on_by_default_with_no_candidates_of_the_users():
    config = RunConfig.from_params(PARAMS)
    assert (config.tuning.trial, config.tuning.candidates, config.tuning.trial_share, config.tuning.trial_min_gain,
            config.tuning.trial_window_s) == (True, [], 0.03, 0.03, 60.0)
    assert config.tuning.listed_candidates() == []
    assert _specs()["tuning_candidates"].default_value() is not _specs()["tuning_candidates"].default_value()


def test_the_users_candidates_are_read_and_a_bad_one_stops_the_run_naming_its_entry():
    listed = [{"name": "bf16", "flags": {"--mamba-ssm-dtype": "bfloat16"}}]
    config = RunConfig.from_params({**PARAMS, "tuning_candidates": listed})
    assert [c.name for c in config.tuning.listed_candidates()] == ["bf16"]
    assert config.to_dict()["tuning"]["candidates"] == listed
    with pytest.raises(ConfigError, match=r"DAG parameter tuning_candidates must be a list, got"):
        RunConfig.from_params({**PARAMS, "tuning_candidates": {"name": "x"}})
    with pytest.raises(ConfigError, match=r"tuning_candidates\[1\] \(b\) sets --port, which the launch decides"):
        RunConfig.from_params({**PARAMS, "tuning_candidates": listed + [{"name": "b", "flags": {"--port": 1}}]})


def test_the_form_edits_the_candidates_as_a_list_of_objects():
    from airflow.sdk.definitions.param import ParamValidationError

    from fleetgen.airflow.params import dag_params

    form = dag_params()["tuning_candidates"]
    assert form.schema["type"] == "array" and form.schema["items"] == {"type": "object"}
    assert form.resolve([{"name": "a", "flags": {"--page-size": 64}}]) == [{"name": "a", "flags": {"--page-size": 64}}]
    with pytest.raises(ParamValidationError):
        form.resolve(["--page-size 64"])


def test_gpu_hour_prices_are_read_by_gpu_name_and_empty_by_default_which_prices_nothing():
    config = RunConfig.from_params(PARAMS)
    assert config.report.prices().priced is False and config.report.prices().of("NVIDIA B200") is None
    assert _specs()["gpu_hour_price"].default_value() == {}
    assert _specs()["gpu_hour_price"].default_value() is not _specs()["gpu_hour_price"].default_value()
    priced = RunConfig.from_params({**PARAMS, "gpu_hour_price": {
        "currency": " EUR ", "per_gpu_hour": {"NVIDIA B200": 6, " NVIDIA H100 80GB HBM3 ": 2.5}}}).report.prices()
    assert (priced.currency, priced.of("NVIDIA B200"), priced.of("NVIDIA H100 80GB HBM3")) == ("EUR", 6.0, 2.5)
    assert priced.of("NVIDIA H100") is None and priced.unused(["NVIDIA B200"]) == ["NVIDIA H100 80GB HBM3"]


@pytest.mark.parametrize("value, message", [
    ([6.25], r"gpu_hour_price must be an object, got \[6.25\]"),
    ({"currency": "USD", "per_gpu_hour": {"NVIDIA B200": 6}, "per_hour": 1}, r"unknown key\(s\) 'per_hour'"),
    ({"currency": "USD"}, r"per_gpu_hour must be a non-empty object of GPU name to price per GPU-hour, got None"),
    ({"currency": "USD", "per_gpu_hour": {}}, r"per_gpu_hour must be a non-empty object"),
    ({"per_gpu_hour": {"NVIDIA B200": 6}}, r"currency must be a non-empty text of at most 16 characters .*got None"),
    ({"currency": "  ", "per_gpu_hour": {"NVIDIA B200": 6}}, r"currency must be a non-empty text"),
    ({"currency": "USD", "per_gpu_hour": {"NVIDIA B200": -1}},
     r"per_gpu_hour entry 'NVIDIA B200' must be a price per GPU-hour from 0 to 1,000,000, got -1"),
    ({"currency": "USD", "per_gpu_hour": {"NVIDIA B200": "6"}}, r"entry 'NVIDIA B200' must be a price .*got '6'"),
    ({"currency": "USD", "per_gpu_hour": {"NVIDIA B200": True}}, r"entry 'NVIDIA B200' must be a price .*got True"),
    ({"currency": "USD", "per_gpu_hour": {"NVIDIA B200": float("inf")}}, r"entry 'NVIDIA B200' must be a price"),
    ({"currency": "USD", "per_gpu_hour": {" ": 6}}, r"per_gpu_hour has an entry without a GPU name: ' '"),
    ({"currency": "USD", "per_gpu_hour": {"NVIDIA B200": 6, "NVIDIA B200 ": 7}}, r"names 'NVIDIA B200' twice"),
])
def test_a_bad_gpu_hour_price_stops_the_run_naming_the_parameter_and_the_entry(value, message):
    with pytest.raises(ConfigError, match=message) as caught:
        RunConfig.from_params({**PARAMS, "gpu_hour_price": value})
    assert caught.value.message.startswith("DAG parameter gpu_hour_price ")
    assert "set gpu_hour_price in the trigger form or the run's conf" in caught.value.hint


def test_the_form_edits_the_gpu_hour_prices_as_an_object():
    from airflow.sdk.definitions.param import ParamValidationError

    from fleetgen.airflow.params import dag_params

    form = dag_params()["gpu_hour_price"]
    assert form.schema == {"title": "GPU-hour prices", "section": "Report", "type": "object"} and form.value == {}
    with pytest.raises(ParamValidationError):
        form.resolve([{"NVIDIA B200": 6}])


def test_an_object_output_root_must_lie_in_a_prefix_the_deployment_allows(monkeypatch):
    from fleetgen.airflow.run_config import allowed_object_roots, allowed_output_roots, check_object_root
    from fleetgen.storage.location import parse_location

    monkeypatch.setenv("FLEETGEN_OUTPUT_ROOT", "s3://bucket/runs")
    monkeypatch.setenv("FLEETGEN_ALLOW_OUTPUT_ROOTS", "/scratch/runs:s3://other/night:  ")
    assert [root.url for root in allowed_object_roots()] == ["s3://bucket/runs", "s3://other/night"]
    assert allowed_output_roots() == (Path("/scratch/runs"),)  # the URLs are no folders
    for allowed in ("s3://bucket/runs", "s3://bucket/runs/team-a", "s3://other/night/x"):
        check_object_root(parse_location(allowed, parameter="output_root"), "manual__1")
    for refused in ("s3://bucket/runs2", "s3://bucket", "s3://third/runs", "s3://other/nightly"):
        with pytest.raises(ConfigError, match="lies outside the object store prefixes runs may write in: "
                                              "s3://bucket/runs, s3://other/night") as caught:
            check_object_root(parse_location(refused, parameter="output_root"), "manual__1")
        assert caught.value.message.startswith(f"DAG parameter output_root {refused} ")
    with pytest.raises(ConfigError, match="does not name a folder of its own"):
        check_object_root(parse_location("s3://bucket/runs", parameter="output_root"), "..")


def test_a_bucket_root_allows_every_prefix_of_that_bucket_and_a_local_deployment_allows_none(monkeypatch):
    from fleetgen.airflow.run_config import check_object_root
    from fleetgen.storage.location import parse_location

    monkeypatch.delenv("FLEETGEN_ALLOW_OUTPUT_ROOTS", raising=False)
    monkeypatch.setenv("FLEETGEN_OUTPUT_ROOT", "s3://bucket")
    check_object_root(parse_location("s3://bucket/any/where", parameter="output_root"), "manual__1")
    monkeypatch.setenv("FLEETGEN_OUTPUT_ROOT", "/var/fleetgen")
    with pytest.raises(ConfigError, match=r"runs may write in: none \(neither variable names an s3:// URL\)"):
        check_object_root(parse_location("s3://bucket/runs", parameter="output_root"), "manual__1")


def test_prompts_and_output_root_take_object_urls_and_the_connection_that_reaches_them():
    from fleetgen.storage.location import ObjectLocation

    config = RunConfig.from_params({**PARAMS, "prompts_path": "s3://in/p.jsonl", "output_root": "s3://out/runs",
                                    "storage_conn_id": "minio"})
    assert config.inputs.prompts_path == ObjectLocation("s3", "in", "p.jsonl")
    assert config.inputs.output_root == ObjectLocation("s3", "out", "runs")
    assert config.inputs.storage_conn_id == "minio"
    assert config.to_dict()["inputs"]["output_root"] == "s3://out/runs"
    config.inputs.require_prompts_file()  # looked up through the store by the task that reads it
    with pytest.raises(ConfigError, match="gs:// is not served yet"):
        RunConfig.from_params({**PARAMS, "output_root": "gs://out/runs"})
