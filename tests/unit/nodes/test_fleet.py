import json

import pytest

from fleetgen.errors import ConfigError
from fleetgen.nodes.fleet import ModelSpec, ServerSpec, fleet_from_json, load_fleet_file, load_fleet_text, parse_fleet

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


@pytest.mark.parametrize("copy, shared", [
    ({"name": "a2", "base_port": 32000}, "SSH connection 'ssh_a'"),
    ({"name": "a2", "ssh_conn_id": "ssh_a2", "base_port": 32000}, "address 10.0.0.1"),
    ({"name": "a2", "address": "10.0.0.9", "gpus": [2, 3], "base_port": 32000}, "SSH connection 'ssh_a'"),
])
def test_a_copied_node_sharing_a_machine_and_gpus_is_refused_with_both_names(copy, shared):
    document = _with()
    document["nodes"].append({**document["nodes"][0], **copy})
    with pytest.raises(ConfigError) as error:
        parse_fleet(document, source="fleet.yaml")
    message = str(error.value)
    assert f"nodes 'a' and 'a2' both reach the machine of {shared} and both use GPU(s)" in message
    assert message.startswith("[fleet.yaml]") and "give it its own ssh_conn_id and address" in error.value.hint


def test_two_entries_of_one_machine_may_split_its_gpus_but_not_share_a_port():
    document = _with()
    document["nodes"].append({"name": "a2", "ssh_conn_id": "ssh_a", "address": "10.0.0.1", "gpus": [5, 6],
                              "base_port": 32000})
    assert [s.name for s in parse_fleet(document).servers()][-2:] == ["a2:32000", "a2:32001"]
    document["nodes"][-1]["address"] = "10.0.1.1"  # another interface of the same machine: the port clashes
    document["nodes"][-1]["base_port"] = 30001
    with pytest.raises(ConfigError, match=r"nodes 'a' and 'a2' both reach the machine of SSH connection 'ssh_a' "
                                          r"and both use port\(s\) \[30001, 30002\]"):
        parse_fleet(document)


def test_nodes_behind_one_loopback_address_are_told_apart_by_their_ssh_connection():
    # SSH tunnels (and the simulator) reach several machines through 127.0.0.1 on different ports.
    document = _with()
    document["nodes"] = [{"name": f"n{i}", "ssh_conn_id": f"ssh_{i}", "address": "127.0.0.1", "gpus": [0],
                          "base_port": 30000 + 10 * i} for i in range(2)]
    assert [s.url for s in parse_fleet(document).servers()] == ["http://127.0.0.1:30000", "http://127.0.0.1:30010"]


@pytest.mark.parametrize("address, problem, hint", [
    ("10.0.0.1:30000", "holds a port", "nodes[].ports or base_port"),
    ("[fd00::5]:30000", "holds a port", "nodes[].ports or base_port"),
    ("http://10.0.0.1", "is a URL or holds a path", "builds http://host:port itself"),
    ("10.0.0.0/24", "is a URL or holds a path", "builds http://host:port itself"),
    ("gpu node 1", "holds a space", "give the bare host"),
    (" 10.0.0.1", "holds a space", "give the bare host"),
    ("", "is empty", "give the bare host"),
    ("10.0.0.256", "is not a valid IPv4 address", "give the bare host"),
    ("fd00::5::1", "is not a valid IPv6 address", "give the bare host"),
    ("fe80::1%eth0", "has an IPv6 zone", "global or unique-local"),
    ("gpu_node!", "is not a host name or IP address", "give the bare host"),
])
def test_an_address_that_is_not_a_host_is_refused_naming_file_node_and_field(address, problem, hint):
    with pytest.raises(ConfigError) as error:
        parse_fleet(_with(nodes__1__address=address), source="fleet.yaml")
    assert str(error.value).startswith(f"[fleet.yaml] 'nodes[1] (b).address' {address!r} {problem}")
    assert hint in error.value.hint


@pytest.mark.parametrize("address, url", [
    ("::1", "http://[::1]:31000"), ("[FD00:0::5]", "http://[fd00::5]:31000"),
    ("gpu-node-1.example.internal", "http://gpu-node-1.example.internal:31000"),
])
def test_ipv6_addresses_are_bracketed_in_every_url(address, url):
    fleet = parse_fleet(_with(nodes__0__address="fd00::1", nodes__1__address=address, server__bind_host="::"))
    slot = fleet.servers()[-1]
    assert slot.url == url and slot.to_dict()["url"] == url
    assert fleet_from_json(fleet.to_dict()).servers() == fleet.servers()
    import httpx

    assert httpx.URL(slot.url).port == 31000  # what wait_ready and the shards parse


def test_two_spellings_of_one_ipv6_address_are_one_machine():
    document = _with(server__bind_host="::")
    document["nodes"] = [{"name": "a", "ssh_conn_id": "s1", "address": "fd00::5", "gpus": [0]},
                         {"name": "b", "ssh_conn_id": "s2", "address": "FD00:0:0::5", "gpus": [0], "base_port": 31000}]
    with pytest.raises(ConfigError, match="nodes 'a' and 'b' both reach the machine of address fd00::5"):
        parse_fleet(document)


def test_an_address_of_the_other_family_than_the_servers_listen_on_is_refused():
    # SGLang's uvicorn binds one socket, IPV6_V6ONLY on an IPv6 one: '::' does not answer at an IPv4 address.
    with pytest.raises(ConfigError) as error:
        parse_fleet(_with(nodes__1__address="fd00::5"), source="fleet.yaml")
    assert "'nodes[1] (b).address' fd00::5 is IPv6 but server.bind_host 0.0.0.0 listens on IPv4 only" in str(
        error.value)
    assert "server.bind_host to '::'" in error.value.hint
    with pytest.raises(ConfigError, match=r"'nodes\[0\] \(a\).address' 10.0.0.1 is IPv4 but server.bind_host :: "
                                          r"listens on IPv6 only"):
        parse_fleet(_with(nodes__1__address="fd00::5", server__bind_host="::"))


def test_bind_host_is_checked_as_a_host():
    with pytest.raises(ConfigError, match=r"'server.bind_host' '0.0.0.0:30000' holds a port"):
        parse_fleet(_with(server__bind_host="0.0.0.0:30000"))


@pytest.fixture
def ipv6_server():
    """An HTTP server on [::1] answering /health and /server_info, as an SGLang server at an IPv6 address."""
    import json
    import socket
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"path": self.path}).encode()
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    class Server(ThreadingHTTPServer):
        address_family = socket.AF_INET6

    server = Server(("::1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_a_server_at_an_ipv6_address_is_reached_by_the_readiness_check_and_the_shards(ipv6_server):
    import asyncio

    import httpx

    from fleetgen.airflow.lifecycle import running_server_info
    from fleetgen.generate.settings import ServerEndpoint
    from fleetgen.generate.transport import PooledTransport

    document = _with(server__bind_host="::")
    document["nodes"] = [{"name": "v6", "ssh_conn_id": "s", "address": "::1", "gpus": [0], "ports": [ipv6_server]}]
    slot = parse_fleet(document).servers()[0]
    info, why = running_server_info(slot, None)
    assert (info, why) == ({"path": "/server_info"}, None)

    endpoint = ServerEndpoint(name=slot.name, url=slot.url, max_in_flight=1)

    async def health():
        transport = PooledTransport()
        try:
            return await transport.handle_async_request(httpx.Request("GET", endpoint.url + "/health"))
        finally:
            await transport.aclose()

    response = asyncio.run(health())
    assert response.status_code == 200 and response.json() == {"path": "/health"}


def test_data_parallel_servers_take_tp_gpus_per_replica():
    document = _with(server__tp_size=1, server__extra_args=["--dp-size", "2"])
    document["nodes"] = [{"name": "a", "ssh_conn_id": "s", "address": "h", "gpus": [0, 1, 2, 3]}]
    assert [s.gpu_ids for s in parse_fleet(document).servers()] == [(0, 1), (2, 3)]
    document["nodes"][0]["gpus"] = [0, 1, 2]
    with pytest.raises(ConfigError, match="not a multiple of server.tp_size 2"):
        parse_fleet(document)


# Ports shared between nodes: allowed across machines, refused on one machine or one endpoint.

def test_two_machines_may_both_serve_on_port_30000():
    document = _with(nodes__1__base_port=30000)
    assert [s.name for s in parse_fleet(document).servers()] == ["a:30000", "a:30001", "a:30002", "b:30000"]


def test_two_loopback_nodes_sharing_a_port_number_are_refused_as_one_endpoint():
    # Different SSH connections behind 127.0.0.1 are different machines, but one URL cannot reach both servers.
    document = _with()
    document["nodes"] = [{"name": "n0", "ssh_conn_id": "ssh_0", "address": "127.0.0.1", "ports": [30000, 30005]},
                         {"name": "n1", "ssh_conn_id": "ssh_1", "address": "127.0.0.1", "ports": [30006, 30005]}]
    document["nodes"][0]["gpus"] = [0, 1]
    document["nodes"][1]["gpus"] = [0, 1]
    with pytest.raises(ConfigError) as error:
        parse_fleet(document, source="fleet.yaml")
    assert error.value.message == "nodes 'n0' and 'n1' both serve 127.0.0.1:30005" and error.value.path == "fleet.yaml"
    assert error.value.hint == "give one of them other nodes[].ports / base_port"


def test_one_endpoint_spelled_in_two_cases_is_still_one_endpoint():
    document = _with()
    document["nodes"] = [{"name": "n0", "ssh_conn_id": "ssh_0", "address": "localhost", "gpus": [0]},
                         {"name": "n1", "ssh_conn_id": "ssh_1", "address": "LOCALHOST", "gpus": [0]}]
    with pytest.raises(ConfigError, match="nodes 'n0' and 'n1' both serve LOCALHOST:30000"):
        parse_fleet(document)


def test_one_machine_reached_under_two_spellings_of_its_name_is_one_machine():
    document = _with()
    document["nodes"] = [{"name": "n0", "ssh_conn_id": "ssh_0", "address": "gpu-node-1", "gpus": [0]},
                         {"name": "n1", "ssh_conn_id": "ssh_1", "address": "GPU-Node-1", "gpus": [1]}]
    with pytest.raises(ConfigError) as error:
        parse_fleet(document, source="fleet.yaml")
    assert error.value.message == ("nodes 'n0' and 'n1' both reach the machine of address gpu-node-1 and both use "
                                   "port(s) [30000]")
    assert error.value.path == "fleet.yaml" and error.value.hint == "give one of them other nodes[].ports / base_port"


def test_localhost_with_a_trailing_dot_is_loopback_too():
    document = _with()
    document["nodes"] = [{"name": "n0", "ssh_conn_id": "ssh_0", "address": "localhost.", "gpus": [0]},
                         {"name": "n1", "ssh_conn_id": "ssh_1", "address": "localhost.", "gpus": [0], "base_port": 30010}]
    assert [s.url for s in parse_fleet(document).servers()] == ["http://localhost.:30000", "http://localhost.:30010"]


def test_a_third_node_is_checked_against_every_earlier_one():
    document = _with()
    document["nodes"].append({"name": "c", "ssh_conn_id": "ssh_b", "address": "10.0.0.3", "gpus": [4],
                              "base_port": 33000})
    with pytest.raises(ConfigError, match=r"nodes 'b' and 'c' both reach the machine of SSH connection 'ssh_b' and "
                                          r"both use GPU\(s\) \[4\]"):
        parse_fleet(document)


def test_shared_gpus_are_found_inside_tp_groups_and_listed_sorted():
    document = _with(server__tp_size=2)
    document["nodes"] = [{"name": "n0", "ssh_conn_id": "s", "address": "h1", "tp_groups": [[3, 0], [1, 2]]},
                         {"name": "n1", "ssh_conn_id": "s", "address": "h2", "tp_groups": [[5, 3], [4, 0]],
                          "base_port": 31000}]
    with pytest.raises(ConfigError) as error:
        parse_fleet(document)
    assert "both use GPU(s) [0, 3]: two servers would share each of them and run out of memory" in error.value.message
    assert error.value.hint == ("if 'n1' was copied from 'n0', give it its own ssh_conn_id and address; if both are "
                                "one machine, split its GPUs between their nodes[].gpus / tp_groups")


# JSON and YAML types at the edge: `true` is not 1, a string is not a number.

@pytest.mark.parametrize("document, message", [
    (_with(nodes__0__base_port=True), "'nodes[0] (a).base_port' must be an integer, got a boolean"),
    (_with(nodes__0__gpus=[True, 2]), "'nodes[0] (a).gpus' must be an integer, got a boolean"),
    (_with(nodes__0__gpus=[0, 1, 2], nodes__0__ports=[30000, False, 30002]),
     "'nodes[0] (a).ports' must be an integer, got a boolean"),
    (_with(server__stop_grace_s=True), "'server.stop_grace_s' must be an integer or a number, got a boolean"),
    (_with(server__stop_grace_s="30"), "'server.stop_grace_s' must be an integer or a number, got str '30'"),
    (_with(server__env={"FLAG": True}), "'server.env.FLAG' must be a string or an integer or a number, got a boolean"),
    (_with(server__extra_args=["--x", None]),
     "'server.extra_args[1]' must be a string or an integer or a number, got NoneType None"),
    (_with(server__python=3), "'server.python' must be a string, got int 3"),
    (_with(server__run_dir=["/r"]), "'server.run_dir' must be a string, got list ['/r']"),
    (_with(server__log_dir=1), "'server.log_dir' must be a string, got int 1"),
    (_with(server__bind_host=0), "'server.bind_host' must be a string, got int 0"),
    (_with(server__api_key_conn_id=7), "'server.api_key_conn_id' must be a string, got int 7"),
    (_with(server__env=["A=1"]), "'server.env' must be a mapping, got list"),
    (_with(server="python3"), "'server' must be a mapping, got str"),
    (_with(model__served_name=5), "'model.served_name' must be a string, got int 5"),
])
def test_a_value_of_the_wrong_type_is_named_with_what_was_expected(document, message):
    with pytest.raises(ConfigError) as error:
        parse_fleet(document, source="fleet.yaml")
    assert error.value.message.startswith(message) and error.value.path == "fleet.yaml"


@pytest.mark.parametrize("run_dir", ["/srv/run\nlater", "/srv/run\r"])
def test_a_run_dir_with_a_line_break_is_refused_naming_the_setting(run_dir):
    with pytest.raises(ConfigError) as error:
        parse_fleet(_with(server__run_dir=run_dir), source="fleet.yaml")
    assert error.value.message == f"'server.run_dir' holds a line break: {run_dir!r}"
    assert error.value.path == "fleet.yaml" and "without line breaks" in error.value.hint


def test_a_boolean_where_a_boolean_is_expected_is_accepted():
    from fleetgen.nodes.fleet import _typed

    assert _typed(True, "x", bool, "s") is True and _typed(False, "x", (bool, int), "s") is False


def test_numbers_in_extra_args_and_env_become_strings_and_env_is_sorted():
    fleet = parse_fleet(_with(server__extra_args=["--max-running-requests", 64, "--temperature", 0.5],
                              server__env={"Z_LAST": 1, "A_FIRST": "x", "_MID": 2.5}, server__stop_grace_s=12))
    assert fleet.server.extra_args == ("--max-running-requests", "64", "--temperature", "0.5")
    assert fleet.server.env == (("A_FIRST", "x"), ("Z_LAST", "1"), ("_MID", "2.5"))
    assert fleet.server.stop_grace_s == 12.0 and isinstance(fleet.server.stop_grace_s, float)


def test_server_defaults_and_every_setting_round_trip():
    fleet = parse_fleet(_with(server={}))
    assert fleet.server == ServerSpec()
    assert (fleet.server.python, fleet.server.module, fleet.server.tp_size, fleet.server.run_dir,
            fleet.server.log_dir, fleet.server.bind_host, fleet.server.api_key_conn_id, fleet.server.stop_grace_s) == (
        "python3", "sglang.launch_server", 1, "~/fleetgen/run", "~/fleetgen/logs", "0.0.0.0", None, 30.0)
    document = _with(server={"python": "/v/bin/python", "module": "sglang_sim.server", "tp_size": 1,
                             "extra_args": ["--x", "1"], "env": {"A": "1"}, "run_dir": "/r", "log_dir": "/l",
                             "bind_host": "0.0.0.0", "api_key_conn_id": "key", "stop_grace_s": 5.5})
    fleet = parse_fleet(document)
    assert fleet.to_dict()["server"] == {**document["server"], "extra_args": ["--x", "1"]}
    assert fleet_from_json(json.dumps(fleet.to_dict())) == parse_fleet(fleet.to_dict(), source="<xcom>")
    assert fleet_from_json(json.dumps(fleet.to_dict())).source == "<xcom>"


def test_the_served_name_defaults_to_the_models_folder_name():
    document = _with()
    document["model"] = {"path": "/models/qwen3.6-27b/"}
    assert parse_fleet(document).model == ModelSpec(path="/models/qwen3.6-27b/", served_name="qwen3.6-27b")


@pytest.mark.parametrize("document, message, hint", [
    ({"model": {"path": "/m"}}, "missing key 'fleet.nodes'", "add 'nodes' under 'fleet' (see the example at the top of fleetgen/nodes/fleet.py)"),
    ({"nodes": []}, "missing key 'fleet.model'", "add 'model' under 'fleet' (see the example at the top of fleetgen/nodes/fleet.py)"),
    ({"model": {}, "nodes": []}, "missing key 'model.path'",
     "add 'path' under 'model' (see the example at the top of fleetgen/nodes/fleet.py)"),
    ({"model": {"path": "/m"}, "nodes": []}, "'nodes' is empty: the fleet needs at least one node", None),
    ({"model": {"path": "/m", "revision": "x"}, "nodes": []}, "unknown key(s) under 'model': revision",
     "allowed keys: path, served_name"),
    ({"model": {"path": "/m"}, "nodes": [], "servers": {}, "extra": 1}, "unknown key(s) under 'fleet': extra, servers",
     "allowed keys: model, nodes, server"),
    (["not", "a", "mapping"], "'fleet' must be a mapping, got list ['not', 'a', 'mapping']", None),
    ({"model": {"path": "/m"}, "nodes": ["a"]}, "'nodes[0]' must be a mapping, got str 'a'", None),
    ({"model": {"path": "/m"}, "nodes": [{"ssh_conn_id": "s"}]}, "missing key 'nodes[0].name'",
     "add 'name' under 'nodes[0]' (see the example at the top of fleetgen/nodes/fleet.py)"),
    ({"model": {"path": "/m"}, "nodes": [{"name": "a", "address": "h"}]}, "missing key 'nodes[0] (a).ssh_conn_id'",
     "add 'ssh_conn_id' under 'nodes[0] (a)' (see the example at the top of fleetgen/nodes/fleet.py)"),
    ({"model": {"path": "/m"}, "nodes": [{"name": "a", "ssh_conn_id": "s"}]}, "missing key 'nodes[0] (a).address'",
     "add 'address' under 'nodes[0] (a)' (see the example at the top of fleetgen/nodes/fleet.py)"),
    ({"model": {"path": "/m"}, "nodes": [{"name": 7}]}, "'nodes[0].name' must be a string, got int 7", None),
    ({"model": {"path": "/m"}, "nodes": [{"name": "a", "ssh_conn_id": ["s"]}]},
     "'nodes[0] (a).ssh_conn_id' must be a string, got list ['s']", None),
    ({"model": {"path": "/m"}, "nodes": [{"name": "a", "ssh_conn_id": "s", "address": 10}]},
     "'nodes[0] (a).address' must be a string, got int 10", None),
    ({"model": "/m", "nodes": []}, "'fleet.model' must be a mapping, got str '/m'", None),
    ({"model": {"path": "/m"}, "nodes": [], "server": {"module": 1}}, "'server.module' must be a string, got int 1",
     None),
    ({"model": {"path": "/m"}, "nodes": [], "server": {"tp_size": "2"}},
     "'server.tp_size' must be an integer, got str '2'", None),
    ({"model": {"path": "/m"}, "nodes": [], "server": {"extra_args": "--x 1"}},
     "'server.extra_args' must be a list, got str '--x 1'", None),
    ({"model": {"path": "/m"}, "nodes": [], "server": {"bind_host": "any host"}},
     "'server.bind_host' 'any host' holds a space or other blank",
     "give the address the servers listen on: 0.0.0.0 (every IPv4 address), :: (every IPv6 address)"),
])
def test_the_documents_shape_is_checked_first(document, message, hint):
    with pytest.raises(ConfigError) as error:
        parse_fleet(document, source="f.yaml")
    assert (error.value.message, error.value.hint, error.value.path) == (message, hint, "f.yaml")


def test_a_fleet_without_a_source_names_itself_as_the_fleet():
    assert parse_fleet(BASE).source == "<fleet>"
    with pytest.raises(ConfigError) as error:
        parse_fleet({"model": {"path": "/m"}, "nodes": []})
    assert error.value.path == "<fleet>"


def test_an_unknown_server_key_lists_the_allowed_ones():
    with pytest.raises(ConfigError) as error:
        parse_fleet(_with(server__gpu_memory=0.9), source="fleet.yaml")
    assert error.value.path == "fleet.yaml"
    assert error.value.message == "unknown key(s) under 'server': gpu_memory"
    assert error.value.hint == ("allowed keys: api_key_conn_id, bind_host, env, extra_args, log_dir, module, python, "
                                "run_dir, stop_grace_s, tp_size")


@pytest.mark.parametrize("changes, message", [
    ({"server__tp_size": 0}, "'server.tp_size' must be >= 1, got 0"),
    ({"server__module": "1sglang"}, "'server.module' is not a Python module name: '1sglang'"),
    ({"server__module": "sglang.launch_server;rm"}, "'server.module' is not a Python module name"),
    ({"server__extra_args": ["--model-path=/other"]}, "'server.extra_args' sets --model-path, which the fleet decides"),
    ({"server__extra_args": ["--api-key", "k"]}, "'server.extra_args' sets --api-key, which the fleet decides"),
    ({"server__extra_args": ["--weight-version", "v2"]},
     "'server.extra_args' sets --weight-version, which the fleet decides"),
    ({"server__extra_args": ["--weight-version=v2"]},
     "'server.extra_args' sets --weight-version, which the fleet decides"),
    ({"server__env": {"BAD-NAME": "1"}}, "'server.env' has an invalid variable name 'BAD-NAME'"),
    ({"server__env": {"1X": "1"}}, "'server.env' has an invalid variable name '1X'"),
    ({"server__extra_args": ["--served-model-name=a=b"]},
     "'server.extra_args' sets --served-model-name, which the fleet decides"),
    ({"nodes__0__tp_groups": [[0], [-1]], "nodes__0__gpus": None},
     "'nodes[0] (a).tp_groups[1]' has a negative GPU index -1"),
    ({"nodes__0__tp_groups": [[0], ["1"]], "nodes__0__gpus": None}, "'nodes[0] (a).tp_groups[1]' must be an integer"),
    ({"nodes__0__tp_groups": [[0, 1]], "nodes__0__gpus": None}, "'nodes[0] (a).tp_groups[0]' has 2 GPUs but"),
    ({"nodes__0__tp_groups": [0], "nodes__0__gpus": None}, "'nodes[0] (a).tp_groups[0]' must be a list"),
    ({"nodes__0__tp_groups": "0", "nodes__0__gpus": None}, "'nodes[0] (a).tp_groups' must be a list"),
    ({"server__api_key_conn_id": "key", "server__extra_args": ["--config=my=1.yaml"]},
     "'server.extra_args' sets --config, but with server.api_key_conn_id the launch passes its own --config (it "
     "carries the API key) and SGLang reads only one"),
    ({"nodes__0__name": "-a"}, "'nodes[0].name' '-a' may hold only letters, digits, '_', '.', '-'"),
    ({"nodes__0__name": "a b"}, "'nodes[0].name' 'a b' may hold only"),
    ({"nodes__0__gpus": []}, "'nodes[0] (a)' has no GPUs"),
    ({"nodes__0__gpus": [0, -1]}, "'nodes[0] (a).gpus' has a negative GPU index -1"),
    ({"nodes__0__ports": [30000, 30001]}, "'nodes[0] (a).ports' lists 2 ports for 3 servers"),
    ({"nodes__0__ports": [30000, 30001, 30000]}, "'nodes[0] (a)' repeats a port: [30000, 30001, 30000]"),
    ({"nodes__0__base_port": 1023}, "'nodes[0] (a)' port 1023 is outside 1024-65535"),
    ({"nodes__0__base_port": 65534}, "'nodes[0] (a)' port 65536 is outside 1024-65535"),
    ({"nodes__0__ports": "30000"}, "'nodes[0] (a).ports' must be a list, got str"),
    ({"nodes__0__tp_groups": [[0]]}, "'nodes[0] (a)' sets both 'gpus' and 'tp_groups'; give one"),
])
def test_a_bad_setting_is_refused_with_its_key(changes, message):
    document = _with(**changes)
    for node in document["nodes"]:  # a node key set to None is left out (gpus, where tp_groups replace them)
        for key in [key for key, value in node.items() if value is None]:
            del node[key]
    with pytest.raises(ConfigError) as error:
        parse_fleet(document, source="fleet.yaml")
    assert error.value.message.startswith(message) and error.value.path == "fleet.yaml"


def test_the_api_key_connection_alone_and_a_config_file_alone_are_both_fine():
    assert parse_fleet(_with(server__api_key_conn_id="key")).server.api_key_conn_id == "key"
    assert parse_fleet(_with(server__extra_args=["--config", "my.yaml"])).server.extra_args == ("--config", "my.yaml")


@pytest.mark.parametrize("ports", [[1024, 1025, 65535], [65533, 65534, 65535]])
def test_the_first_and_last_usable_ports_are_accepted(ports):
    assert [s.port for s in parse_fleet(_with(nodes__0__ports=ports)).servers()][:3] == ports


def test_base_port_defaults_to_30000_and_counts_up_per_server():
    assert [s.port for s in parse_fleet(BASE).servers()[:3]] == [30000, 30001, 30002]


def test_gpu_0_is_a_gpu_like_any_other():
    document = _with()
    document["nodes"] = [{"name": "a", "ssh_conn_id": "s", "address": "h", "gpus": [0]}]
    assert parse_fleet(document).servers()[0].gpu_ids == (0,)


def test_tp_groups_must_each_hold_tp_size_gpus_and_no_gpu_twice():
    document = _with(server__tp_size=2)
    document["nodes"] = [{"name": "a", "ssh_conn_id": "s", "address": "h", "tp_groups": [[0, 1], [2]]}]
    with pytest.raises(ConfigError) as error:
        parse_fleet(document)
    assert error.value.message == "'nodes[0] (a).tp_groups[1]' has 1 GPUs but server.tp_size is 2 (x --dp-size)"
    document["nodes"][0]["tp_groups"] = [[0, 1], [1, 2]]
    with pytest.raises(ConfigError, match=r"'nodes\[0\] \(a\)' uses GPU\(s\) \[1\] more than once"):
        parse_fleet(document)
    document["nodes"][0]["tp_groups"] = [[0, 1], "23"]
    with pytest.raises(ConfigError, match=r"'nodes\[0\] \(a\).tp_groups\[1\]' must be a list"):
        parse_fleet(document)
    document["nodes"][0]["tp_groups"] = {"0": [0, 1]}
    with pytest.raises(ConfigError, match=r"'nodes\[0\] \(a\).tp_groups' must be a list"):
        parse_fleet(document)
    document["nodes"][0]["tp_groups"] = []
    with pytest.raises(ConfigError, match=r"'nodes\[0\] \(a\)' has no GPUs"):
        parse_fleet(document)


def test_gpus_not_a_multiple_of_the_server_width_name_the_count():
    document = _with(server__tp_size=2)
    document["nodes"] = [{"name": "a", "ssh_conn_id": "s", "address": "h", "gpus": [0, 1, 2]}]
    with pytest.raises(ConfigError) as error:
        parse_fleet(document)
    assert error.value.message == ("'nodes[0] (a).gpus' lists 3 GPUs, not a multiple of server.tp_size 2 "
                                   "(x --dp-size)")


def test_the_width_of_a_server_is_tp_size_times_dp_size():
    assert ServerSpec(tp_size=2, extra_args=("--dp-size", "3")).gpus_per_server == 6
    assert ServerSpec(tp_size=4).gpus_per_server == 4


def test_a_server_slot_names_itself_by_node_and_port():
    slot = parse_fleet(BASE).servers()[3]
    assert slot.to_dict() == {"node": "b", "ssh_conn_id": "ssh_b", "address": "10.0.0.2", "gpu_ids": [4],
                              "port": 31000, "name": "b:31000", "url": "http://10.0.0.2:31000"}


def test_a_node_is_found_by_name_and_an_unknown_one_is_named():
    fleet = parse_fleet(BASE, source="fleet.yaml")
    assert fleet.node("b").ssh_conn_id == "ssh_b" and fleet.node("a").ports == (30000, 30001, 30002)
    with pytest.raises(ConfigError) as error:
        fleet.node("c")
    assert str(error.value) == "[fleet.yaml] no node named 'c' in the fleet"


def test_a_bind_host_or_address_given_as_a_name_is_not_checked_for_its_family():
    parse_fleet(_with(server__bind_host="gpu-node-1", nodes__1__address="fd00::5"))
    parse_fleet(_with(server__bind_host="::", nodes__0__address="gpu-node-1", nodes__1__address="fd00::5"))


def test_a_bind_host_that_is_not_a_host_says_what_to_listen_on():
    with pytest.raises(ConfigError) as error:
        parse_fleet(_with(server__bind_host="every interface"))
    assert error.value.hint.startswith("give the address the servers listen on: 0.0.0.0")


def test_yaml_text_with_a_syntax_error_names_its_line_and_source():
    with pytest.raises(ConfigError) as error:
        load_fleet_text("model:\n  path: /m\n  bad: [\n", source="Variable fleetgen_fleet")
    assert error.value.path == "Variable fleetgen_fleet" and error.value.line == 4
    assert error.value.message.startswith("not valid YAML/JSON: ")


def test_a_fleet_file_is_read_and_names_itself_as_the_source(tmp_path):
    path = tmp_path / "fleet.yaml"
    path.write_text(json.dumps(BASE))
    fleet = load_fleet_file(str(path))
    assert fleet.source == str(path) and fleet == parse_fleet(BASE, source=str(path))
    with pytest.raises(ConfigError) as error:
        load_fleet_file(tmp_path)
    assert error.value.message == "cannot read the fleet file: Is a directory" and error.value.path == str(tmp_path)


def test_an_ipv4_node_behind_an_ipv6_bind_host_is_told_to_listen_on_every_ipv4_address():
    with pytest.raises(ConfigError) as error:
        parse_fleet(_with(server__bind_host="::"), source="fleet.yaml")
    assert error.value.path == "fleet.yaml"
    assert error.value.hint == ("set server.bind_host to '0.0.0.0' (every IPv4 address) and give every node an "
                                "address of that family, or a host name")


@pytest.mark.parametrize("changes, hint", [
    ({"nodes__1__ports": [31000]}, "keep 'ports' to list each server's port, or 'base_port' for consecutive ports"),
    ({"server__extra_args": ["--tp-size", "2"]},
     "use model.path, nodes[].ports/base_port, server.tp_size or server.api_key_conn_id instead "
     "(the launch sets --weight-version to know each launch by)"),
    ({"server__api_key_conn_id": "key", "server__extra_args": ["--config", "c.yaml"]},
     "move the options of that file into server.extra_args"),
])
def test_a_refused_setting_says_what_to_use_instead(changes, hint):
    with pytest.raises(ConfigError) as error:
        parse_fleet(_with(**changes), source="fleet.yaml")
    assert error.value.hint == hint and error.value.path == "fleet.yaml"


def test_environment_variable_names_may_be_lower_case():
    fleet = parse_fleet(_with(server__env={"http_proxy": "http://proxy:3128", "NCCL_DEBUG": "WARN"}))
    assert fleet.server.env == (("NCCL_DEBUG", "WARN"), ("http_proxy", "http://proxy:3128"))


def test_the_expected_kind_is_named_in_words():
    from fleetgen.nodes.fleet import _typed

    with pytest.raises(ConfigError) as error:
        _typed(1, "w", bool, "s")
    assert error.value.message == "'w' must be true/false, got int 1"
    with pytest.raises(ConfigError) as error:
        _typed("x", "w", tuple, "s")
    assert error.value.message == "'w' must be tuple, got str 'x'"


def test_yaml_errors_say_what_the_parser_found():
    with pytest.raises(ConfigError) as error:
        load_fleet_text("model: [\n", source="f.yaml")
    assert error.value.message == "not valid YAML/JSON: expected the node content, but found '<stream end>'"
    assert error.value.line == 2
    # A character YAML refuses outright: no position mark, the reader's own words.
    with pytest.raises(ConfigError) as error:
        load_fleet_text("model: \x07\n", source="f.yaml")
    assert error.value.message.startswith("not valid YAML/JSON: unacceptable character #x0007")
    assert error.value.line is None and error.value.path == "f.yaml"
