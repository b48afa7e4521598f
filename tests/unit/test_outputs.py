"""The run folder's contract (fleetgen/outputs.py): every shard file named in one place, as documented."""

import re
from pathlib import Path

from fleetgen.outputs import SHARD_KINDS, RunLayout

DOC = Path(__file__).resolve().parents[2] / "docs" / "output-formats.md"


def test_every_shard_file_has_its_own_name_and_the_documented_one():
    layout = RunLayout(Path("/out/run"))
    paths = layout.shard(42)
    bookkeeping = [paths.plan, paths.mark, paths.lock, paths.lease, paths.heartbeat, paths.lost_tries]
    data = [layout.shard_file(kind, 42) for kind in SHARD_KINDS if kind != "shards"]
    everything = bookkeeping + data
    assert len(set(everything)) == len(everything)
    assert all(path.name.startswith("shard-00042.") for path in everything)
    documented = set(re.findall(r"^(\w+/shard-NNNNN\.[\w.]+)", DOC.read_text(), flags=re.M))
    named = {str(path.relative_to(layout.root)).replace("00042", "NNNNN") for path in everything}
    assert named <= documented, sorted(named - documented)


def test_the_run_finds_heartbeats_and_lost_tries_by_the_names_a_shard_writes(tmp_path):
    layout = RunLayout(tmp_path)
    layout.kind_dir("shards").mkdir(parents=True)
    for shard in (3, 1):
        layout.shard(shard).heartbeat.write_text("{}")
        layout.shard(shard).lost_tries.write_text("")
        layout.shard(shard).mark.write_text("{}")
    assert layout.heartbeat_files() == [layout.shard(1).heartbeat, layout.shard(3).heartbeat]
    assert layout.lost_try_files() == [layout.shard(1).lost_tries, layout.shard(3).lost_tries]
