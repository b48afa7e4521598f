"""The tuning trial's time cap (DAG parameter ``tuning_trial_max_s``, docs/tuning-trial.md §5): the trial began when
its first shard started, and every trial shard, a retry included, starts no prompt past ``began + max_s``.

The first shard to start writes ``RunLayout.TRIAL_BEGAN`` whole and only if it is absent (``RunFiles.create``: a hard
link of a finished file on disk, ``If-None-Match: *`` on a store); every later shard reads the time that one wrote."""

from __future__ import annotations

import json

from fleetgen.errors import ConfigError
from fleetgen.outputs import RunLayout
from fleetgen.storage.run_files import RunFiles


def trial_began(files: RunFiles, now: float) -> float:
    """When the run's trial began: ``now`` when no shard of it started before, else the time the first one wrote."""
    name = RunLayout.TRIAL_BEGAN
    if files.create(name, json.dumps({"began_at": now}).encode()):
        return now
    stamped = files.read(name)
    try:
        return float(json.loads(stamped.data)["began_at"])
    except (AttributeError, ValueError, KeyError, TypeError) as error:
        raise ConfigError(f"the tuning trial's start time cannot be read: {type(error).__name__} {error}",
                          path=files.where(name), hint="delete the file; the next trial shard to start writes it "
                                                       "again") from None


def stop_taking_at(files: RunFiles, max_s: float, now: float) -> float | None:
    """The time after which a trial shard starts no prompt (``max_s`` after the trial began); None when ``max_s`` is 0
    (no time cap: the share alone bounds the trial)."""
    if max_s <= 0:
        return None
    return trial_began(files, now) + max_s
