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
