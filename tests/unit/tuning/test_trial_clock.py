"""The tuning trial's time cap (fleetgen.tuning.trial_clock): the first trial shard's start is the trial's, for every
shard and every retry after it."""

from __future__ import annotations

import json
import threading

import pytest

from fleetgen.errors import ConfigError
from fleetgen.storage.run_files import LocalRunFiles
from fleetgen.tuning.trial_clock import stop_taking_at, trial_began


@pytest.fixture
def files(run_files):
    return run_files


def test_the_first_shard_to_start_sets_the_trials_start_and_later_ones_read_it(files):
    assert trial_began(files, 1000.0) == 1000.0
    assert trial_began(files, 1500.0) == 1000.0  # a later shard, or a retry of the first
    assert json.loads(files.read("trial-began.json").data) == {"began_at": 1000.0}


def test_no_partial_file_is_left_behind_on_disk(tmp_path):
    files = LocalRunFiles(tmp_path / "run")
    trial_began(files, 1000.0)
    trial_began(files, 1500.0)
    assert [path.name for path in files.root.iterdir()] == ["trial-began.json"]


def test_a_trial_shard_stops_taking_prompts_the_time_cap_after_the_trial_began(files):
    assert stop_taking_at(files, 600.0, 1000.0) == 1600.0
    assert stop_taking_at(files, 600.0, 1900.0) == 1600.0  # past it: the shard sends nothing
    assert stop_taking_at(files, 0.0, 1900.0) is None  # no cap
    assert stop_taking_at(files, 0.5, 1900.0) == 1000.5  # a cap under a second is a cap too


def test_without_a_time_cap_nothing_is_written(files):
    assert stop_taking_at(files, 0.0, 1000.0) is None
    assert files.read("trial-began.json") is None


def test_shards_starting_together_agree_on_one_start(files):
    seen, barrier = [], threading.Barrier(8)

    def start(now):
        barrier.wait()
        seen.append(trial_began(files, now))

    threads = [threading.Thread(target=start, args=(1000.0 + n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(seen)) == 1 and seen[0] in {1000.0 + n for n in range(8)}


def test_an_unreadable_start_time_names_the_file_and_what_to_do(files):
    files.write("trial-began.json", b"{torn")
    with pytest.raises(ConfigError, match="the tuning trial's start time cannot be read: JSONDecodeError ") as caught:
        trial_began(files, 1000.0)
    assert caught.value.path == files.where("trial-began.json")
    assert caught.value.hint == "delete the file; the next trial shard to start writes it again"
