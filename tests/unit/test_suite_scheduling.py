"""How `make test` hands test files to its xdist workers (tests/conftest.py): the long units start early, one per
worker at a time, and all of tests/real_sglang/ stays on one worker."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("xdist")

_CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"


def _suite_conftest():
    # tests/conftest.py by path: under --import-mode=importlib it is not importable by name
    spec = importlib.util.spec_from_file_location("fleetgen_suite_conftest", _CONFTEST)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class FakeWorker:
    def __init__(self, name: str) -> None:
        self.name = name
        self.gateway = SimpleNamespace(id=name)
        self.shutting_down = False
        self.sent: list[list[int]] = []

    def send_runtest_some(self, indices) -> None:
        self.sent.append(list(indices))

    def shutdown(self) -> None:
        pass


def _scheduler(workers: int):
    conftest = _suite_conftest()
    options = {"dist": "loadfile", "tx": [f"{workers}*popen"], "maxschedchunk": None}
    config = SimpleNamespace(getvalue=options.get, option=SimpleNamespace(loadscopereorder=True))
    return conftest, conftest.pytest_xdist_make_scheduler(config, None)


# Light files with many tests come first in xdist's own order (most tests first).
COLLECTION = ([f"tests/unit/test_many.py::test_{i}" for i in range(30)]
              + [f"tests/unit/test_some.py::test_{i}" for i in range(20)]
              + [f"tests/real_sglang/test_conformance.py::test_{i}" for i in range(8)]
              + [f"tests/real_sglang/test_fatal_starts.py::test_{i}" for i in range(6)]
              + ["tests/e2e/test_production_stack.py::test_one", "tests/e2e/test_production_stack.py::test_two",
                 "tests/airflow/test_ui_in_browser.py::test_one",
                 "tests/oracle/test_oracle_matrix.py::test_one"])


def _units_sent(scheduler, worker) -> list[str]:
    units = []
    for indices in worker.sent:
        for unit in dict.fromkeys(scheduler._split_scope(COLLECTION[index]) for index in indices):
            units.append(unit)
    return units


def _start(workers: int):
    conftest, scheduler = _scheduler(workers)
    nodes = [FakeWorker(f"gw{index}") for index in range(workers)]
    for node in nodes:
        scheduler.add_node(node)
        scheduler.add_node_collection(node, COLLECTION)
    scheduler.schedule()
    return conftest, scheduler, nodes


def test_each_worker_starts_on_a_long_unit_before_the_light_files():
    conftest, scheduler, nodes = _start(3)
    first = [_units_sent(scheduler, node)[0] for node in nodes]
    assert first == ["tests/real_sglang/", "tests/e2e/test_production_stack.py",
                     "tests/airflow/test_ui_in_browser.py"]


def test_a_worker_running_a_long_unit_gets_a_light_one_next_not_a_second_long_one():
    conftest, scheduler, nodes = _start(3)
    # xdist tops up a worker with two tests or fewer left (the production stack's and the browser's here)
    later = {node.name: _units_sent(scheduler, node)[1:] for node in nodes}
    assert later["gw1"] and later["gw2"], later
    assert not any(unit in conftest.LONG_UNITS for units in later.values() for unit in units), later


def test_every_real_server_test_goes_to_one_worker_in_one_unit():
    conftest, scheduler, nodes = _start(3)
    holders = [node for node in nodes
               if any(COLLECTION[i].startswith("tests/real_sglang/") for sent in node.sent for i in sent)]
    assert len(holders) == 1
    real = [i for sent in holders[0].sent for i in sent if COLLECTION[i].startswith("tests/real_sglang/")]
    assert sorted(real) == [i for i, nodeid in enumerate(COLLECTION) if nodeid.startswith("tests/real_sglang/")]


def test_a_worker_done_with_its_long_unit_takes_the_next_long_one():
    conftest, scheduler, nodes = _start(2)
    # gw1 runs the production stack first: once its tests are done, the next waiting long unit is its next work
    production = nodes[1]
    assert _units_sent(scheduler, production)[0] == "tests/e2e/test_production_stack.py"
    for indices in list(production.sent):
        for index in indices:
            scheduler.mark_test_complete(production, index, 0.0)
    assert "tests/airflow/test_ui_in_browser.py" in _units_sent(scheduler, production)
