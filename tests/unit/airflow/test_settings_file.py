import json
import re
from pathlib import Path

import pytest

from fleetgen.errors import ConfigError
from fleetgen.nodes.fleet import load_fleet_text
from fleetgen.airflow.settings_file import load_settings

# The checkout's root: the first folder above holding the committed file (mutation runs copy the tests deeper).
ROOT = next(folder for folder in Path(__file__).resolve().parents if (folder / "airflow_settings.yaml").is_file())
ENV = {"FLEETGEN_SSH_PORT": "2222", "FLEETGEN_SSH_USER": "fleetgen", "FLEETGEN_DEMO_DIR": "/d", "FLEETGEN_SSH_HOST_KEY": "ssh-ed25519 AAAAC3",
       "FLEETGEN_API_KEY": "k", "FLEETGEN_PYTHON": "/venv/bin/python", "FLEETGEN_BASE_PORT": "30000"}


def test_committed_settings_apply_and_hold_a_valid_fleet():
    settings = load_settings(ROOT / "airflow_settings.yaml", ENV)
    env = settings.environment()
    node = json.loads(env["AIRFLOW_CONN_FLEETGEN_NODE0"])
    assert node["port"] == 2222 and node["extra"]["host_key"] == "ssh-ed25519 AAAAC3"
    assert "no_host_key_check" not in node["extra"]
    assert [p.name for p in settings.pools] == ["fleetgen_fleet"]
    fleet = load_fleet_text(env["AIRFLOW_VAR_FLEETGEN_FLEET"], source="var")
    assert len(fleet.servers()) == 7 and fleet.server.api_key_conn_id == "sglang_api_key"


def test_missing_placeholder_names_the_line(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("airflow:\n  # ${IGNORED_IN_COMMENTS}\n  variables:\n    - variable_name: x\n      variable_value: ${NOPE}\n")
    with pytest.raises(ConfigError) as error:
        load_settings(path, {})
    assert f"{path}:5" in str(error.value) and "${NOPE}" in str(error.value)


def _load(tmp_path, text, env=None):
    path = tmp_path / "airflow_settings.yaml"
    path.write_text(text)
    return load_settings(path, {} if env is None else env)


def test_placeholders_are_replaced_from_the_environment_several_on_a_line():
    from fleetgen.airflow.settings_file import expand

    text = "a: ${HOST}:${PORT_2}\n# ${HOST} in a comment\n  # ${UNSET} indented\nb: $HOST ${ HOST}\n"
    assert expand(text, {"HOST": "n1", "PORT_2": "22"}, source="s") == "a: n1:22\n\n\nb: $HOST ${ HOST}\n"


def test_an_unset_placeholder_names_its_line_and_what_to_export():
    from fleetgen.airflow.settings_file import expand

    with pytest.raises(ConfigError) as error:
        expand("a: 1\n  # ${COMMENTED}\nb: ${SET}\nc: ${SET} ${UNSET_2}\n", {"SET": "x"}, source="s.yaml")
    assert (error.value.path, error.value.line) == ("s.yaml", 4)
    assert error.value.message == "${UNSET_2} is not set in the environment"
    assert error.value.hint == "export UNSET_2=... before applying the settings"


def test_the_process_environment_is_read_when_no_environment_is_given(tmp_path, monkeypatch):
    monkeypatch.setenv("FLEETGEN_TEST_VALUE", "from-env")
    path = tmp_path / "s.yaml"
    path.write_text("airflow:\n  variables:\n    - variable_name: v\n      variable_value: ${FLEETGEN_TEST_VALUE}\n")
    assert load_settings(path).variables == (("v", "from-env"),)
    assert load_settings(path, {"FLEETGEN_TEST_VALUE": "given"}).variables == (("v", "given"),)


def test_every_connection_pool_and_variable_is_read_with_its_fields(tmp_path):
    from fleetgen.airflow.settings_file import Connection, Pool

    settings = _load(tmp_path, """airflow:
  connections:
    - conn_id: node0
      conn_type: ssh
      conn_host: n0
      conn_port: "2222"
      conn_login: fleetgen
      conn_password: 1234
      conn_schema: s
      conn_extra: '{"host_key": "ssh-ed25519 A"}'
    - conn_id: node1
      conn_type: ssh
      conn_port: 22
      conn_extra: {look_for_keys: false}
    - conn_id: api
      conn_type: generic
      conn_port: ""
  pools:
    - pool_name: fleet
      pool_slot: "3"
      pool_description: shards at once
    - pool_name: probe
      pool_slot: 1
  variables:
    - variable_name: text
      variable_value: plain
    - variable_name: number
      variable_value: 3
    - variable_name: mapping
      variable_value: {a: [1, true]}
    - variable_name: absent
""")
    assert settings.connections == (
        Connection("node0", "ssh", host="n0", port=2222, login="fleetgen", password="1234", schema="s",
                   extra={"host_key": "ssh-ed25519 A"}),
        Connection("node1", "ssh", port=22, extra={"look_for_keys": False}),
        Connection("api", "generic"))
    assert settings.pools == (Pool("fleet", 3, "shards at once"), Pool("probe", 1, ""))
    assert settings.variables == (("text", "plain"), ("number", "3"), ("mapping", '{"a": [1, true]}'),
                                  ("absent", ""))


@pytest.mark.parametrize("text", ["", "# only a comment\n", "airflow:\n", "airflow:\n  connections: []\n",
                                  "other: 1\n"])
def test_an_empty_file_or_section_holds_nothing(tmp_path, text):
    settings = _load(tmp_path, text)
    assert (settings.connections, settings.pools, settings.variables) == ((), (), ())
    assert settings.environment() == {}


def test_the_environment_names_each_connection_and_variable_in_capitals():
    from fleetgen.airflow.settings_file import Connection, Settings

    settings = Settings(connections=(Connection("node0", "ssh", host="n0", port=22, extra={"k": 1}),
                                     Connection("api", "generic", password="p")),
                        pools=(), variables=(("fleetgen_fleet", "nodes: []"), ("note", "x")))
    assert settings.environment() == {
        "AIRFLOW_CONN_NODE0": '{"conn_type": "ssh", "host": "n0", "port": 22, "extra": {"k": 1}}',
        "AIRFLOW_CONN_API": '{"conn_type": "generic", "password": "p"}',
        "AIRFLOW_VAR_FLEETGEN_FLEET": "nodes: []", "AIRFLOW_VAR_NOTE": "x"}


def test_a_connection_in_json_leaves_out_empty_fields_and_keeps_a_port_of_zero():
    from fleetgen.airflow.settings_file import Connection

    assert json.loads(Connection("c", "ssh", port=0, login="u", schema="db").to_json()) == {
        "conn_type": "ssh", "port": 0, "login": "u", "schema": "db"}


@pytest.mark.parametrize("section, item, message", [
    ("connections", "{conn_type: ssh}", r"connections\[1\] needs conn_id and conn_type"),
    ("connections", "{conn_id: x}", r"connections\[1\] needs conn_id and conn_type"),
    ("connections", "just-a-name", r"connections\[1\] needs conn_id and conn_type"),
    ("pools", "{pool_name: p}", r"pools\[1\] needs pool_name and pool_slot"),
    ("pools", "{pool_slot: 1}", r"pools\[1\] needs pool_name and pool_slot"),
    ("pools", "[p, 1]", r"pools\[1\] needs pool_name and pool_slot"),
    ("variables", "{variable_value: x}", r"variables\[1\] needs variable_name"),
    ("variables", "v", r"variables\[1\] needs variable_name"),
])
def test_an_incomplete_entry_is_named_by_its_section_and_index(tmp_path, section, item, message):
    good = {"connections": "{conn_id: a, conn_type: ssh}", "pools": "{pool_name: a, pool_slot: 1}",
            "variables": "{variable_name: a}"}[section]
    with pytest.raises(ConfigError, match=message) as error:
        _load(tmp_path, f"airflow:\n  {section}:\n    - {good}\n    - {item}\n")
    assert error.value.path == str(tmp_path / "airflow_settings.yaml")


@pytest.mark.parametrize("field, value, message", [
    ("conn_port", "true", r"connections\[0\].conn_port must be an integer, got True$"),
    ("conn_port", "ssh", r"connections\[0\].conn_port must be an integer, got 'ssh'"),
    ("conn_extra", "'{not json'", r"connections\[0\].conn_extra is not valid JSON"),
])
def test_a_connection_field_of_the_wrong_type_is_refused_with_its_name(tmp_path, field, value, message):
    with pytest.raises(ConfigError) as error:
        _load(tmp_path, f"airflow:\n  connections:\n    - {{conn_id: a, conn_type: ssh, {field}: {value}}}\n")
    assert re.match(message, error.value.message) and error.value.path == str(tmp_path / "airflow_settings.yaml")


@pytest.mark.parametrize("slots, message", [("true", "got True"), ("false", "got False"), ("many", "got 'many'"),
                                            ("[1]", r"got \[1\]")])
def test_a_pool_of_yaml_true_slots_is_refused_not_read_as_one(tmp_path, slots, message):
    with pytest.raises(ConfigError) as error:
        _load(tmp_path, f"airflow:\n  pools:\n    - {{pool_name: p, pool_slot: {slots}}}\n")
    assert re.fullmatch(rf"pools\[0\].pool_slot must be an integer, {message}", error.value.message)
    assert error.value.path == str(tmp_path / "airflow_settings.yaml")


def test_a_file_that_is_not_yaml_names_its_line_and_the_problem_in_one_line(tmp_path):
    with pytest.raises(ConfigError) as error:
        _load(tmp_path, "airflow:\n  pools:\n    - pool_name: p\n   bad: [\n")
    assert error.value.message == "not valid YAML: expected <block end>, but found '<block mapping start>'"
    assert error.value.line == 4 and error.value.path == str(tmp_path / "airflow_settings.yaml")


def test_a_file_with_a_character_yaml_refuses_is_named_without_a_line(tmp_path):
    with pytest.raises(ConfigError) as error:
        _load(tmp_path, "airflow:\n  variables: \x07\n")
    assert error.value.message.startswith("not valid YAML: unacceptable character #x0007")
    assert error.value.line is None and error.value.path == str(tmp_path / "airflow_settings.yaml")


def test_an_airflow_section_that_is_not_a_mapping_is_refused(tmp_path):
    with pytest.raises(ConfigError) as error:
        _load(tmp_path, "airflow:\n  - connections\n")
    assert error.value.message == "'airflow' must be a mapping"
    assert error.value.path == str(tmp_path / "airflow_settings.yaml")


def test_a_missing_file_is_a_config_error_naming_it(tmp_path):
    with pytest.raises(ConfigError) as error:
        load_settings(tmp_path / "absent.yaml", {})
    assert error.value.message == "cannot read settings: No such file or directory"
    assert error.value.path == str(tmp_path / "absent.yaml") and error.value.__cause__ is None
