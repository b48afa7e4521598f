"""The DAG imports the way the Astro Runtime image runs it: the project copied to AIRFLOW_HOME, not
installed, with include/ on PYTHONPATH (Dockerfile) and no editable install of fleetgen."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[2]
# Drop the editable install (its .pth puts this checkout's include/ on sys.path) before importing.
PROBE = """
import json, sys
sys.path = [entry for entry in sys.path if entry != {editable!r}]
result = {{}}
try:
    from airflow.dag_processing.dagbag import DagBag
    bag = DagBag(dag_folder={dags!r})
    result["errors"] = {{path: str(error)[-300:] for path, error in bag.import_errors.items()}}
    result["dags"] = sorted(bag.dag_ids)
    import fleetgen
    result["fleetgen"] = fleetgen.__file__
except Exception as error:
    result["exception"] = repr(error)
print("RESULT " + json.dumps(result))
"""


def _import_in_astro_layout(tmp_path: Path, *, pythonpath: str | None) -> dict:
    home = tmp_path / "usr-local-airflow"
    for folder in ("dags", "include", "plugins"):
        shutil.copytree(PROJECT_ROOT / folder, home / folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(PROJECT_ROOT / "airflow_settings.yaml", home)
    env = {key: value for key, value in os.environ.items() if not key.startswith(("AIRFLOW", "PYTHONPATH"))}
    env.update({"AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False"})
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath.replace("/usr/local/airflow", str(home))
    code = PROBE.format(editable=str(PROJECT_ROOT / "include"), dags=str(home / "dags"))
    result = subprocess.run([sys.executable, "-c", code], env=env, cwd=home, capture_output=True, text=True,
                            timeout=300)
    line = next((line for line in result.stdout.splitlines() if line.startswith("RESULT ")), None)
    assert line, result.stdout[-2000:] + result.stderr[-2000:]
    return {**json.loads(line[len("RESULT "):]), "home": str(home)}


def _dockerfile_pythonpath() -> str:
    for line in (PROJECT_ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith("ENV PYTHONPATH="):
            return line.split("=", 1)[1]
    pytest.fail("the Dockerfile sets no PYTHONPATH")


@pytest.mark.slow
def test_the_dag_imports_with_the_dockerfile_pythonpath_and_no_install(tmp_path):
    result = _import_in_astro_layout(tmp_path, pythonpath=_dockerfile_pythonpath())
    assert "exception" not in result and result["errors"] == {}, result
    assert result["dags"] == ["sglang_generation"]
    assert result["fleetgen"].startswith(result["home"])  # the copy, not this checkout


@pytest.mark.slow
def test_without_the_pythonpath_the_import_fails_naming_fleetgen(tmp_path):
    result = _import_in_astro_layout(tmp_path, pythonpath=None)
    assert result.get("errors") and "fleetgen" in json.dumps(result["errors"]), result


def test_astro_project_files_are_there():
    config = (PROJECT_ROOT / ".astro" / "config.yaml").read_text()
    assert "name: fleetgen" in config
    assert (PROJECT_ROOT / "Dockerfile").read_text().startswith("# ")
    assert "FROM astrocrpublic.azurecr.io/runtime:3.3-" in (PROJECT_ROOT / "Dockerfile").read_text()
    documented = {line.split("=", 1)[0] for line in (PROJECT_ROOT / ".env.example").read_text().splitlines()
                  if line and not line.startswith("#")}
    used = {"FLEETGEN_SCHEDULE", "FLEETGEN_TIMEZONE", "FLEETGEN_PROMPTS_PATH"}
    import re
    used |= set(re.findall(r"\$\{(FLEETGEN_[A-Z_]+)\}", (PROJECT_ROOT / "airflow_settings.yaml").read_text()))
    assert used <= documented, used - documented


def _pins(name: str) -> list[str]:
    lines = (PROJECT_ROOT / name).read_text().splitlines()
    return [line.split("==")[0].split("[")[0].strip().lower() for line in lines if line.strip()
            and not line.startswith("#")]


def test_the_image_installs_no_test_tool_and_each_package_is_pinned_once():
    runtime, development = _pins("requirements.txt"), _pins("requirements-dev.txt")
    assert len(runtime) == len(set(runtime)) and len(development) == len(set(development))
    assert not set(runtime) & set(development)
    assert not {"pytest", "pytest-xdist", "pytest-timeout", "hypothesis", "playwright"} & set(runtime)
    for name in ("requirements.txt", "requirements-dev.txt"):
        assert all("==" in line for line in (PROJECT_ROOT / name).read_text().splitlines()
                   if line.strip() and not line.startswith("#")), name
