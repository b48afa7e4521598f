"""Hosts in the fleet description: what an address may be, its canonical spelling, and server URLs."""

import ipaddress

import pytest

from fleetgen.errors import ConfigError
from fleetgen.nodes.addresses import http_url, ip_of, is_loopback, parse_host, url_host


def test_urls_take_an_integer_port_and_bracket_only_ipv6():
    assert http_url("fd00::5", "30000") == "http://[fd00::5]:30000"
    assert url_host("10.0.0.1") == "10.0.0.1" and url_host("::1") == "[::1]"


@pytest.mark.parametrize("address, canonical", [
    ("gpu-node-1.", "gpu-node-1."), ("[10.0.0.1]", "10.0.0.1"), ("NODE_7", "NODE_7"),
    ("a" * 63 + ".example", "a" * 63 + ".example"), ("0.0.0.0", "0.0.0.0"),
    (".".join(["a" * 63] * 3) + "." + "b" * 61, ".".join(["a" * 63] * 3) + "." + "b" * 61),
])
def test_host_names_and_bracketed_addresses_are_accepted(address, canonical):
    assert parse_host(address, "x", "s") == canonical


@pytest.mark.parametrize("address, problem", [
    ("a" * 64 + ".example", "is not a host name or IP address"),
    (".".join(["a" * 63] * 3) + "." + "b" * 62, "is not a host name or IP address"),
    ("-node", "is not a host name or IP address"),
    ("node-", "is not a host name or IP address"),
    ("node..x", "is not a host name or IP address"),
    ("[fd00::5", "is not a bracketed IPv6 address"),
    ("[fd00::5]x", "is not a bracketed IPv6 address"),
    ("1.2.3", "is not a valid IPv4 address"),
    ("10.0.0.1.", "is not a valid IPv4 address"),
    ("node:30000", "holds a port"),
    ("a:b:30000", "is not a valid IPv6 address"),
    ("node:http", "is not a valid IPv6 address"),
    ("\t", "is empty"),
])
def test_addresses_that_are_not_hosts_are_refused(address, problem):
    with pytest.raises(ConfigError) as error:
        parse_host(address, "nodes[0] (a).address", "fleet.yaml")
    assert error.value.message == f"'nodes[0] (a).address' {address!r} {problem}" and error.value.path == "fleet.yaml"


@pytest.mark.parametrize("address, problem, hint", [
    ("10.0.0.1:30000", "holds a port", "give the port in nodes[].ports or base_port, not in the address"),
    ("[fd00::5]:30000", "holds a port", "give the port in nodes[].ports or base_port, not in the address"),
    ("fe80::1%eth0", "has an IPv6 zone (%interface), which a URL cannot carry portably",
     "use the node's global or unique-local IPv6 address, or its host name"),
    ("[fd00::5]]", "is not a bracketed IPv6 address", None),
    ("gpu_node!.", "is not a host name or IP address", None),
])
def test_an_address_that_is_not_a_bare_host_says_what_to_give(address, problem, hint):
    with pytest.raises(ConfigError) as error:
        parse_host(address, "nodes[0] (a).address", "fleet.yaml")
    assert error.value.message == f"'nodes[0] (a).address' {address!r} {problem}"
    assert hint is None or error.value.hint == hint


@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("localhost", True), ("LocalHost.", True),
    ("10.0.0.1", False), ("fd00::5", False), ("gpu-node-1", False), ("localhost.example", False),
])
def test_only_loopback_addresses_and_localhost_are_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_a_host_name_spells_no_ip_address():
    assert ip_of("gpu-node-1") is None
    assert ip_of("fd00::5") == ipaddress.IPv6Address("fd00::5") and ip_of("10.0.0.5").version == 4
