"""The fleet description: which nodes, which GPUs, which ports, which server command.

One YAML/JSON document (a file, or the Airflow Variable ``fleetgen_fleet``) validated into frozen
dataclasses. It is read inside the first task, never at DAG parse time, and checked whole before any node
is touched; any problem names the key and the node it concerns. Two entries reaching one machine (same
``ssh_conn_id``, or same non-loopback ``address``) may share no GPU and no port (docs/architecture.md).

Example::

    model:
      path: /models/qwen3.6-27b          # on the node: config.json + model.safetensors.index.json
      served_name: qwen3.6-27b
    server:
      python: /opt/sglang/bin/python     # interpreter on the node
      module: sglang.launch_server       # the simulated node uses sglang_sim.server
      tp_size: 1
      extra_args: [--speculative-algorithm, NEXTN, --reasoning-parser, qwen3]
      run_dir: ~/fleetgen/run            # pid files
      log_dir: ~/fleetgen/logs
      bind_host: 0.0.0.0                 # what the servers listen on: IPv4 only; "::" (IPv6 only) when
                                         # the addresses are IPv6
      api_key_conn_id: sglang_api_key    # optional: Airflow connection whose password is the key
    nodes:
      - name: node0
        ssh_conn_id: fleetgen_node0
        address: 10.0.0.5                # where workers reach the servers over HTTP: a host name or an
                                         # IPv4/IPv6 address (fd00::5), never a port or URL
        gpus: [0, 1, 2, 3, 4, 5, 6]      # or tp_groups: [[0, 1], [2, 3]]
        base_port: 30000
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetgen.errors import ConfigError
from fleetgen.nodes.addresses import BIND_HINT, http_url, ip_of, is_loopback, parse_host, url_host
from fleetgen.nodes import launch_identity
from fleetgen.nodes.remote import dp_size_of_args

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")
def _require(mapping: dict, key: str, where: str, kind: type | tuple[type, ...], source: str) -> Any:
    if key not in mapping:
        raise ConfigError(f"missing key '{where}.{key}'", path=source,
                          hint=f"add '{key}' under '{where}' (see the example at the top of fleetgen/nodes/fleet.py)")
    return _typed(mapping[key], f"{where}.{key}", kind, source)


def _typed(value: Any, where: str, kind: type | tuple[type, ...], source: str) -> Any:
    # bool is an int in Python; a port of `true` is a mistake, not 1.
    if isinstance(value, bool) and kind is not bool and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise ConfigError(f"'{where}' must be {_kind_name(kind)}, got a boolean", path=source)
    if not isinstance(value, kind):
        raise ConfigError(f"'{where}' must be {_kind_name(kind)}, got {type(value).__name__} {value!r}", path=source)
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join({"str": "a string", "int": "an integer", "list": "a list", "dict": "a mapping",
                        "bool": "true/false", "float": "a number"}.get(k.__name__, k.__name__) for k in kinds)


def _check_unknown(mapping: dict, allowed: set[str], where: str, source: str) -> None:
    unknown = sorted(set(mapping) - allowed)
    if unknown:
        raise ConfigError(f"unknown key(s) under '{where}': {', '.join(unknown)}", path=source,
                          hint=f"allowed keys: {', '.join(sorted(allowed))}")


@dataclass(frozen=True)
class ModelSpec:
    path: str
    served_name: str


@dataclass(frozen=True)
class ServerSpec:
    python: str = "python3"
    module: str = "sglang.launch_server"
    tp_size: int = 1
    extra_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    run_dir: str = "~/fleetgen/run"
    log_dir: str = "~/fleetgen/logs"
    bind_host: str = "0.0.0.0"
    api_key_conn_id: str | None = None
    stop_grace_s: float = 30.0

    @property
    def gpus_per_server(self) -> int:
        """GPUs one server holds: tp_size for each data-parallel replica (--dp-size in extra_args)."""
        return self.tp_size * dp_size_of_args(self.extra_args)


@dataclass(frozen=True)
class NodeSpec:
    name: str
    ssh_conn_id: str
    address: str
    gpu_groups: tuple[tuple[int, ...], ...]
    ports: tuple[int, ...]


@dataclass(frozen=True)
class ServerSlot:
    """One server the fleet runs: a node, its GPU(s) and a port."""

    node: str
    ssh_conn_id: str
    address: str
    gpu_ids: tuple[int, ...]
    port: int

    @property
    def name(self) -> str:
        return f"{self.node}:{self.port}"

    @property
    def url(self) -> str:
        return http_url(self.address, self.port)

    def to_dict(self) -> dict:
        return {"node": self.node, "ssh_conn_id": self.ssh_conn_id, "address": self.address,
                "gpu_ids": list(self.gpu_ids), "port": self.port, "name": self.name, "url": self.url}


@dataclass(frozen=True)
class FleetSpec:
    model: ModelSpec
    server: ServerSpec
    nodes: tuple[NodeSpec, ...]
    source: str = "<fleet>"

    def servers(self) -> list[ServerSlot]:
        return [ServerSlot(node.name, node.ssh_conn_id, node.address, group, port)
                for node in self.nodes for group, port in zip(node.gpu_groups, node.ports)]

    def node(self, name: str) -> NodeSpec:
        for node in self.nodes:
            if node.name == name:
                return node
        raise ConfigError(f"no node named '{name}' in the fleet", path=self.source)

    def to_dict(self) -> dict:
        """The canonical JSON-safe form (round-trips through ``parse_fleet``)."""
        return {
            "model": {"path": self.model.path, "served_name": self.model.served_name},
            "server": {
                "python": self.server.python, "module": self.server.module, "tp_size": self.server.tp_size,
                "extra_args": list(self.server.extra_args), "env": dict(self.server.env),
                "run_dir": self.server.run_dir, "log_dir": self.server.log_dir,
                "bind_host": self.server.bind_host, "api_key_conn_id": self.server.api_key_conn_id,
                "stop_grace_s": self.server.stop_grace_s,
            },
            "nodes": [{"name": n.name, "ssh_conn_id": n.ssh_conn_id, "address": n.address,
                       "tp_groups": [list(g) for g in n.gpu_groups], "ports": list(n.ports)} for n in self.nodes],
        }


# Flags the fleet decides itself; a user passing them in extra_args would fight the launcher.
# --weight-version carries each launch's identity (nodes/launch_identity.py): every completion is checked against it.
RESERVED_FLAGS = ("--model-path", "--model", "--port", "--host", "--served-model-name", "--tp-size",
                  "--tensor-parallel-size", "--api-key", launch_identity.FLAG)


def parse_fleet(document: dict, *, source: str = "<fleet>") -> FleetSpec:
    """Validate a fleet document (already decoded from YAML/JSON)."""
    _typed(document, "fleet", dict, source)
    _check_unknown(document, {"model", "server", "nodes"}, "fleet", source)
    model_doc = _require(document, "model", "fleet", dict, source)
    _check_unknown(model_doc, {"path", "served_name"}, "model", source)
    model_path = _require(model_doc, "path", "model", str, source)
    served_name = _typed(model_doc.get("served_name", Path(model_path).name), "model.served_name", str, source)
    model = ModelSpec(path=model_path, served_name=served_name)

    server = _parse_server(_typed(document.get("server", {}), "server", dict, source), source)
    nodes_doc = _require(document, "nodes", "fleet", list, source)
    if not nodes_doc:
        raise ConfigError("'nodes' is empty: the fleet needs at least one node", path=source)
    nodes = tuple(_parse_node(node_doc, index, server.gpus_per_server, source)
                  for index, node_doc in enumerate(nodes_doc))

    names = [n.name for n in nodes]
    for name in names:
        if names.count(name) > 1:
            raise ConfigError(f"node name '{name}' appears {names.count(name)} times", path=source)
    _check_machines(nodes, source)
    seen_endpoints: dict[tuple[str, int], str] = {}
    for node in nodes:
        for port in node.ports:
            other = seen_endpoints.setdefault((node.address.lower(), port), node.name)
            if other != node.name:
                raise ConfigError(f"nodes '{other}' and '{node.name}' both serve {url_host(node.address)}:{port}",
                                  path=source, hint="give one of them other nodes[].ports / base_port")
    _check_bind_family(server, nodes, source)
    return FleetSpec(model=model, server=server, nodes=nodes, source=source)


def _same_machine(first: NodeSpec, second: NodeSpec) -> str | None:
    """What makes two entries the same machine: the SSH connection that launches their servers, or the
    address their servers answer at; None when neither is shared. A loopback address alone proves nothing:
    the worker reaches other machines through it only by forwarded ports (SSH tunnels, the simulator)."""
    if first.ssh_conn_id == second.ssh_conn_id:
        return f"SSH connection '{first.ssh_conn_id}'"
    if first.address.lower() == second.address.lower() and not is_loopback(first.address):
        return f"address {first.address}"
    return None


def _check_machines(nodes: tuple[NodeSpec, ...], source: str) -> None:
    """Two entries for one machine must not share a GPU (two servers each sizing the whole GPU for itself
    run each other out of memory) nor a port (one binds it, the other dies; they share pid files)."""
    for index, node in enumerate(nodes):
        for earlier in nodes[:index]:
            shared = _same_machine(earlier, node)
            if shared is None:
                continue
            gpus = sorted({g for group in node.gpu_groups for g in group}
                          & {g for group in earlier.gpu_groups for g in group})
            if gpus:
                raise ConfigError(
                    f"nodes '{earlier.name}' and '{node.name}' both reach the machine of {shared} and both use "
                    f"GPU(s) {gpus}: two servers would share each of them and run out of memory", path=source,
                    hint=f"if '{node.name}' was copied from '{earlier.name}', give it its own ssh_conn_id and "
                         f"address; if both are one machine, split its GPUs between their nodes[].gpus / tp_groups")
            ports = sorted(set(node.ports) & set(earlier.ports))
            if ports:
                raise ConfigError(
                    f"nodes '{earlier.name}' and '{node.name}' both reach the machine of {shared} and both use "
                    f"port(s) {ports}", path=source, hint="give one of them other nodes[].ports / base_port")


def _check_bind_family(server: ServerSpec, nodes: tuple[NodeSpec, ...], source: str) -> None:
    """A server bound to an address of one family is unreachable at an address of the other. SGLang's HTTP
    server (uvicorn on uvloop) binds a literal host on one socket, and uvloop sets IPV6_V6ONLY on an IPv6
    one (uvloop/loop.pyx ``create_server``): ``--host ::`` serves IPv6 only, ``0.0.0.0`` IPv4 only."""
    bind = ip_of(server.bind_host)
    if bind is None:
        return
    for index, node in enumerate(nodes):
        address = ip_of(node.address)
        if address is not None and address.version != bind.version:
            wildcard = "::" if address.version == 6 else "0.0.0.0"
            raise ConfigError(
                f"'nodes[{index}] ({node.name}).address' {node.address} is IPv{address.version} but "
                f"server.bind_host {server.bind_host} listens on IPv{bind.version} only", path=source,
                hint=f"set server.bind_host to '{wildcard}' (every IPv{address.version} address) and give every "
                     f"node an address of that family, or a host name")


def _parse_server(doc: dict, source: str) -> ServerSpec:
    allowed = {"python", "module", "tp_size", "extra_args", "env", "run_dir", "log_dir", "bind_host",
               "api_key_conn_id", "stop_grace_s"}
    _check_unknown(doc, allowed, "server", source)
    defaults = ServerSpec()
    module = _typed(doc.get("module", defaults.module), "server.module", str, source)
    if not _MODULE_RE.match(module):
        raise ConfigError(f"'server.module' is not a Python module name: {module!r}", path=source)
    tp_size = _typed(doc.get("tp_size", 1), "server.tp_size", int, source)
    if tp_size < 1:
        raise ConfigError(f"'server.tp_size' must be >= 1, got {tp_size}", path=source)
    extra_args = _typed(doc.get("extra_args", []), "server.extra_args", list, source)
    for position, arg in enumerate(extra_args):
        _typed(arg, f"server.extra_args[{position}]", (str, int, float), source)
        if isinstance(arg, str) and arg.split("=", 1)[0] in RESERVED_FLAGS:
            raise ConfigError(f"'server.extra_args' sets {arg.split('=', 1)[0]}, which the fleet decides",
                              path=source, hint="use model.path, nodes[].ports/base_port, server.tp_size or "
                                                "server.api_key_conn_id instead (the launch sets --weight-version "
                                                "to know each launch by)")
    env = _typed(doc.get("env", {}), "server.env", dict, source)
    for key, value in env.items():
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", str(key)):
            raise ConfigError(f"'server.env' has an invalid variable name {key!r}", path=source)
        _typed(value, f"server.env.{key}", (str, int, float), source)
    grace = _typed(doc.get("stop_grace_s", defaults.stop_grace_s), "server.stop_grace_s", (int, float), source)
    api_key_conn_id = doc.get("api_key_conn_id")
    if api_key_conn_id is not None:
        _typed(api_key_conn_id, "server.api_key_conn_id", str, source)
        if any(isinstance(arg, str) and arg.split("=", 1)[0] == "--config" for arg in extra_args):
            # The key reaches SGLang in its --config file (docs/security-and-ssh.md §2); SGLang takes one.
            raise ConfigError("'server.extra_args' sets --config, but with server.api_key_conn_id the launch passes "
                              "its own --config (it carries the API key) and SGLang reads only one", path=source,
                              hint="move the options of that file into server.extra_args")
    run_dir = _typed(doc.get("run_dir", defaults.run_dir), "server.run_dir", str, source)
    if "\n" in run_dir or "\r" in run_dir:
        # Our launch marker names the pid file under it, read back from /proc/PID/environ one line a variable.
        raise ConfigError(f"'server.run_dir' holds a line break: {run_dir!r}", path=source,
                          hint="name a folder without line breaks for the servers' pid files")
    return ServerSpec(
        python=_typed(doc.get("python", defaults.python), "server.python", str, source),
        module=module,
        tp_size=tp_size,
        extra_args=tuple(str(a) for a in extra_args),
        env=tuple(sorted((str(k), str(v)) for k, v in env.items())),
        run_dir=run_dir,
        log_dir=_typed(doc.get("log_dir", defaults.log_dir), "server.log_dir", str, source),
        bind_host=parse_host(_typed(doc.get("bind_host", defaults.bind_host), "server.bind_host", str, source),
                             "server.bind_host", source, hint=BIND_HINT),
        api_key_conn_id=api_key_conn_id,
        stop_grace_s=float(grace),
    )


def _parse_node(doc: Any, index: int, tp_size: int, source: str) -> NodeSpec:
    where = f"nodes[{index}]"
    _typed(doc, where, dict, source)
    name = _require(doc, "name", where, str, source)
    if not _NAME_RE.match(name):
        raise ConfigError(f"'{where}.name' {name!r} may hold only letters, digits, '_', '.', '-'", path=source)
    where = f"nodes[{index}] ({name})"
    _check_unknown(doc, {"name", "ssh_conn_id", "address", "gpus", "tp_groups", "base_port", "ports"}, where, source)
    ssh_conn_id = _require(doc, "ssh_conn_id", where, str, source)
    address = parse_host(_require(doc, "address", where, str, source), f"{where}.address", source)
    if "gpus" in doc and "tp_groups" in doc:
        raise ConfigError(f"'{where}' sets both 'gpus' and 'tp_groups'; give one", path=source)
    if "tp_groups" in doc:
        groups_doc = _typed(doc["tp_groups"], f"{where}.tp_groups", list, source)
        groups = []
        for g_index, group in enumerate(groups_doc):
            _typed(group, f"{where}.tp_groups[{g_index}]", list, source)
            if len(group) != tp_size:
                raise ConfigError(f"'{where}.tp_groups[{g_index}]' has {len(group)} GPUs but server.tp_size is "
                                  f"{tp_size} (x --dp-size)", path=source)
            groups.append(tuple(_gpu_id(g, f"{where}.tp_groups[{g_index}]", source) for g in group))
    else:
        gpus_doc = _require(doc, "gpus", where, list, source)
        gpus = [_gpu_id(g, f"{where}.gpus", source) for g in gpus_doc]
        if len(gpus) % tp_size:
            raise ConfigError(f"'{where}.gpus' lists {len(gpus)} GPUs, not a multiple of server.tp_size "
                              f"{tp_size} (x --dp-size)", path=source)
        groups = [tuple(gpus[i:i + tp_size]) for i in range(0, len(gpus), tp_size)]
    if not groups:
        raise ConfigError(f"'{where}' has no GPUs", path=source)
    flat = [g for group in groups for g in group]
    duplicates = sorted({g for g in flat if flat.count(g) > 1})
    if duplicates:
        raise ConfigError(f"'{where}' uses GPU(s) {duplicates} more than once", path=source)
    if "ports" in doc and "base_port" in doc:
        raise ConfigError(f"'{where}' sets both 'ports' and 'base_port'; give one", path=source,
                          hint="keep 'ports' to list each server's port, or 'base_port' for consecutive ports")
    if "ports" in doc:
        ports = [_typed(p, f"{where}.ports", int, source) for p in _typed(doc["ports"], f"{where}.ports", list, source)]
        if len(ports) != len(groups):
            raise ConfigError(f"'{where}.ports' lists {len(ports)} ports for {len(groups)} servers", path=source)
    else:
        base_port = _typed(doc.get("base_port", 30000), f"{where}.base_port", int, source)
        ports = [base_port + i for i in range(len(groups))]
    for port in ports:
        if not 1024 <= port <= 65535:
            raise ConfigError(f"'{where}' port {port} is outside 1024-65535", path=source)
    if len(set(ports)) != len(ports):
        raise ConfigError(f"'{where}' repeats a port: {ports}", path=source)
    return NodeSpec(name=name, ssh_conn_id=ssh_conn_id, address=address, gpu_groups=tuple(groups), ports=tuple(ports))


def _gpu_id(value: Any, where: str, source: str) -> int:
    value = _typed(value, where, int, source)
    if value < 0:
        raise ConfigError(f"'{where}' has a negative GPU index {value}", path=source)
    return value


def load_fleet_text(text: str, *, source: str) -> FleetSpec:
    """Parse YAML (a superset of JSON) text; syntax errors name the line."""
    import yaml

    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise ConfigError(f"not valid YAML/JSON: {getattr(exc, 'problem', exc)}", path=source,
                          line=(mark.line + 1) if mark is not None else None) from None
    return parse_fleet(document, source=source)


def load_fleet_file(path: str | Path) -> FleetSpec:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read the fleet file: {exc.strerror}", path=str(path)) from None
    return load_fleet_text(text, source=str(path))


def fleet_from_json(data: str | dict) -> FleetSpec:
    """Rebuild from the canonical form that travels in XCom."""
    return parse_fleet(json.loads(data) if isinstance(data, str) else data, source="<xcom>")
