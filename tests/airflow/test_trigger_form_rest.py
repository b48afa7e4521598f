"""The trigger form's Params, through the REST API of a running Airflow: invalid values are refused with the reason."""

import pytest

from tests.airflow.api_server import DAG_ID, api_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    with api_server(tmp_path_factory.mktemp("airflow-api"), {"admin": ("admin", "secret-pw")}) as server:
        yield server.clients["admin"]


def _trigger(api, conf):
    return api.post(f"/api/v2/dags/{DAG_ID}/dagRuns", json={"logical_date": None, "conf": conf})


@pytest.mark.parametrize("conf, reason", [
    ({"max_tokens": 0}, "max_tokens"),
    ({"tuning": "fastest"}, "tuning"),
    ({"headroom": 9}, "headroom"),
    ({"prompts_path": ""}, "prompts_path"),
    ({"dry_run": "yes"}, "dry_run"),
])
def test_invalid_params_are_refused_with_the_reason(api, conf, reason):
    response = _trigger(api, conf)
    assert response.status_code == 400, response.text
    assert reason in response.text


def test_valid_params_create_a_run(api):
    response = _trigger(api, {"dry_run": True, "max_tokens": 2048})
    assert response.status_code == 200, response.text
    assert response.json()["conf"]["max_tokens"] == 2048


def test_form_exposes_titles_descriptions_and_bounds(api):
    params = {}
    details = api.get(f"/api/v2/dags/{DAG_ID}/details").json()
    params = details["params"]
    for name, param in params.items():
        schema = param["schema"]
        assert schema.get("title") and param.get("description"), name
    assert params["max_tokens"]["schema"]["minimum"] == 1
