"""Apply ``airflow_settings.yaml`` to a plain Airflow's metadata database (connections, variables, pools).

``python -m fleetgen.airflow.apply_settings airflow_settings.yaml``: upserts, so it can run on
every start. Needs an initialised database (``airflow db migrate``).
"""

from __future__ import annotations

import argparse
import sys

from fleetgen.errors import FleetgenError
from fleetgen.airflow.settings_file import Settings, load_settings


def apply_to_db(settings: Settings) -> None:
    from airflow.models import Connection, Pool, Variable
    from airflow.utils.session import create_session

    with create_session() as session:
        for conn in settings.connections:
            session.query(Connection).filter(Connection.conn_id == conn.conn_id).delete()
            session.add(Connection(conn_id=conn.conn_id, uri=None, **{
                "conn_type": conn.conn_type, "host": conn.host, "port": conn.port, "login": conn.login,
                "password": conn.password, "schema": conn.schema,
                "extra": __import__("json").dumps(conn.extra) if conn.extra else None}))
        for key, value in settings.variables:
            session.query(Variable).filter(Variable.key == key).delete()
            session.add(Variable(key=key, val=value))
        for pool in settings.pools:
            existing = session.query(Pool).filter(Pool.pool == pool.name).one_or_none()
            if existing is None:
                session.add(Pool(pool=pool.name, slots=pool.slots, description=pool.description,
                                 include_deferred=False))
            else:
                existing.slots, existing.description = pool.slots, pool.description


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fleetgen.airflow.apply_settings", description=__doc__.splitlines()[0])
    parser.add_argument("settings", help="path of airflow_settings.yaml")
    args = parser.parse_args(argv)
    try:
        settings = load_settings(args.settings)
    except FleetgenError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    apply_to_db(settings)
    print(f"applied {len(settings.connections)} connection(s), {len(settings.variables)} variable(s), "
          f"{len(settings.pools)} pool(s) from {args.settings}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
