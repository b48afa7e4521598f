import json
from pathlib import Path

import pytest

from fleetgen.errors import ConfigError
from fleetgen.nodes.fleet import load_fleet_text
from fleetgen.airflow.settings_file import load_settings

ROOT = Path(__file__).resolve().parents[3]
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
