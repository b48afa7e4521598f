"""Applying airflow_settings.yaml to a plain Airflow's database: every connection, variable and pool is
upserted (the same file applied twice leaves one of each), and a bad file stops before the database."""

import contextlib
import json
import sys
import types

import pytest

from fleetgen.airflow import apply_settings
from fleetgen.airflow.settings_file import Connection, Pool, Settings


class _Column:
    def __init__(self, name):
        self.name = name

    def __eq__(self, other):
        return lambda row: getattr(row, self.name) == other


class _Row:
    def __init__(self, **values):
        self.__dict__.update(values)


class _Connection(_Row):
    conn_id = _Column("conn_id")


class _Variable(_Row):
    key = _Column("key")


class _Pool(_Row):
    pool = _Column("pool")


class _Query:
    def __init__(self, table, rows):
        self.table, self.rows = table, rows

    def filter(self, predicate):
        return _Query(self.table, [row for row in self.rows if predicate(row)])

    def delete(self):
        for row in self.rows:
            self.table.remove(row)
        return len(self.rows)

    def one_or_none(self):
        assert len(self.rows) <= 1, "more than one row"
        return self.rows[0] if self.rows else None


class _Database:
    """The metadata tables as lists, behind a session that supports what apply_to_db uses."""

    def __init__(self):
        self.tables = {_Connection: [], _Variable: [], _Pool: []}
        self.sessions = 0

    def query(self, model):
        return _Query(self.tables[model], list(self.tables[model]))

    def add(self, row):
        self.tables[type(row)].append(row)

    @contextlib.contextmanager
    def session(self):
        self.sessions += 1
        yield self


@pytest.fixture
def database(monkeypatch):
    # Stand-ins for Airflow's ORM modules (importing the real ones takes seconds and wants a configured database).
    db = _Database()
    models = types.ModuleType("airflow.models")
    models.Connection, models.Variable, models.Pool = _Connection, _Variable, _Pool
    session = types.ModuleType("airflow.utils.session")
    session.create_session = db.session
    monkeypatch.setitem(sys.modules, "airflow.models", models)
    monkeypatch.setitem(sys.modules, "airflow.utils.session", session)
    return db


SETTINGS = Settings(
    connections=(Connection("fleetgen_node0", "ssh", host="n0", port=2222, login="fleetgen", password="pw",
                            schema="s", extra={"host_key": "ssh-ed25519 AAAA"}),
                 Connection("sglang_api_key", "generic", password="k")),
    pools=(Pool("fleetgen_fleet", 4, "the fleet"), Pool("fleetgen_probe", 1)),
    variables=(("fleetgen_fleet", "nodes: []"), ("fleetgen_note", "1")))


def test_every_connection_variable_and_pool_is_written_with_its_fields(database):
    apply_settings.apply_to_db(SETTINGS)
    node, api_key = database.tables[_Connection]
    assert vars(node) == {"conn_id": "fleetgen_node0", "uri": None, "conn_type": "ssh", "host": "n0", "port": 2222,
                          "login": "fleetgen", "password": "pw", "schema": "s",
                          "extra": json.dumps({"host_key": "ssh-ed25519 AAAA"})}
    assert api_key.conn_id == "sglang_api_key" and api_key.password == "k" and api_key.extra is None
    assert [(v.key, v.val) for v in database.tables[_Variable]] == [("fleetgen_fleet", "nodes: []"),
                                                                    ("fleetgen_note", "1")]
    assert [vars(p) for p in database.tables[_Pool]] == [
        {"pool": "fleetgen_fleet", "slots": 4, "description": "the fleet", "include_deferred": False},
        {"pool": "fleetgen_probe", "slots": 1, "description": "", "include_deferred": False}]
    assert database.sessions == 1


def test_applying_again_replaces_each_entry_and_leaves_the_others(database):
    database.add(_Connection(conn_id="fleetgen_node0", host="old"))
    database.add(_Connection(conn_id="someone_elses", host="keep"))
    database.add(_Variable(key="fleetgen_fleet", val="old"))
    database.add(_Variable(key="unrelated", val="keep"))
    database.add(_Pool(pool="fleetgen_fleet", slots=1, description="old", include_deferred=True))
    apply_settings.apply_to_db(SETTINGS)
    apply_settings.apply_to_db(SETTINGS)
    assert sorted((c.conn_id, c.host) for c in database.tables[_Connection]) == [
        ("fleetgen_node0", "n0"), ("sglang_api_key", None), ("someone_elses", "keep")]
    assert sorted((v.key, v.val) for v in database.tables[_Variable]) == [
        ("fleetgen_fleet", "nodes: []"), ("fleetgen_note", "1"), ("unrelated", "keep")]
    fleet_pool, probe_pool = database.tables[_Pool]
    # An existing pool keeps its row (and whatever else an operator set on it); slots and description follow the file.
    assert (fleet_pool.pool, fleet_pool.slots, fleet_pool.description, fleet_pool.include_deferred) == (
        "fleetgen_fleet", 4, "the fleet", True)
    assert (probe_pool.pool, probe_pool.slots) == ("fleetgen_probe", 1)


def test_the_command_applies_the_file_and_says_what_it_applied(tmp_path, monkeypatch, capsys):
    path = tmp_path / "airflow_settings.yaml"
    path.write_text("airflow:\n  connections:\n    - conn_id: a\n      conn_type: ssh\n"
                    "  pools:\n    - pool_name: p\n      pool_slot: 3\n    - pool_name: q\n      pool_slot: 1\n"
                    "  variables:\n    - variable_name: v\n      variable_value: x\n"
                    "    - variable_name: w\n      variable_value: y\n    - variable_name: z\n")
    applied = []
    monkeypatch.setattr(apply_settings, "apply_to_db", applied.append)
    assert apply_settings.main([str(path)]) == 0
    [settings] = applied
    assert [c.conn_id for c in settings.connections] == ["a"] and [p.slots for p in settings.pools] == [3, 1]
    assert capsys.readouterr().out == f"applied 1 connection(s), 3 variable(s), 2 pool(s) from {path}\n"


def test_a_bad_file_stops_with_status_2_before_the_database(tmp_path, monkeypatch, capsys):
    path = tmp_path / "airflow_settings.yaml"
    path.write_text("airflow:\n  variables:\n    - variable_name: x\n      variable_value: ${UNSET_FOR_THIS_TEST}\n")
    monkeypatch.delenv("UNSET_FOR_THIS_TEST", raising=False)
    applied = []
    monkeypatch.setattr(apply_settings, "apply_to_db", applied.append)
    assert apply_settings.main([str(path)]) == 2
    captured = capsys.readouterr()
    assert applied == [] and captured.out == ""
    assert captured.err.startswith("error: [") and "${UNSET_FOR_THIS_TEST} is not set" in captured.err
    assert apply_settings.main([str(tmp_path / "absent.yaml")]) == 2
    assert capsys.readouterr().err.startswith("error: [") and applied == []


def test_the_command_needs_the_settings_path_and_describes_itself(capsys):
    with pytest.raises(SystemExit) as caught:
        apply_settings.main(["--help"])
    assert caught.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())  # as words: argparse wraps to the terminal's width
    assert help_text.startswith("usage: python -m fleetgen.airflow.apply_settings [-h] settings Apply "
                                "``airflow_settings.yaml`` to a plain Airflow's metadata database (connections, "
                                "variables, pools). positional arguments:")
    assert " settings path of airflow_settings.yaml options:" in help_text
    with pytest.raises(SystemExit) as caught:
        apply_settings.main([])
    assert caught.value.code == 2
