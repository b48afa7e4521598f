"""``airflow_settings.yaml`` (the Astro CLI format) for a plain Airflow: one source of truth.

The Astro CLI reads this file itself; plain Airflow, the demo and the tests read it through here.
``${NAME}`` in the file is replaced from the environment before parsing (so a host key or a port
chosen at setup time need not be committed); a name that is not set is an error naming the line.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from fleetgen.errors import ConfigError

_PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True)
class Connection:
    conn_id: str
    conn_type: str
    host: str | None = None
    port: int | None = None
    login: str | None = None
    password: str | None = None
    schema: str | None = None
    extra: dict = field(default_factory=dict)

    def to_json(self) -> str:
        """Airflow's JSON connection form (what AIRFLOW_CONN_<ID> accepts)."""
        document = {"conn_type": self.conn_type, "host": self.host, "port": self.port, "login": self.login,
                    "password": self.password, "schema": self.schema, "extra": self.extra or None}
        return json.dumps({k: v for k, v in document.items() if v is not None})


@dataclass(frozen=True)
class Pool:
    name: str
    slots: int
    description: str = ""


@dataclass(frozen=True)
class Settings:
    connections: tuple[Connection, ...]
    pools: tuple[Pool, ...]
    variables: tuple[tuple[str, str], ...]

    def environment(self) -> dict[str, str]:
        """AIRFLOW_CONN_* / AIRFLOW_VAR_* variables: enough for tasks, `dags test` and `dag.test()`."""
        env = {f"AIRFLOW_CONN_{c.conn_id.upper()}": c.to_json() for c in self.connections}
        env.update({f"AIRFLOW_VAR_{key.upper()}": value for key, value in self.variables})
        return env


def expand(text: str, env: Mapping[str, str], *, source: str) -> str:
    lines = text.splitlines(keepends=True)
    for number, line in enumerate(lines, start=1):
        if line.lstrip().startswith("#"):
            continue
        for name in _PLACEHOLDER.findall(line):
            if name not in env:
                raise ConfigError(f"${{{name}}} is not set in the environment", path=source, line=number,
                                  hint=f"export {name}=... before applying the settings")
    return _PLACEHOLDER.sub(lambda m: env[m.group(1)], "".join(
        line if not line.lstrip().startswith("#") else "\n" for line in lines))


def load_settings(path: str | Path, env: Mapping[str, str] | None = None) -> Settings:
    import yaml

    path = Path(path)
    source = str(path)
    try:
        text = expand(path.read_text(), os.environ if env is None else env, source=source)
    except OSError as exc:
        raise ConfigError(f"cannot read settings: {exc.strerror}", path=source) from None
    try:
        document = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise ConfigError(f"not valid YAML: {getattr(exc, 'problem', exc)}", path=source,
                          line=mark.line + 1 if mark else None) from None
    airflow_doc = document.get("airflow") or {}
    if not isinstance(airflow_doc, dict):
        raise ConfigError("'airflow' must be a mapping", path=source)
    connections = []
    for index, item in enumerate(airflow_doc.get("connections") or []):
        if not isinstance(item, dict) or "conn_id" not in item or "conn_type" not in item:
            raise ConfigError(f"connections[{index}] needs conn_id and conn_type", path=source)
        extra = item.get("conn_extra") or {}
        if isinstance(extra, str):
            try:
                extra = json.loads(extra)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"connections[{index}].conn_extra is not valid JSON: {exc}", path=source) from None
        port = item.get("conn_port")
        connections.append(Connection(
            conn_id=item["conn_id"], conn_type=item["conn_type"], host=item.get("conn_host"),
            port=_integer(port, f"connections[{index}].conn_port", source) if port not in (None, "") else None,
            login=item.get("conn_login"),
            password=None if item.get("conn_password") is None else str(item["conn_password"]),
            schema=item.get("conn_schema"), extra=extra))
    pools = []
    for index, item in enumerate(airflow_doc.get("pools") or []):
        if not isinstance(item, dict) or "pool_name" not in item or "pool_slot" not in item:
            raise ConfigError(f"pools[{index}] needs pool_name and pool_slot", path=source)
        pools.append(Pool(item["pool_name"], _integer(item["pool_slot"], f"pools[{index}].pool_slot", source),
                          item.get("pool_description", "")))
    variables = []
    for index, item in enumerate(airflow_doc.get("variables") or []):
        if not isinstance(item, dict) or "variable_name" not in item:
            raise ConfigError(f"variables[{index}] needs variable_name", path=source)
        value = item.get("variable_value", "")
        variables.append((item["variable_name"], value if isinstance(value, str) else json.dumps(value)))
    return Settings(tuple(connections), tuple(pools), tuple(variables))


def _integer(value, where: str, source: str) -> int:
    """An integer field's value; YAML's ``true`` is not 1 here (``int(True)`` would make it a port or a slot)."""
    try:
        if not isinstance(value, bool):
            return int(value)
    except (TypeError, ValueError):
        pass
    raise ConfigError(f"{where} must be an integer, got {value!r}", path=source)
