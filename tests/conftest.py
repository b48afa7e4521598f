import os
import pathlib
import tempfile

# Importing airflow without AIRFLOW_HOME creates ~/airflow: keep every test run self-contained.
_home = pathlib.Path(tempfile.gettempdir()) / f"fleetgen-test-airflow-{os.getpid()}"
os.environ.setdefault("AIRFLOW_HOME", str(_home))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
