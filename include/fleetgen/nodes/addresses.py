"""Hosts in the fleet description: what an address may be, how it is written canonically, and server URLs.

A node's ``address`` is where the workers reach its servers over HTTP and ``server.bind_host`` what they listen
on: an IPv4 address, an IPv6 address (brackets optional) or a DNS name, never a port, URL, blank or IPv6 zone
(docs/architecture.md). Every server URL is built here (``http_url``), an IPv6 address in brackets.
"""

from __future__ import annotations

import ipaddress
import re

from fleetgen.errors import ConfigError

# A DNS name (RFC 1123 labels; '_' too, which /etc/hosts and some internal zones use).
_HOST_LABEL_RE = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?$")
_ADDRESS_HINT = "give the bare host the workers reach the node's servers at, e.g. 10.0.0.5, fd00::5 or gpu-node-1"
BIND_HINT = "give the address the servers listen on: 0.0.0.0 (every IPv4 address), :: (every IPv6 address)"


def url_host(host: str) -> str:
    """``host`` as the host part of a URL or ``host:port``: an IPv6 address goes in brackets (RFC 3986 §3.2.2)."""
    return f"[{host}]" if ":" in host else host


def http_url(host: str, port: int) -> str:
    """The base URL of a server; every URL fleetgen builds for a fleet address comes from here."""
    return f"http://{url_host(host)}:{int(port)}"


def parse_host(value: str, where: str, source: str, *, hint: str = _ADDRESS_HINT) -> str:
    """A host from the fleet file: an IPv4 or IPv6 address (brackets optional) or a DNS name.

    Returned canonical (an IPv6 address compressed, without brackets), so that two spellings of one address
    compare equal. Anything else (a port, a URL, a space, nothing) is refused here, before any server is
    touched, instead of failing in URL parsing after the relaunch.
    """
    def refuse(problem: str, what_to_do: str = hint) -> ConfigError:
        return ConfigError(f"'{where}' {value!r} {problem}", path=source, hint=what_to_do)

    if not value.strip():
        raise refuse("is empty")
    if any(char.isspace() for char in value):
        raise refuse("holds a space or other blank")
    if "/" in value:
        raise refuse("is a URL or holds a path", f"the fleet builds http://host:port itself: {hint}")
    text = value
    if text.startswith("["):
        inner, closed, rest = text[1:].partition("]")
        if closed and rest.startswith(":"):
            raise refuse("holds a port", "give the port in nodes[].ports or base_port, not in the address")
        if not closed or rest:
            raise refuse("is not a bracketed IPv6 address")
        text = inner
    if "%" in text:
        raise refuse("has an IPv6 zone (%interface), which a URL cannot carry portably",
                     "use the node's global or unique-local IPv6 address, or its host name")
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        pass
    if ":" in text:
        host, _, port = text.rpartition(":")
        if port.isdigit() and ":" not in host:
            raise refuse("holds a port", "give the port in nodes[].ports or base_port, not in the address")
        raise refuse("is not a valid IPv6 address")
    labels = text[:-1].split(".") if text.endswith(".") else text.split(".")
    if all(label.isdigit() for label in labels):
        raise refuse("is not a valid IPv4 address")
    if len(text) > 253 or not all(_HOST_LABEL_RE.match(label) for label in labels):
        raise refuse("is not a host name or IP address")
    return text


def ip_of(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The IP address ``host`` spells, or None for a host name."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def is_loopback(host: str) -> bool:
    """A loopback address or ``localhost``: it reaches many machines (tunnels), so it identifies none."""
    ip = ip_of(host)
    return ip.is_loopback if ip is not None else host.lower().rstrip(".") == "localhost"
