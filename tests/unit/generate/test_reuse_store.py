"""Runs on an object store as reuse sources (generate/reuse_store.py), against SeaweedFS: each committed completion's
reuse row locates its line in the shard's committed stream, and a later run on the store finds the newest validated
run, reads its index and copies its lines."""

from __future__ import annotations

import json
import logging

import pytest

from generate_fakes import validated

from fleetgen.generate import jsonio
from fleetgen.generate.commit_log import committed_lines
from fleetgen.generate.object_store import CommitBounds, ObjectShardStore
from fleetgen.generate.records import stats_record
from fleetgen.generate.reuse import (SOURCE_UNREADABLE, accepted_launches, copy_reused, generation_material,
                                     line_checksum, prompt_hash, write_reuse_index)
from fleetgen.generate.reuse_store import look_up_reuse_on_store
from fleetgen.outputs import RunLayout
from fleetgen.prompts.scan import Prompt
from fleetgen.storage.mirror import RunMirror

PARTS = {"path": "/models/qwen3.6-27b", "weights": "w" * 64, "config": "c" * 64, "generation_config": "absent",
         "tokenizer": "t" * 64, "chat_template": "j" * 64, "launch_args": "a" * 64, "sglang": "0.5.23"}
MATERIAL = generation_material({"path": PARTS["path"], "parts": PARTS}, max_tokens=64, temperature=0.6, top_p=0.95,
                               extra_body={})
LAUNCHES = accepted_launches([{"server": "n0:30000", "version": "0.5.23", "launch_fields": {
    "model_path": PARTS["path"], "weight_version": "fleetgen/night1"}}])
SMALL = CommitBounds(lines=3, interval_s=60)  # a commit every 3 records: several parts per shard


def ask(n: int) -> Prompt:
    return Prompt(id=f"p{n:04d}", messages=[{"role": "user", "content": f"question {n}"}])


def completion(prompt: Prompt) -> bytes:
    return jsonio.dumps({"id": prompt.id, "content": f"answer to {prompt.id}",
                         "usage": {"prompt_tokens": 3, "completion_tokens": 4}}) + b"\n"


def record(store, prompts: list[Prompt]) -> None:
    for prompt in prompts:
        line = completion(prompt)
        store.record_completion(line, jsonio.dumps(stats_record(jsonio.loads(line))) + b"\n", prompt.id,
                                prompt_hash=prompt_hash(prompt))


def shard(shard_id: int, count: int) -> dict:
    return {"shard_id": shard_id, "input_path": "s3://in/prompts.jsonl", "start": 0, "count": count}


def source_run(root, run: str, shards: dict[int, list[Prompt]], tmp_path, *, passed: bool = True) -> None:
    """A run on the store whose shards committed their completions with reuse rows, 3 a part (one try each, so the
    parts are what the test says), validated, its index written by the report's copy of the run and sent back."""
    for shard_id, prompts in shards.items():
        for number, first in enumerate(range(0, len(prompts), 3), 1):
            writer, _ = ObjectShardStore.open(root.below(run), shard(shard_id, len(prompts)), try_number=number,
                                              bounds=SMALL)
            record(writer, prompts[first:first + 3])
            writer.close()
    mirror = RunMirror.open(root, run, tmp_path / f"copy-{run}")
    from fleetgen.airflow.run_storage import read_committed

    read_committed(mirror, root.below(run), "reuse")
    layout = RunLayout(mirror.run_root)
    if passed:
        validated(layout)
    else:
        layout.validation_dir.mkdir(parents=True)
        layout.validation_summary.write_text(json.dumps({"success": False, "failed_expectations": ["rows"]}))
    write_reuse_index(layout, material=MATERIAL, run_id=run, launches=LAUNCHES)
    mirror.sync()
    mirror.close()


class Recorder:
    def __init__(self) -> None:
        self.recorded: list[tuple[bytes, str]] = []

    def record_completion(self, line: bytes, stats: bytes, prompt_id: str, *, prompt_hash: bytes) -> None:
        self.recorded.append((line, prompt_id))


def test_each_reuse_row_locates_its_line_in_the_shards_committed_completions_across_tries(object_store):
    prompts = [ask(n) for n in range(8)]
    first, _ = ObjectShardStore.open(object_store, shard(0, 8), try_number=1, bounds=SMALL)
    record(first, prompts[:5])
    first.close()
    second, _ = ObjectShardStore.open(object_store, shard(0, 8), try_number=2, bounds=SMALL)  # resumes after them
    record(second, prompts[5:])
    second.close()
    stream = b"".join(committed_lines(object_store, 0, "completions"))
    rows = [json.loads(line) for line in committed_lines(object_store, 0, "reuse")]
    assert [row["h"] for row in rows] == [prompt_hash(prompt).hex() for prompt in prompts]
    for row, prompt in zip(rows, prompts):
        line = stream[row["o"]:row["o"] + row["n"]]
        assert line == completion(prompt) and row["c"] == line_checksum(line)


def test_a_later_run_on_the_store_copies_the_newest_validated_runs_lines(object_store, tmp_path, caplog):
    source_run(object_store, "night1", {0: [ask(n) for n in range(7)], 1: [ask(n) for n in range(7, 10)]}, tmp_path)
    source_run(object_store, "night2", {0: [ask(n) for n in range(10)]}, tmp_path, passed=False)  # newer, failed
    object_store.put("night3/reuse/index.json", b"{torn")
    object_store.put("night0/plan-notes.json", b"{}")  # listed first: no index, and tonight's own folder
    object_store.put("a-run-without-index/plan-notes.json", b"{}")
    with caplog.at_level(logging.WARNING, logger="test"):
        lookup = look_up_reuse_on_store(object_store, "night0", MATERIAL, tmp_path / "sources",
                                        log=logging.getLogger("test"))
    assert "reuse: passing over run night2: its validation did not pass" in caplog.text
    assert lookup.source is not None and lookup.source.run_folder == "night1"
    reasons = {skipped["run"]: skipped["reason"] for skipped in lookup.skipped}
    assert reasons["night2"] == ("its validation did not pass (1 expectation(s) failed: rows; "
                                 f"{object_store.url('night2/validation/summary.json')})")
    assert reasons["night3"].startswith(f"cannot read {object_store.url('night3/reuse/index.json')}: ")
    assert set(reasons) == {"night2", "night3"}
    assert lookup.source.layout.reuse_index == tmp_path / "sources" / "night1" / "reuse" / "index.npy"
    recorder = Recorder()
    wanted = [ask(n) for n in (9, 0, 3, 6, 4, 12)]  # 12: in no earlier run; shard 0's parts hold 0-2, 3-5 and 6
    assert copy_reused(recorder, ((n, 0, 0, prompt) for n, prompt in enumerate(wanted)), lookup.source) == 5
    assert [prompt_id for _, prompt_id in recorder.recorded] == ["p0009", "p0000", "p0003", "p0006", "p0004"]
    assert all(json.loads(line)["reused_from"] == "night1" for line, _ in recorder.recorded)
    assert json.loads(recorder.recorded[0][0])["content"] == "answer to p0009"


def test_no_earlier_run_with_the_same_material_names_what_changed(object_store, tmp_path):
    source_run(object_store, "night1", {0: [ask(0)]}, tmp_path)
    other = {**MATERIAL, "sampling": {**MATERIAL["sampling"], "temperature": 1.0}}
    lookup = look_up_reuse_on_store(object_store, "night2", other, tmp_path / "sources")
    assert lookup.source is None and lookup.changed == {"run": "night1", "parts": ["sampling.temperature"]}


def test_a_source_whose_index_does_not_match_its_checksum_is_passed_over(object_store, tmp_path):
    source_run(object_store, "night1", {0: [ask(0)]}, tmp_path)
    object_store.put("night1/reuse/index.npy", object_store.get("night1/reuse/index.npy")[:-1] + b"\x01")
    lookup = look_up_reuse_on_store(object_store, "night2", MATERIAL, tmp_path / "sources")
    assert lookup.source is None and "does not match the SHA-256" in lookup.skipped[0]["reason"]


def test_a_source_part_gone_since_it_was_indexed_regenerates_its_prompts(object_store, tmp_path, caplog):
    source_run(object_store, "night1", {0: [ask(n) for n in range(4)]}, tmp_path)
    for info in object_store.list("night1/shards/shard-00000/parts/"):
        if info.name.endswith(".completions.jsonl"):
            object_store.delete(info.name)
    lookup = look_up_reuse_on_store(object_store, "night2", MATERIAL, tmp_path / "sources",
                                    log=logging.getLogger("test"))
    with caplog.at_level(logging.WARNING):
        copied = copy_reused(Recorder(), ((n, 0, 0, ask(n)) for n in range(4)), lookup.source)
    assert copied == 0 and lookup.source.regenerated[SOURCE_UNREADABLE] == 4
    warned = [record.getMessage() for record in caplog.records
              if record.getMessage().startswith("reuse: cannot read shard 0 of run night1")]
    assert len(warned) == 1 and "(no such object to read)" in warned[0]


@pytest.fixture(autouse=True)
def _quiet_connection_logs(caplog):
    caplog.set_level(logging.WARNING, logger="airflow")


def test_the_last_two_parts_read_are_kept_in_memory(object_store, tmp_path, monkeypatch):
    source_run(object_store, "night1", {0: [ask(n) for n in range(9)]}, tmp_path)  # parts 0-2, 3-5, 6-8
    lookup = look_up_reuse_on_store(object_store, "night2", MATERIAL, tmp_path / "sources")
    gets = []
    run_store = lookup.source.run_store
    get = run_store.get
    monkeypatch.setattr(run_store, "get", lambda name, **kwargs: (gets.append(name), get(name, **kwargs))[1])
    order = [0, 3, 1, 6, 2]  # A B A C A: A stays kept as the most recent
    assert copy_reused(Recorder(), ((n, 0, 0, ask(p)) for n, p in enumerate(order)), lookup.source) == 5
    parts = [name for name in gets if "/parts/" in name]
    assert len(parts) == 3 and len(set(parts)) == 3, parts


def test_a_summary_that_is_not_an_object_or_an_index_that_is_gone_passes_the_run_over(object_store, tmp_path):
    source_run(object_store, "night1", {0: [ask(0)]}, tmp_path)
    source_run(object_store, "night2", {0: [ask(0)]}, tmp_path)
    source_run(object_store, "night4", {0: [ask(0)]}, tmp_path)
    object_store.put("night1/validation/summary.json", b"[true]")
    object_store.delete("night2/reuse/index.npy")
    object_store.delete("night4/validation/summary.json")
    lookup = look_up_reuse_on_store(object_store, "night3", MATERIAL, tmp_path / "sources")
    reasons = {skipped["run"]: skipped["reason"] for skipped in lookup.skipped}
    assert lookup.source is None
    assert reasons["night1"].startswith(f"no validation summary at {object_store.url('night1/validation/summary.json')}")
    assert reasons["night2"].startswith(f"cannot read {object_store.url('night2/reuse/index.npy')}: no such object")
    assert reasons["night4"].startswith(f"no validation summary at {object_store.url('night4/validation/summary.json')}")
    again = look_up_reuse_on_store(object_store, "night3", MATERIAL, tmp_path / "sources")  # the same scratch
    assert again.skipped == lookup.skipped


def test_the_newest_run_is_the_one_whose_index_says_it_was_written_last(object_store, tmp_path):
    import time

    source_run(object_store, "night1", {0: [ask(0)]}, tmp_path)
    source_run(object_store, "night2", {0: [ask(0)]}, tmp_path)
    meta = json.loads(object_store.get("night2/reuse/index.json"))
    time.sleep(1.1)  # the store's Last-Modified has whole seconds: night2's object is then the newest by far
    object_store.put("night2/reuse/index.json", json.dumps({**meta, "written_at": 1.0}).encode())
    lookup = look_up_reuse_on_store(object_store, "night3", MATERIAL, tmp_path / "sources")
    assert lookup.source.run_folder == "night1"
