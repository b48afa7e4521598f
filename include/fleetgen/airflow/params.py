"""The DAG's ``Param``s, built from the run configuration's declarations (``fleetgen.airflow.run_config``).

Each Param carries its declaration's title, section, default and bounds; the description states the bounds
too, because the trigger form clamps a number silently.
"""

from __future__ import annotations

from pathlib import Path

from airflow.sdk import Param

from fleetgen.airflow.run_config import RunConfig, Setting

_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string", Path: "string"}


def dag_param(spec: Setting) -> Param:
    schema: dict = {"title": spec.title, "section": spec.section}
    description = spec.description
    if spec.choices:
        schema["enum"] = list(spec.choices)
    elif spec.kind in (int, float):
        schema["type"] = _JSON_TYPES[spec.kind]
        schema["exclusiveMinimum" if spec.low_open else "minimum"] = spec.low
        schema["maximum"] = spec.high
        description = f"{description} Allowed: {spec.allowed()}."
    elif spec.kind is list:  # the form edits it as JSON
        schema["type"] = "array"
        schema["items"] = {"type": "object"}
    elif spec.kind is dict:  # the form edits it as JSON too
        schema["type"] = "object"
    elif spec.optional:
        schema["type"] = ["null", "string"]
    else:
        schema["type"] = _JSON_TYPES[spec.kind]
        if spec.kind is not bool:
            schema["minLength"] = 1
    return Param(spec.default_value(), description=description, **schema)


def dag_params() -> dict[str, Param]:
    """Every DAG parameter, in the form's order (the sections a normal run touches first)."""
    return {spec.name: dag_param(spec) for spec in RunConfig.settings()}
