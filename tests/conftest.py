import os
import pathlib
import tempfile

PROJECT_ROOT = pathlib.Path(__file__).resolve().parents[1]

# Importing airflow without AIRFLOW_HOME creates ~/airflow: keep every test run self-contained.
# These must be set before anything imports airflow (its configuration is read at import).
# Each process gets its own home, so its own SQLite metadata DB: xdist workers inherit the environment of the
# controller, which loaded this file first, and two workers writing one DB collide ("UNIQUE constraint failed:
# dag.dag_id" when both sync the DAG at once). A home set from outside is the caller's choice and stays shared.
_OWN_HOME = "FLEETGEN_TEST_OWN_AIRFLOW_HOME"
if "AIRFLOW_HOME" not in os.environ or os.environ.get(_OWN_HOME) == os.environ["AIRFLOW_HOME"]:
    _home = pathlib.Path(tempfile.gettempdir()) / f"fleetgen-test-airflow-{os.getpid()}"
    os.environ["AIRFLOW_HOME"] = os.environ[_OWN_HOME] = str(_home)
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(PROJECT_ROOT / "dags"))
os.environ.setdefault("AIRFLOW__CORE__DAG_RUN_CONF_OVERRIDES_PARAMS", "True")
os.environ.setdefault("FLEETGEN_RETRY_DELAY_S", "1")
# dag.test() runs triggers inline: nothing can race a fast resume, so wait_ready does not hold its event
# (the real-executor stacks, devstack.prod and devstack.ui, drop this and keep the product default).
os.environ.setdefault("FLEETGEN_RESUME_SETTLE_S", "0")

# A test picks ports for servers bound seconds or minutes later, and the xdist workers cannot see each other's
# picks: each worker picks from its own part of the range (its child processes inherit it).
if os.environ.get("PYTEST_XDIST_WORKER", "").startswith("gw"):
    from devstack.demo import PORT_RANGE_ENV, worker_port_range  # noqa: E402

    os.environ[PORT_RANGE_ENV] = worker_port_range(int(os.environ["PYTEST_XDIST_WORKER"][2:]),
                                                   int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))

import pytest  # noqa: E402
from hypothesis import Phase, settings  # noqa: E402

# `make mutation` runs each test against hundreds of mutants: finding one failing example is the
# verdict there; shrinking it (minutes for the launch tests, which wait on a server's log) is not.
settings.register_profile("mutation", phases=[Phase.explicit, Phase.reuse, Phase.generate], database=None)

# `make test` runs the suite on two xdist workers (--dist loadfile). A file's tests stay on one worker, so its
# module fixtures (a simulated fleet, the production stack) start once; and every file of tests/real_sglang/ shares
# one worker, so the real SGLang servers of its session fixtures (tens of seconds each) start once and at most one
# worker at a time loads the CPU with real servers.
REAL_SGLANG = "tests/real_sglang/"


def worker_unit(nodeid: str) -> str:
    """The unit of tests that stays on one xdist worker: the file, or all of tests/real_sglang/."""
    path = nodeid.split("::", 1)[0]
    return REAL_SGLANG if path.startswith(REAL_SGLANG) else path


# The units that take minutes of wall time each (real or production-shaped servers, a browser, Airflow DAG runs,
# SGLang's own sizing of the oracle matrix), longest first; measured with three workers on two cores beside other
# load: tests/real_sglang/ 19 min, the production stack 8, the browser 8, the server lifecycle 6, the end-to-end
# DAG 6, the oracle matrix 6, the tuning trial's two DAG runs 3-6, the smoke runs of the two DAG benches 2 each; every
# other file under 2.
LONG_UNITS = (REAL_SGLANG, "tests/e2e/test_production_stack.py", "tests/airflow/test_ui_in_browser.py",
              "tests/e2e/test_server_lifecycle.py", "tests/e2e/test_dag_end_to_end.py",
              "tests/e2e/test_tuning_trial.py", "tests/oracle/test_oracle_matrix.py",
              "tests/bench/test_dag_utilization.py", "tests/bench/test_nightly.py")


@pytest.hookimpl(optionalhook=True)  # xdist's hook: a run without xdist (-p no:xdist) must not refuse it
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    # xdist hands out the units with the most tests first, so a long unit with few tests (the production stack)
    # started last and was the run's tail. Here a worker that is not running a long unit gets the next one, so
    # every long unit starts early and no worker runs two at once; the light files fill the gaps.
    class FileScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_unit(nodeid)

        def _assign_work_unit(self, node) -> None:
            running = self.assigned_work.get(node, {})
            if not any(scope in LONG_UNITS and not all(done.values()) for scope, done in running.items()):
                waiting = next((scope for scope in LONG_UNITS if scope in self.workqueue), None)
                if waiting is not None:
                    self.workqueue.move_to_end(waiting, last=False)
            super()._assign_work_unit(node)

    return FileScheduling(config, log)


# A real S3-compatible store (SeaweedFS, devstack/seaweedfs.py), started once per test process on the first test
# that asks for it and reached, as the product reaches any store, through an Airflow connection.
STORE_CONN_ID = "fleetgen_test_store"


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory):
    from devstack.seaweedfs import shared_store, start_seaweedfs

    store = shared_store() or start_seaweedfs(tmp_path_factory.mktemp("seaweedfs"))
    saved = {name: os.environ.get(name) for name in store.connection_env(STORE_CONN_ID)}
    os.environ.update(store.connection_env(STORE_CONN_ID))
    yield store
    store.stop()
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture
def store_prefix(seaweedfs, request):
    """An ``s3://`` URL of a prefix no other test writes under."""
    import uuid

    return f"s3://{seaweedfs.bucket}/{request.node.name[:40].replace('[', '-').replace(']', '')}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def object_store(store_prefix):
    from fleetgen.storage.location import parse_location
    from fleetgen.storage.objects import ObjectStore

    return ObjectStore.connect(parse_location(store_prefix, parameter="output_root"), conn_id=STORE_CONN_ID,
                               parameter="output_root")


@pytest.fixture(params=["disk", "store"])
def run_files(request, tmp_path):
    """A run's shared small files (storage/run_files.py) on a folder every worker sees, or on an object store: a test
    taking it runs on both."""
    from fleetgen.storage.run_files import LocalRunFiles, ObjectRunFiles

    if request.param == "disk":
        return LocalRunFiles(tmp_path / "run")
    return ObjectRunFiles(request.getfixturevalue("object_store"))
