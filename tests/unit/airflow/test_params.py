"""The DAG's Params: each declaration becomes the trigger form's field with its title, section, default and
bounds, and the form refuses what the run would refuse (JSON true for a number, an empty path)."""

from pathlib import Path

import pytest
from airflow.sdk.definitions.param import ParamValidationError

from fleetgen.airflow.params import dag_param, dag_params
from fleetgen.airflow.run_config import PROMPTS_PATH_VARIABLE, RunConfig, Setting


def _setting(kind, default, **limits):
    return Setting(name="x", kind=kind, default=default, title="X title", section="X section",
                   description="What x does.", **limits)


def test_an_integer_field_states_its_closed_bounds_in_the_schema_and_the_description():
    param = dag_param(_setting(int, 4, low=1, high=16))
    assert param.schema == {"title": "X title", "section": "X section", "type": "integer", "minimum": 1,
                            "maximum": 16}
    assert param.value == 4 and param.description == "What x does. Allowed: 1 to 16."


def test_a_number_open_at_its_low_end_refuses_the_low_end_itself():
    param = dag_param(_setting(float, 0.95, low=0, high=1, low_open=True))
    assert param.schema == {"title": "X title", "section": "X section", "type": "number", "exclusiveMinimum": 0,
                            "maximum": 1}
    assert param.description == "What x does. Allowed: more than 0, at most 1."
    with pytest.raises(ParamValidationError):
        param.resolve(0)
    assert param.resolve(1) == 1 and param.resolve(1e-9) == 1e-9


def test_a_choice_is_offered_as_its_list_and_nothing_else():
    param = dag_param(_setting(str, "b", choices=("a", "b")))
    assert param.schema == {"title": "X title", "section": "X section", "enum": ["a", "b"]}
    assert param.value == "b" and param.description == "What x does."


def test_a_text_or_path_may_not_be_empty_but_an_optional_text_may_be_null():
    for kind in (str, Path):
        param = dag_param(_setting(kind, "~/p.jsonl"))
        assert param.schema == {"title": "X title", "section": "X section", "type": "string", "minLength": 1}
        with pytest.raises(ParamValidationError):
            param.resolve("")
    optional = dag_param(_setting(str, None, optional=True))
    assert optional.schema == {"title": "X title", "section": "X section", "type": ["null", "string"]}
    assert optional.resolve(None) is None and optional.resolve("") == ""


def test_a_switch_is_a_boolean_with_no_length():
    param = dag_param(_setting(bool, True))
    assert param.schema == {"title": "X title", "section": "X section", "type": "boolean"}
    assert param.value is True and param.description == "What x does."


def test_a_default_read_from_the_deployment_is_read_when_the_dag_is_parsed(monkeypatch):
    monkeypatch.setenv(PROMPTS_PATH_VARIABLE, "/data/tonight.jsonl")
    assert dag_params()["prompts_path"].value == "/data/tonight.jsonl"
    monkeypatch.setenv(PROMPTS_PATH_VARIABLE, "/data/tomorrow.jsonl")
    assert dag_params()["prompts_path"].value == "/data/tomorrow.jsonl"


def test_the_form_has_every_parameter_once_in_the_declared_order():
    form = dag_params()
    assert list(form) == [spec.name for spec in RunConfig.settings()]
    assert set(form) == RunConfig.param_names()
    assert list(form)[:2] == ["prompts_path", "output_root"] and list(form)[-1] == "gpu_hour_price"


@pytest.mark.parametrize("name", [spec.name for spec in RunConfig.settings() if spec.kind in (int, float)])
def test_json_true_is_refused_where_a_number_is_expected_by_the_form_as_by_the_run(name):
    from fleetgen.errors import ConfigError

    with pytest.raises(ParamValidationError):
        dag_params()[name].resolve(True)
    params = {spec.name: spec.default_value() for spec in RunConfig.settings()}
    with pytest.raises(ConfigError, match=f"DAG parameter {name} must be"):
        RunConfig.from_params({**params, name: True})


def test_the_form_fields_sit_in_their_sections_under_their_titles():
    form = dag_params()
    assert form["tuning"].schema["section"] == "Tuning" and form["tuning"].schema["title"] == "Tuning"
    assert form["max_tokens"].schema["section"] == "Generation"
    assert form["max_error_share"].schema["section"] == "Validation thresholds"
    assert form["dry_run"].schema == {"title": "Dry run", "section": "Inputs", "type": "boolean"}
    assert form["fleet_file"].schema["type"] == ["null", "string"] and form["fleet_file"].value is None
