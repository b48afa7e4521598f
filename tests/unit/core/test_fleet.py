import pytest

from fleetgen.errors import ConfigError
from fleetgen.nodes.fleet import fleet_from_json, load_fleet_file, load_fleet_text, parse_fleet

BASE = {
    "model": {"path": "/models/m", "served_name": "m"},
    "server": {"python": "/venv/bin/python", "extra_args": ["--reasoning-parser", "qwen3"]},
    "nodes": [{"name": "a", "ssh_conn_id": "ssh_a", "address": "10.0.0.1", "gpus": [0, 1, 2]},
              {"name": "b", "ssh_conn_id": "ssh_b", "address": "10.0.0.2", "gpus": [4], "base_port": 31000}],
}


def _with(**changes):
    import copy

    document = copy.deepcopy(BASE)
    for dotted, value in changes.items():
        target = document
        keys = dotted.split("__")
        for key in keys[:-1]:
            target = target[int(key)] if key.isdigit() else target[key]
        target[keys[-1]] = value
    return document


def test_servers_ports_and_round_trip():
    fleet = parse_fleet(BASE)
    assert [(s.name, s.gpu_ids, s.url) for s in fleet.servers()] == [
        ("a:30000", (0,), "http://10.0.0.1:30000"), ("a:30001", (1,), "http://10.0.0.1:30001"),
        ("a:30002", (2,), "http://10.0.0.1:30002"), ("b:31000", (4,), "http://10.0.0.2:31000")]
    assert fleet_from_json(fleet.to_dict()) == parse_fleet(fleet.to_dict(), source="<xcom>")
    assert fleet_from_json(fleet.to_dict()).servers() == fleet.servers()


def test_tp_groups():
    document = _with(server__tp_size=2)
    document["nodes"] = [{"name": "a", "ssh_conn_id": "s", "address": "h", "tp_groups": [[0, 1], [2, 3]]}]
    assert [s.gpu_ids for s in parse_fleet(document).servers()] == [(0, 1), (2, 3)]


@pytest.mark.parametrize("document, message", [
    (_with(nodes__0__gpus=[0, 0]), "nodes[0] (a)' uses GPU(s) [0] more than once"),
    (_with(nodes__1__name="a"), "node name 'a' appears 2 times"),
    (_with(nodes__0__base_port=80), "port 80 is outside"),
    (_with(nodes__0__gpus="0,1"), "'nodes[0] (a).gpus' must be a list"),
    (_with(server__tp_size=2), "not a multiple of server.tp_size 2"),
    (_with(server__extra_args=["--port", "1"]), "sets --port, which the fleet decides"),
    (_with(server__module="sglang launch"), "not a Python module name"),
    (_with(nodes__0__colour="red"), "unknown key(s) under 'nodes[0] (a)': colour"),
    (_with(server__tp_size=True), "must be an integer, got a boolean"),
    (_with(nodes__1__ports=[31000]), "'nodes[1] (b)' sets both 'ports' and 'base_port'; give one"),
    (_with(server__api_key_conn_id="key", server__extra_args=["--config", "my.yaml"]),
     "'server.extra_args' sets --config, but with server.api_key_conn_id the launch passes its own --config"),
])
def test_invalid_documents_name_the_key_and_node(document, message):
    with pytest.raises(ConfigError) as error:
        parse_fleet(document, source="fleet.yaml")
    assert message in str(error.value)
    assert "fleet.yaml" in str(error.value)


def test_missing_node_key():
    document = _with()
    del document["nodes"][1]["ssh_conn_id"]
    with pytest.raises(ConfigError, match=r"missing key 'nodes\[1\] \(b\)\.ssh_conn_id'"):
        parse_fleet(document)


def test_yaml_syntax_error_names_the_line(tmp_path):
    path = tmp_path / "fleet.yaml"
    path.write_text("model:\n  path: /m\nnodes: [\n  {name: a\n")
    with pytest.raises(ConfigError) as error:
        load_fleet_file(path)
    assert f"{path}:" in str(error.value)
    assert error.value.line is not None


def test_unreadable_file():
    with pytest.raises(ConfigError, match="cannot read the fleet file"):
        load_fleet_file("/nonexistent/fleet.yaml")


def test_yaml_text():
    fleet = load_fleet_text("model: {path: /m}\nnodes:\n - {name: n, ssh_conn_id: c, address: h, gpus: [0]}\n",
                            source="v")
    assert fleet.model.served_name == "m" and fleet.server.module == "sglang.launch_server"
