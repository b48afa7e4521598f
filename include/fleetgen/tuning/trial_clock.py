"""The tuning trial's time cap (DAG parameter ``tuning_trial_max_s``, docs/tuning-trial.md §5): the trial began when
its first shard started, and every trial shard, a retry included, starts no prompt past ``began + max_s``.

The first shard to start writes ``RunLayout.trial_began`` whole and only if it is absent (a hard link of a finished
file: no reader ever sees it half written); every later shard reads the time that one wrote."""

from __future__ import annotations

import json
import os
import uuid

from fleetgen.errors import ConfigError
from fleetgen.outputs import RunLayout


def trial_began(layout: RunLayout, now: float) -> float:
    """When the run's trial began: ``now`` when no shard of it started before, else the time the first one wrote."""
    path = layout.trial_began
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{uuid.uuid4().hex}.partial")  # one per writer, threads included
    partial.write_text(json.dumps({"began_at": now}))
    try:
        os.link(partial, path)  # fails when another shard was first: its time stands
        return now
    except FileExistsError:
        pass
    finally:
        partial.unlink(missing_ok=True)
    try:
        return float(json.loads(path.read_text())["began_at"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ConfigError(f"the tuning trial's start time cannot be read: {type(error).__name__} {error}",
                          path=str(path), hint="delete the file; the next trial shard to start writes it again") \
            from None


def stop_taking_at(layout: RunLayout, max_s: float, now: float) -> float | None:
    """The time after which a trial shard starts no prompt (``max_s`` after the trial began); None when ``max_s`` is 0
    (no time cap: the share alone bounds the trial)."""
    if max_s <= 0:
        return None
    return trial_began(layout, now) + max_s
