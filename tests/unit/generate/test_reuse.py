"""Regenerate only what changed: which earlier completions are reused, how they are copied, and the index."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from generate_fakes import FakeFleet, fast_settings, shard_output, validated

from fleetgen.generate import run_shard_async
from fleetgen.generate.reuse import (INDEX_DTYPE, LINE_CHANGED, SOURCE_UNREADABLE, ReuseLookup, ReuseSource,
                                     accepted_launches,
                                     SourceUnusable, _with_origin, changed_parts, copy_reused, generation_key,
                                     generation_material, line_checksum, look_up_reuse, prompt_hash,
                                     write_reuse_index)
from fleetgen.outputs import RunLayout
from fleetgen.prompts.scan import Prompt, plan_shards

from validate_fixtures import FileAccessWatch  # noqa: E402

pytestmark = pytest.mark.anyio
PARTS = {"path": "/models/qwen3.6-27b", "weights": "w" * 64, "config": "c" * 64, "generation_config": "absent",
         "tokenizer": "t" * 64, "chat_template": "j" * 64, "launch_args": "a" * 64, "sglang": "0.5.23"}
MODEL = {"path": PARTS["path"], "parts": PARTS}
SAMPLING = {"max_tokens": 64, "temperature": 0.6, "top_p": 0.95, "extra_body": {}}
MATERIAL = generation_material(MODEL, **SAMPLING)


def read_back(material: dict = MATERIAL, **fields) -> dict:
    """The launches a run's index records: the one server wait_ready read back, running ``material``'s model and
    SGLang version unless ``fields`` (model_path, weight_version, version) say otherwise."""
    launch = {"model_path": material["model"]["path"], "weight_version": "fleetgen/night1",
              "version": material["model"]["sglang"], **fields}
    return accepted_launches([{"server": "n0:30000", "version": launch.pop("version"), "launch_fields": launch}])


def write_prompts(path: Path, records: list[dict]) -> dict:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return plan_shards(path, shard_size=len(records))[0]


def prompts(count: int) -> list[dict]:
    return [{"id": f"p{n:04d}", "messages": [{"role": "user", "content": f"question {n}"}]} for n in range(count)]


async def generate(root: Path, run: str, records: list[dict], *, material: dict = MATERIAL,
                   fleet: FakeFleet | None = None):
    """One run's shard; its index is written afterwards as a successful run's is. The summary carries the
    lookup's, as the generate task's result does."""
    fleet = fleet or FakeFleet(2)
    shard = write_prompts(root / f"{run}.jsonl", records)
    lookup = look_up_reuse(root, run, material)
    summary = await run_shard_async(shard, fleet.endpoints(), root / run, fast_settings(),
                                    options=fleet.options(reuse=lookup.source))
    write_reuse_index(RunLayout(root / run), material=material, run_id=run, launches=read_back(material))
    validated(RunLayout(root / run))
    return {**summary, "reuse": lookup.summary()}, fleet


async def test_an_unchanged_night_generates_nothing_and_its_folder_is_complete(tmp_path):
    await generate(tmp_path, "night1", prompts(30))
    summary, fleet = await generate(tmp_path, "night2", prompts(30))
    assert summary["reused"] == 30 and summary["done"] == 0 and sum(fleet.requests.values()) == 0
    out = shard_output(tmp_path / "night2")
    first = shard_output(tmp_path / "night1")
    assert [r["id"] for r in out["completions"]] == [r["id"] for r in first["completions"]]
    assert {r["reused_from"] for r in out["completions"]} == {"night1"}
    assert {r["reused_from"] for r in out["stats"]} == {"night1"}
    assert out["completions"][0]["content"] == next(r for r in first["completions"]
                                                    if r["id"] == out["completions"][0]["id"])["content"]
    # night 3 reuses night 2's own copies: each night's folder stands on its own
    summary, _ = await generate(tmp_path, "night3", prompts(30))
    assert summary["reused"] == 30 and summary["reuse"]["source"] == "night2"
    assert {r["reused_from"] for r in shard_output(tmp_path / "night3")["completions"]} == {"night1"}


@pytest.mark.parametrize("change", ["content", "own_sampling", "id", "new"])
async def test_a_changed_prompt_is_generated_again(tmp_path, change):
    await generate(tmp_path, "night1", prompts(10))
    tonight = prompts(10)
    if change == "content":
        tonight[3]["messages"][0]["content"] += " (edited)"
    elif change == "own_sampling":
        tonight[3]["sampling"] = {"temperature": 0.0}
    elif change == "id":
        tonight[3]["id"] = "p9999"
    else:
        tonight.append({"id": "p0010", "messages": [{"role": "user", "content": "a new question"}]})
    summary, fleet = await generate(tmp_path, "night2", tonight)
    generated = 1
    assert summary["done"] == generated and summary["reused"] == len(tonight) - generated
    assert sum(fleet.requests.values()) == 1
    fresh = [r for r in shard_output(tmp_path / "night2")["completions"] if "reused_from" not in r]
    assert [r["id"] for r in fresh] == [tonight[3]["id"] if change != "new" else "p0010"]


@pytest.mark.parametrize("change", [
    *({"part": part} for part in PARTS), {"max_tokens": 128}, {"temperature": 0.7}, {"top_p": 0.9},
    {"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}}])
async def test_a_changed_model_or_sampling_reuses_nothing_and_says_what_changed(tmp_path, change):
    await generate(tmp_path, "night1", prompts(10))
    part = change.get("part")
    model = {**MODEL, "parts": {**PARTS, part: "changed"}} if part else MODEL
    sampling = {**SAMPLING, **{k: v for k, v in change.items() if k != "part"}}
    material = generation_material(model, **sampling)
    assert generation_key(material) != generation_key(MATERIAL)
    summary, fleet = await generate(tmp_path, "night2", prompts(10), material=material)
    assert summary["reused"] == 0 and summary["done"] == 10 and sum(fleet.requests.values()) == 10
    sampling_part = "extra_body" if "extra_body" in change else f"sampling.{next(iter(change))}"
    expected = [f"model.{part}"] if part else [sampling_part]
    assert summary["reuse"]["source"] is None
    assert summary["reuse"]["changed"] == {"run": "night1", "parts": expected}


async def test_the_index_is_built_without_reading_the_completions(tmp_path):
    await generate(tmp_path, "night1", prompts(50))
    layout = RunLayout(tmp_path / "night1")
    with FileAccessWatch(layout.kind_dir("completions")) as watch:
        assert write_reuse_index(layout, material=MATERIAL, run_id="night1", launches=read_back()) == 50
    assert watch.touched == []
    assert layout.reuse_index.stat().st_size <= 50 * 40 + 256  # 40 bytes a completion, plus the .npy header
    assert json.loads(layout.reuse_index_meta.read_text())["key"] == generation_key(MATERIAL)


async def test_a_completion_that_changed_since_its_index_is_not_reused(tmp_path):
    await generate(tmp_path, "night1", prompts(5))
    path = RunLayout(tmp_path / "night1").shard_file("completions", 0)
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join([lines[1], lines[0], *lines[2:]]))  # two lines swapped: offsets now wrong
    summary, _ = await generate(tmp_path, "night2", prompts(5))
    assert summary["reused"] == 3 and summary["done"] == 2
    assert summary["reuse"]["regenerated"] == {LINE_CHANGED: 2}


def test_the_prompt_hash_covers_the_messages_the_bare_prompt_and_the_prompts_own_sampling():
    base = Prompt(id="a", messages=[{"role": "user", "content": "x"}])
    assert prompt_hash(base) == prompt_hash(Prompt(id="a", messages=[{"role": "user", "content": "x"}]))
    assert len({prompt_hash(base), prompt_hash(Prompt(id="a", prompt="x")),
                prompt_hash(Prompt(id="a", messages=[{"role": "user", "content": "x"}], sampling={"top_p": 0.5}))}) == 3



async def test_provenance_is_one_field_naming_the_generating_run_however_many_nights_copy_it(tmp_path):
    for night in ("night1", "night2", "night3", "night4"):
        await generate(tmp_path, night, prompts(5))
    lines = RunLayout(tmp_path / "night4").shard_file("completions", 0).read_bytes().splitlines()
    assert len(lines) == 5 and all(line.count(b'"reused_from"') == 1 for line in lines)
    assert {json.loads(line)["reused_from"] for line in lines} == {"night1"}
    assert {r["reused_from"] for r in shard_output(tmp_path / "night4")["stats"]} == {"night1"}


async def test_pruned_completions_of_the_source_run_are_generated_again_not_a_failed_shard(tmp_path):
    await generate(tmp_path, "night1", prompts(10))
    for path in RunLayout(tmp_path / "night1").kind_dir("completions").iterdir():
        path.unlink()  # pruned; the run's index stays
    summary, fleet = await generate(tmp_path, "night2", prompts(10))
    assert summary["reused"] == 0 and summary["done"] == 10 and sum(fleet.requests.values()) == 10
    assert summary["reuse"]["regenerated"] == {SOURCE_UNREADABLE: 10}
    assert len(shard_output(tmp_path / "night2")["completions"]) == 10


async def test_a_line_edited_in_place_since_it_was_indexed_is_generated_again(tmp_path):
    await generate(tmp_path, "night1", prompts(5))
    path = RunLayout(tmp_path / "night1").shard_file("completions", 0)
    text = bytearray(path.read_bytes())
    where = text.index(b'"content":"') + len(b'"content":"')
    text[where] = ord("X") if text[where] != ord("X") else ord("Y")  # same id, same length: only the text differs
    path.write_bytes(bytes(text))
    summary, _ = await generate(tmp_path, "night2", prompts(5))
    assert summary["reused"] == 4 and summary["done"] == 1
    assert summary["reuse"]["regenerated"] == {LINE_CHANGED: 1}


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [
    pytest.param(lambda layout: _truncate(layout.reuse_index), id="index truncated"),
    pytest.param(lambda layout: _flip_last_byte(layout.reuse_index), id="index changed, same size"),
    pytest.param(lambda layout: layout.reuse_index.unlink(), id="index missing"),
    pytest.param(lambda layout: _truncate(layout.reuse_index_meta), id="index.json torn")])
async def test_a_damaged_index_is_passed_over_for_an_older_whole_one(tmp_path, damage):
    await generate(tmp_path, "night1", prompts(10))
    await generate(tmp_path, "night2", prompts(10))
    damage(RunLayout(tmp_path / "night2"))
    summary, fleet = await generate(tmp_path, "night3", prompts(10))
    assert summary["reused"] == 10 and sum(fleet.requests.values()) == 0
    assert summary["reuse"]["source"] == "night1"
    assert [skipped["run"] for skipped in summary["reuse"]["skipped"]] == ["night2"]
    assert "night2" in summary["reuse"]["skipped"][0]["reason"]


async def test_with_no_readable_index_every_prompt_is_generated(tmp_path):
    await generate(tmp_path, "night1", prompts(10))
    _truncate(RunLayout(tmp_path / "night1").reuse_index)
    summary, fleet = await generate(tmp_path, "night2", prompts(10))
    assert summary["reused"] == 0 and summary["done"] == 10 and sum(fleet.requests.values()) == 10
    assert summary["reuse"]["source"] is None and summary["reuse"]["changed"] is None


def test_the_index_files_are_replaced_whole(tmp_path, monkeypatch):
    import numpy as np

    layout = RunLayout(tmp_path / "night1")
    layout.reuse_index.parent.mkdir(parents=True)
    layout.reuse_index.write_bytes(b"the index of an earlier try")

    def crash(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "save", crash)
    with pytest.raises(OSError):
        write_reuse_index(layout, material=MATERIAL, run_id="night1", launches=read_back())
    assert layout.reuse_index.read_bytes() == b"the index of an earlier try"


def test_changed_parts_names_each_part_that_differs():
    changed = {**MATERIAL, "model": {**PARTS, "weights": "x", "sglang": "0.5.24"}, "extra_body": {"a": 1}}
    assert changed_parts(MATERIAL, changed) == ["extra_body", "model.sglang", "model.weights"]
    assert changed_parts(MATERIAL, MATERIAL) == []


# --- the pieces, without a fleet: a source run written by hand ---------------------------------------------------

def completion_line(prompt_id: str, text: str = "", **extra) -> bytes:
    record = {"id": prompt_id, "content": text or f"answer to {prompt_id}",
              "usage": {"prompt_tokens": 3, "completion_tokens": 4}, **extra}
    return json.dumps(record, separators=(",", ":")).encode() + b"\n"


def source_run(root: Path, name: str, shards: dict[int, list[Prompt]], *, material: dict = MATERIAL,
               written_at: float | None = None) -> RunLayout:
    """A finished run's completions and reuse rows as its shards write them, and its index."""
    layout = RunLayout(root / name)
    for shard_id, shard_prompts in shards.items():
        completions = layout.shard_file("completions", shard_id)
        rows = layout.shard_file("reuse", shard_id)
        completions.parent.mkdir(parents=True, exist_ok=True)
        rows.parent.mkdir(parents=True, exist_ok=True)
        offset, text, index_rows = 0, b"", b""
        for prompt in shard_prompts:
            line = completion_line(prompt.id)
            index_rows += json.dumps({"h": prompt_hash(prompt).hex(), "o": offset, "n": len(line),
                                      "c": line_checksum(line)}).encode() + b"\n"
            text += line
            offset += len(line)
        completions.write_bytes(text)
        rows.write_bytes(index_rows)
    write_reuse_index(layout, material=material, run_id=name, launches=read_back(material))
    validated(layout)
    if written_at is not None:
        meta = json.loads(layout.reuse_index_meta.read_text())
        layout.reuse_index_meta.write_text(json.dumps({**meta, "written_at": written_at}))
    return layout


def ask(n: int, text: str = "") -> Prompt:
    return Prompt(id=f"p{n:04d}", messages=[{"role": "user", "content": text or f"question {n}"}])


class RecordingStore:
    def __init__(self) -> None:
        self.recorded: list[tuple[bytes, bytes, str, bytes]] = []

    def record_completion(self, line: bytes, stats: bytes, prompt_id: str, *, prompt_hash: bytes) -> None:
        self.recorded.append((line, stats, prompt_id, prompt_hash))


def pending(prompts_: list[Prompt]):
    return ((n, 0, 0, prompt) for n, prompt in enumerate(prompts_))


def open_source(layout: RunLayout, log=None) -> ReuseSource:
    return ReuseSource.open(layout.root, json.loads(layout.reuse_index_meta.read_text()), log)


def test_the_prompt_hash_is_16_bytes_and_tells_id_text_and_sampling_apart():
    base = ask(1)
    assert len(prompt_hash(base)) == 16
    variants = [Prompt(id="p0002", messages=base.messages), ask(1, "other"), Prompt(id="p0001", prompt="question 1"),
                Prompt(id="p0001", messages=base.messages, sampling={"max_tokens": 9})]
    assert len({prompt_hash(prompt) for prompt in [base, *variants]}) == 5


def test_a_line_checksum_is_8_bytes_of_hex():
    assert len(line_checksum(b"x")) == 16 and line_checksum(b"x") != line_checksum(b"y")
    assert line_checksum(b"abc") == hashlib.blake2b(b"abc", digest_size=8).hexdigest()


def test_the_generation_material_holds_every_model_part_and_the_runs_sampling():
    material = generation_material(MODEL, max_tokens=8, temperature=0.0, top_p=1.0, extra_body={"k": True})
    assert material == {"model": PARTS, "sampling": {"max_tokens": 8, "temperature": 0.0, "top_p": 1.0},
                        "extra_body": {"k": True}}
    assert material["model"] is not MODEL["parts"]


def test_the_generation_key_does_not_depend_on_key_order():
    reordered = {"extra_body": {}, "sampling": dict(reversed(list(MATERIAL["sampling"].items()))),
                 "model": dict(reversed(list(PARTS.items())))}
    assert generation_key(reordered) == generation_key(MATERIAL)
    assert generation_key(MATERIAL) == hashlib.sha256(json.dumps(MATERIAL, sort_keys=True).encode()).hexdigest()


def test_changed_parts_without_a_recorded_material_names_every_group():
    assert changed_parts(None, MATERIAL) == ["extra_body", "model", "sampling"]
    assert changed_parts({}, {"sampling": {"top_p": 1.0}}) == ["sampling"]


def test_changed_parts_names_groups_and_parts_only_one_side_has():
    before = {"model": {"weights": "w"}, "sampling": {"top_p": 1.0}, "gone": 1}
    now = {"model": {"weights": "w", "tokenizer": "t"}, "sampling": {"top_p": 1.0}, "extra_body": {"a": 1}}
    assert changed_parts(before, now) == ["extra_body", "gone", "model.tokenizer"]
    # extra_body is one part however deep it is
    assert changed_parts({"extra_body": {"a": 1, "b": 2}}, {"extra_body": {"a": 1, "b": 3}}) == ["extra_body"]
    # a group that turned from a value into parts is named whole
    assert changed_parts({"model": "old"}, {"model": {"weights": "w"}}) == ["model"]


def test_the_index_holds_every_shards_rows_sorted_by_hash_with_their_shard(tmp_path):
    shards = {0: [ask(n) for n in range(5)], 3: [ask(n) for n in range(5, 9)]}
    layout = source_run(tmp_path, "night1", shards)
    index = np.load(layout.reuse_index)
    assert index.dtype == INDEX_DTYPE and len(index) == 9
    keys = list(zip(index["h1"].tolist(), index["h2"].tolist()))
    assert keys == sorted(keys)
    source = open_source(layout)
    for shard_id, shard_prompts in shards.items():
        for hit in source.find([prompt_hash(prompt) for prompt in shard_prompts]):
            assert hit is not None and hit[0] == shard_id
    meta = json.loads(layout.reuse_index_meta.read_text())
    assert meta["completions"] == 9 and meta["run_id"] == "night1" and meta["run_folder"] == "night1"
    assert meta["material"] == MATERIAL and meta["key"] == generation_key(MATERIAL)
    assert meta["index_bytes"] == layout.reuse_index.stat().st_size
    assert meta["index_sha256"] == hashlib.sha256(layout.reuse_index.read_bytes()).hexdigest()
    assert abs(meta["written_at"] - time.time()) < 60


def test_torn_and_incomplete_rows_are_left_out_of_the_index(tmp_path):
    layout = RunLayout(tmp_path / "night1")
    path = layout.shard_file("reuse", 2)
    path.parent.mkdir(parents=True)
    good = {"h": prompt_hash(ask(1)).hex(), "o": 0, "n": 10, "c": "00" * 8}
    path.write_text("\n".join([json.dumps(good), json.dumps({**good, "c": None}), json.dumps({"h": "zz", "o": 1}),
                               json.dumps({k: v for k, v in good.items() if k != "c"}), '{"h": "ab']) + "\n")
    layout.shard_file("reuse", 4).write_text("")
    assert write_reuse_index(layout, material=MATERIAL, run_id="r", launches=read_back()) == 1
    entry = np.load(layout.reuse_index)[0]
    assert (int(entry["shard"]), int(entry["offset"]), int(entry["bytes"]), int(entry["check"])) == (2, 0, 10, 0)


def test_a_run_without_reuse_rows_writes_an_empty_index(tmp_path):
    layout = RunLayout(tmp_path / "night1")
    assert write_reuse_index(layout, material=MATERIAL, run_id="r", launches=read_back()) == 0
    assert len(np.load(layout.reuse_index)) == 0
    assert json.loads(layout.reuse_index_meta.read_text())["completions"] == 0
    assert open_source(layout).find([prompt_hash(ask(1))]) == [None]


def test_find_answers_many_digests_at_once_hits_and_misses_in_order(tmp_path):
    layout = source_run(tmp_path, "night1", {0: [ask(n) for n in range(4)]})
    source = open_source(layout)
    lines = layout.shard_file("completions", 0).read_bytes().splitlines(keepends=True)
    found = source.find([prompt_hash(ask(2)), prompt_hash(ask(9)), prompt_hash(ask(0))])
    offset_2 = len(lines[0]) + len(lines[1])
    assert found[0] == (0, offset_2, len(lines[2]), int.from_bytes(bytes.fromhex(line_checksum(lines[2])), "little"))
    assert found[1] is None and found[2][:3] == (0, 0, len(lines[0]))
    assert source.find([]) == []


def test_find_tells_apart_digests_sharing_their_first_half(tmp_path):
    layout = RunLayout(tmp_path / "night1")
    index = np.zeros(3, dtype=INDEX_DTYPE)
    index["h1"] = [5, 5, 9]
    index["h2"] = [1, 2, 1]
    index["shard"] = [10, 11, 12]
    layout.reuse_index.parent.mkdir(parents=True)
    np.save(layout.reuse_index, index)
    source = ReuseSource(layout, np.load(layout.reuse_index), "night1")

    def digest(h1: int, h2: int) -> bytes:
        return h1.to_bytes(8, "little") + h2.to_bytes(8, "little")

    assert [hit and hit[0] for hit in source.find([digest(5, 2), digest(5, 1), digest(5, 3), digest(9, 1),
                                                   digest(9, 2), digest(1, 1)])] == [11, 10, None, 12, None, None]


@pytest.mark.parametrize("break_meta, problem", [
    (lambda meta: meta.pop("index_sha256"), "records no checksum of index.npy"),
    (lambda meta: meta.update(index_bytes=meta["index_bytes"] + 1), "bytes, its index.json recorded"),
    (lambda meta: meta.update(index_sha256="0" * 64), "does not match the SHA-256 its index.json recorded"),
])
def test_an_index_not_matching_its_record_is_unusable(tmp_path, break_meta, problem):
    layout = source_run(tmp_path, "night1", {0: [ask(1)]})
    meta = json.loads(layout.reuse_index_meta.read_text())
    break_meta(meta)
    with pytest.raises(SourceUnusable, match=re.escape(problem)):
        ReuseSource.open(layout.root, meta)


def test_an_index_size_mismatch_names_both_sizes(tmp_path):
    layout = source_run(tmp_path, "night1", {0: [ask(1)]})
    meta = json.loads(layout.reuse_index_meta.read_text())
    size = meta["index_bytes"]
    with pytest.raises(SourceUnusable) as caught:
        ReuseSource.open(layout.root, {**meta, "index_bytes": size - 1})
    assert str(caught.value) == f"{layout.reuse_index} is {size} bytes, its index.json recorded {size - 1}"


def test_a_missing_index_is_unusable_saying_why(tmp_path):
    layout = source_run(tmp_path, "night1", {0: [ask(1)]})
    meta = json.loads(layout.reuse_index_meta.read_text())
    layout.reuse_index.unlink()
    with pytest.raises(SourceUnusable) as caught:
        ReuseSource.open(layout.root, meta)
    assert str(caught.value) == f"cannot read {layout.reuse_index}: No such file or directory"


def _save_with_meta(layout: RunLayout, array) -> dict:
    layout.reuse_index.parent.mkdir(parents=True, exist_ok=True)
    np.save(layout.reuse_index, array)
    data = layout.reuse_index.read_bytes()
    return {"index_bytes": len(data), "index_sha256": hashlib.sha256(data).hexdigest()}


def test_an_index_of_another_layout_is_unusable(tmp_path):
    layout = RunLayout(tmp_path / "night1")
    meta = _save_with_meta(layout, np.zeros(2, dtype=[("h1", "<u8")]))
    with pytest.raises(SourceUnusable, match="not a reuse index of this version"):
        ReuseSource.open(layout.root, meta)


def test_a_file_that_is_no_npy_is_unusable(tmp_path):
    layout = RunLayout(tmp_path / "night1")
    layout.reuse_index.parent.mkdir(parents=True)
    layout.reuse_index.write_bytes(b"not numpy at all")
    meta = {"index_bytes": 16, "index_sha256": hashlib.sha256(b"not numpy at all").hexdigest()}
    with pytest.raises(SourceUnusable, match=re.escape(f"{layout.reuse_index} is not a reuse index: ")):
        ReuseSource.open(layout.root, meta)


def test_an_opened_source_is_named_after_its_run_folder(tmp_path):
    layout = source_run(tmp_path, "2026-11-30_night", {0: [ask(1)]})
    assert open_source(layout).run_folder == "2026-11-30_night"


def test_a_missing_completions_file_is_logged_once_and_read_as_nothing(tmp_path, caplog):
    layout = source_run(tmp_path, "night1", {0: [ask(1)], 1: [ask(2)]})
    layout.shard_file("completions", 1).unlink()
    source = open_source(layout, logging.getLogger("tests.reuse"))
    with caplog.at_level(logging.WARNING, logger="tests.reuse"):
        assert source.read_line(1, 0, 5) is None
        assert source.read_line(1, 10, 5) is None
    assert caplog.text.count("reuse: cannot read") == 1 and "No such file or directory" in caplog.text
    assert "its completions are generated again" in caplog.text
    first = layout.shard_file("completions", 0).read_bytes()
    assert source.read_line(0, 3, 4) == first[3:7]
    assert source.read_line(0, 0, 2) == first[:2]  # the open file is kept and read again
    handle = source._handles[0]
    source.close()
    assert handle.closed and source._handles == {}


def test_with_origin_names_the_run_that_generated_the_text_once():
    line = completion_line("p1")
    once = _with_origin(line, "night1")
    assert json.loads(once)["reused_from"] == "night1" and once.endswith(b',"reused_from":"night1"}\n')
    twice = _with_origin(once, "night2")
    assert twice == once
    nested = line.rstrip(b"\n")[:-1] + b',"reused_from":"a","reused_from":"b"}\n'
    assert _with_origin(nested, "c").count(b"reused_from") == 1
    assert json.loads(_with_origin(nested, "c"))["reused_from"] == "a"
    assert json.loads(_with_origin(line.rstrip(b"\n"), "n"))["reused_from"] == "n"
    with pytest.raises(ValueError, match="not a JSON object line"):
        _with_origin(b'["p1"]\n', "night1")


def test_an_origin_with_quotes_is_kept_exactly():
    line = completion_line("p1").rstrip(b"\n")[:-1] + b',"reused_from":"night \\"1\\""}\n'
    assert json.loads(_with_origin(line, "night2"))["reused_from"] == 'night "1"'


@pytest.mark.parametrize("count, batch", [(5, 2), (4, 2), (3, 4096), (1, 1)])
def test_every_held_prompt_is_copied_whatever_the_batch(tmp_path, count, batch):
    held = [ask(n) for n in range(count)]
    layout = source_run(tmp_path, "night1", {0: held})
    store = RecordingStore()
    source = open_source(layout)
    assert copy_reused(store, pending(held), source, batch=batch) == count
    assert [recorded[2] for recorded in store.recorded] == [prompt.id for prompt in held]
    assert [recorded[3] for recorded in store.recorded] == [prompt_hash(prompt) for prompt in held]
    line, stats, _, _ = store.recorded[0]
    assert json.loads(line)["reused_from"] == "night1" and json.loads(line)["content"] == "answer to p0000"
    assert json.loads(stats)["reused_from"] == "night1" and json.loads(stats)["id"] == "p0000"
    assert source._handles == {} and not source.regenerated


def test_only_the_prompts_the_source_holds_are_copied(tmp_path):
    layout = source_run(tmp_path, "night1", {0: [ask(0), ask(1)], 2: [ask(5)]})
    store = RecordingStore()
    tonight = [ask(0), ask(1, "edited"), ask(3), ask(5)]
    assert copy_reused(store, pending(tonight), open_source(layout)) == 2
    assert [recorded[2] for recorded in store.recorded] == ["p0000", "p0005"]


def _rewrite_completions(layout: RunLayout, shard_id: int, change) -> None:
    path = layout.shard_file("completions", shard_id)
    path.write_bytes(change(path.read_bytes()))


@pytest.mark.parametrize("change", [
    pytest.param(lambda data: data.replace(b"answer to p0001", b"answer to p0001!"), id="longer"),
    pytest.param(lambda data: data.replace(b"answer to p0001", b"answer to p000X"), id="same length"),
    pytest.param(lambda data: data.replace(b'"id":"p0001"', b'"id":"p0009"'), id="another id"),
    pytest.param(lambda data: data.replace(b'{"id":"p0001","content"', b'{"xx":"p0001","content"'), id="no id"),
])
def test_a_line_changed_since_it_was_indexed_is_generated_again_and_logged(tmp_path, caplog, change):
    held = [ask(0), ask(1), ask(2)]
    layout = source_run(tmp_path, "night1", {0: held})
    _rewrite_completions(layout, 0, change)
    # the checksums recorded for the changed line's index row must still be the old ones
    store = RecordingStore()
    source = open_source(layout, logging.getLogger("tests.reuse"))
    with caplog.at_level(logging.WARNING, logger="tests.reuse"):
        copied = copy_reused(store, pending(held), source)
    assert "p0001" not in [recorded[2] for recorded in store.recorded]
    assert source.regenerated[LINE_CHANGED] >= 1 and copied == 3 - sum(source.regenerated.values())
    assert "reuse: " in caplog.text and "run night1 held are generated again" in caplog.text


def test_a_line_whose_id_only_starts_like_the_prompts_is_not_reused(tmp_path):
    layout = RunLayout(tmp_path / "night1")
    prompt = Prompt(id="p1", messages=[{"role": "user", "content": "q"}])
    line = completion_line("p10")
    completions = layout.shard_file("completions", 0)
    completions.parent.mkdir(parents=True)
    completions.write_bytes(line)
    rows = layout.shard_file("reuse", 0)
    rows.parent.mkdir(parents=True)
    rows.write_text(json.dumps({"h": prompt_hash(prompt).hex(), "o": 0, "n": len(line), "c": line_checksum(line)}))
    write_reuse_index(layout, material=MATERIAL, run_id="night1", launches=read_back())
    source = open_source(layout)
    assert copy_reused(RecordingStore(), pending([prompt]), source) == 0
    assert source.regenerated == {LINE_CHANGED: 1}


def test_a_line_that_is_not_json_is_generated_again(tmp_path):
    layout = RunLayout(tmp_path / "night1")
    prompt = ask(1)
    line = b'{"id":"p0001",broken}\n'
    completions = layout.shard_file("completions", 0)
    completions.parent.mkdir(parents=True)
    completions.write_bytes(line)
    rows = layout.shard_file("reuse", 0)
    rows.parent.mkdir(parents=True)
    rows.write_text(json.dumps({"h": prompt_hash(prompt).hex(), "o": 0, "n": len(line), "c": line_checksum(line)}))
    write_reuse_index(layout, material=MATERIAL, run_id="night1", launches=read_back())
    source = open_source(layout)
    assert copy_reused(RecordingStore(), pending([prompt]), source) == 0
    assert source.regenerated == {LINE_CHANGED: 1}


def test_a_pruned_shard_of_the_source_regenerates_only_its_prompts(tmp_path, caplog):
    layout = source_run(tmp_path, "night1", {0: [ask(0), ask(1)], 1: [ask(2), ask(3), ask(4)]})
    layout.shard_file("completions", 1).unlink()
    source = open_source(layout, logging.getLogger("tests.reuse"))
    store = RecordingStore()
    with caplog.at_level(logging.WARNING, logger="tests.reuse"):
        assert copy_reused(store, pending([ask(n) for n in range(5)]), source) == 2
    assert source.regenerated == {SOURCE_UNREADABLE: 3}
    assert ("reuse: 3 prompt(s) run night1 held are generated again: "
            "{'source completions missing or unreadable': 3}") in caplog.text


def test_nothing_regenerated_logs_no_warning(tmp_path, caplog):
    layout = source_run(tmp_path, "night1", {0: [ask(0)]})
    with caplog.at_level(logging.WARNING):
        copy_reused(RecordingStore(), pending([ask(0)]), open_source(layout, logging.getLogger("tests.reuse")))
    assert caplog.text == ""


def test_the_source_is_closed_even_when_storing_fails(tmp_path):
    layout = source_run(tmp_path, "night1", {0: [ask(0)]})
    source = open_source(layout)

    class FullStore:
        def record_completion(self, *args, **kwargs):
            raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        copy_reused(FullStore(), pending([ask(0)]), source)
    assert source._handles == {}


# --- which earlier night is the source ---------------------------------------------------------------------------

def test_the_newest_run_with_tonights_key_is_the_source_and_tonight_is_never_its_own(tmp_path):
    source_run(tmp_path, "a", {0: [ask(0)]}, written_at=100.0)
    source_run(tmp_path, "c", {0: [ask(0)]}, written_at=300.0)
    source_run(tmp_path, "b", {0: [ask(0)]}, written_at=200.0)
    assert look_up_reuse(tmp_path, "tonight", MATERIAL).source.run_folder == "c"
    assert look_up_reuse(tmp_path, "c", MATERIAL).source.run_folder == "b"


def test_a_run_with_another_key_is_never_the_source_even_if_newer(tmp_path, caplog):
    other = generation_material(MODEL, **{**SAMPLING, "top_p": 0.5})
    source_run(tmp_path, "old", {0: [ask(0)]}, written_at=100.0)
    source_run(tmp_path, "newer", {0: [ask(0)]}, material=other, written_at=200.0)
    lookup = look_up_reuse(tmp_path, "tonight", MATERIAL, logging.getLogger("tests.reuse"))
    assert lookup.source.run_folder == "old" and lookup.changed is None and lookup.skipped == []


def test_with_no_run_of_tonights_key_the_newest_other_run_says_what_changed(tmp_path, caplog):
    older = generation_material(MODEL, **{**SAMPLING, "temperature": 0.1})
    newer = generation_material(MODEL, **{**SAMPLING, "max_tokens": 9})
    source_run(tmp_path, "older", {0: [ask(0)]}, material=older, written_at=100.0)
    source_run(tmp_path, "newer", {0: [ask(0)]}, material=newer, written_at=200.0)
    source_run(tmp_path, "oldest", {0: [ask(0)]}, material=older, written_at=50.0)
    with caplog.at_level(logging.INFO, logger="tests.reuse"):
        lookup = look_up_reuse(tmp_path, "tonight", MATERIAL, logging.getLogger("tests.reuse"))
    assert lookup.source is None and lookup.changed == {"run": "newer", "parts": ["sampling.max_tokens"]}
    assert "reuse: the newest indexed run newer was generated with a different sampling.max_tokens" in caplog.text
    assert lookup.summary() == {"source": None, "skipped": [], "changed": lookup.changed, "regenerated": {}}


def test_a_run_without_a_recorded_time_is_dated_by_its_index_file(tmp_path):
    source_run(tmp_path, "a", {0: [ask(0)]}, written_at=0)
    source_run(tmp_path, "b", {0: [ask(0)]}, written_at=100.0)
    meta_a = RunLayout(tmp_path / "a").reuse_index_meta
    os.utime(meta_a, (10**9 * 3, 10**9 * 3))  # written_at 0: the file's mtime, far newer than 100
    assert look_up_reuse(tmp_path, "tonight", MATERIAL).source.run_folder == "a"


def test_unreadable_records_are_passed_over_with_a_reason_and_logged(tmp_path, caplog):
    source_run(tmp_path, "good", {0: [ask(0)]}, written_at=100.0)
    for name, text in (("torn", '{"key": '), ("listed", "[1, 2]"), ("badtime", '{"written_at": "soon"}')):
        meta = RunLayout(tmp_path / name).reuse_index_meta
        meta.parent.mkdir(parents=True)
        meta.write_text(text)
    with caplog.at_level(logging.WARNING, logger="tests.reuse"):
        lookup = look_up_reuse(tmp_path, "tonight", MATERIAL, logging.getLogger("tests.reuse"))
    assert lookup.source.run_folder == "good"
    assert sorted(skipped["run"] for skipped in lookup.skipped) == ["badtime", "listed", "torn"]
    assert all(skipped["reason"].startswith("cannot read ") for skipped in lookup.skipped)
    assert caplog.text.count("reuse: passing over run ") == 3


def test_an_unusable_newest_source_falls_back_to_the_next_newest_and_says_so(tmp_path, caplog):
    source_run(tmp_path, "first", {0: [ask(0)]}, written_at=100.0)
    source_run(tmp_path, "second", {0: [ask(0)]}, written_at=200.0)
    third = source_run(tmp_path, "third", {0: [ask(0)]}, written_at=300.0)
    third.reuse_index.unlink()
    RunLayout(tmp_path / "second").reuse_index.write_bytes(b"torn")
    with caplog.at_level(logging.WARNING, logger="tests.reuse"):
        lookup = look_up_reuse(tmp_path, "tonight", MATERIAL, logging.getLogger("tests.reuse"))
    assert lookup.source.run_folder == "first"
    assert [skipped["run"] for skipped in lookup.skipped] == ["third", "second"]
    assert f"reuse: passing over run third: cannot read {third.reuse_index}" in caplog.text
    assert lookup.changed is None
    summary = lookup.summary()
    assert summary["source"] == "first" and summary["regenerated"] == {}


def test_no_earlier_run_means_no_source_nothing_skipped_nothing_changed(tmp_path):
    lookup = look_up_reuse(tmp_path, "tonight", MATERIAL)
    assert (lookup.source, lookup.skipped, lookup.changed) == (None, [], None)
    assert ReuseLookup(source=None).summary() == {"source": None, "skipped": [], "changed": None, "regenerated": {}}


def test_the_index_is_memory_mapped_not_read_whole(tmp_path):
    layout = source_run(tmp_path, "night1", {0: [ask(0), ask(1)]})
    assert isinstance(open_source(layout).index, np.memmap)


def test_the_warnings_of_reuse_name_the_file_and_why_in_the_lookups_logger(tmp_path, caplog):
    layout = source_run(tmp_path, "night1", {0: [ask(0)], 1: [ask(1)]})
    missing = layout.shard_file("completions", 1)
    missing.unlink()
    log = logging.getLogger("tests.reuse")
    with caplog.at_level(logging.WARNING, logger="tests.reuse"):
        source = look_up_reuse(tmp_path, "night2", MATERIAL, log).source
        copy_reused(RecordingStore(), pending([ask(0), ask(1)]), source)
    messages = [record.getMessage() for record in caplog.records if record.name == "tests.reuse"]
    assert messages == [
        f"reuse: cannot read {missing} (No such file or directory): its completions are generated again",
        "reuse: 1 prompt(s) run night1 held are generated again: {'source completions missing or unreadable': 1}"]


def test_passing_over_a_run_is_logged_with_its_reason(tmp_path, caplog):
    meta = RunLayout(tmp_path / "torn").reuse_index_meta
    meta.parent.mkdir(parents=True)
    meta.write_text("{")
    with caplog.at_level(logging.WARNING, logger="tests.reuse"):
        lookup = look_up_reuse(tmp_path, "tonight", MATERIAL, logging.getLogger("tests.reuse"))
    assert [record.getMessage() for record in caplog.records] == [
        f"reuse: passing over run torn: {lookup.skipped[0]['reason']}"]


def test_every_unreadable_record_is_passed_over_and_every_readable_run_still_considered(tmp_path):
    for number in range(4):
        source_run(tmp_path, f"good{number}", {0: [ask(0)]}, written_at=100.0 + number)
        meta = RunLayout(tmp_path / f"bad{number}").reuse_index_meta
        meta.parent.mkdir(parents=True)
        meta.write_text("{")
    lookup = look_up_reuse(tmp_path, "tonight", MATERIAL)
    assert lookup.source.run_folder == "good3"
    assert sorted(skipped["run"] for skipped in lookup.skipped) == [f"bad{number}" for number in range(4)]


def test_a_line_that_is_not_an_object_line_says_so():
    with pytest.raises(ValueError) as caught:
        _with_origin(b'"p1"\n', "night1")
    assert str(caught.value) == "not a JSON object line"


def test_each_changed_line_is_counted(tmp_path):
    held = [ask(0), ask(1), ask(2)]
    layout = source_run(tmp_path, "night1", {0: held})
    _rewrite_completions(layout, 0, lambda data: data.replace(b"answer to p0000", b"answer to p000X")
                         .replace(b"answer to p0002", b"answer to p000Y"))
    source = open_source(layout)
    assert copy_reused(RecordingStore(), pending(held), source) == 1
    assert source.regenerated == {LINE_CHANGED: 2}


def test_a_broken_line_does_not_stop_the_copy_of_the_lines_after_it(tmp_path):
    layout = RunLayout(tmp_path / "night1")
    prompts_ = [ask(0), ask(1)]
    lines = [b'{"id":"p0000",broken}\n', completion_line("p0001")]
    completions = layout.shard_file("completions", 0)
    completions.parent.mkdir(parents=True)
    completions.write_bytes(b"".join(lines))
    rows = layout.shard_file("reuse", 0)
    rows.parent.mkdir(parents=True)
    rows.write_text("".join(json.dumps({"h": prompt_hash(prompt).hex(), "o": sum(map(len, lines[:n])),
                                        "n": len(lines[n]), "c": line_checksum(lines[n])}) + "\n"
                            for n, prompt in enumerate(prompts_)))
    write_reuse_index(layout, material=MATERIAL, run_id="night1", launches=read_back())
    store = RecordingStore()
    source = open_source(layout)
    assert copy_reused(store, pending(prompts_), source) == 1
    assert [recorded[2] for recorded in store.recorded] == ["p0001"] and source.regenerated == {LINE_CHANGED: 1}


def test_a_bad_row_does_not_hide_the_rows_after_it(tmp_path):
    layout = RunLayout(tmp_path / "night1")
    path = layout.shard_file("reuse", 1)
    path.parent.mkdir(parents=True)
    good = {"h": prompt_hash(ask(1)).hex(), "o": 0, "n": 10, "c": "00" * 8}
    path.write_text("\n".join(['{"h": "ab', json.dumps({**good, "c": None}), json.dumps(good)]) + "\n")
    assert write_reuse_index(layout, material=MATERIAL, run_id="r", launches=read_back()) == 1


def test_what_changed_since_the_newest_run_is_logged_part_by_part(tmp_path, caplog):
    before = generation_material(MODEL, **{**SAMPLING, "top_p": 0.5, "temperature": 0.1})
    source_run(tmp_path, "night1", {0: [ask(0)]}, material=before)
    with caplog.at_level(logging.INFO, logger="tests.reuse"):
        look_up_reuse(tmp_path, "night2", MATERIAL, logging.getLogger("tests.reuse"))
    assert [record.getMessage() for record in caplog.records] == [
        "reuse: the newest indexed run night1 was generated with a different sampling.temperature, sampling.top_p"]


def test_every_line_that_keeps_its_checksum_but_is_not_json_is_counted(tmp_path):
    layout = RunLayout(tmp_path / "night1")
    prompts_ = [ask(0), ask(1)]
    lines = [b'{"id":"p0000",broken}\n', b'{"id":"p0001",broken}\n']
    completions = layout.shard_file("completions", 0)
    completions.parent.mkdir(parents=True)
    completions.write_bytes(b"".join(lines))
    rows = layout.shard_file("reuse", 0)
    rows.parent.mkdir(parents=True)
    rows.write_text("".join(json.dumps({"h": prompt_hash(prompt).hex(), "o": sum(map(len, lines[:n])),
                                        "n": len(lines[n]), "c": line_checksum(lines[n])}) + "\n"
                            for n, prompt in enumerate(prompts_)))
    write_reuse_index(layout, material=MATERIAL, run_id="night1", launches=read_back())
    source = open_source(layout)
    assert copy_reused(RecordingStore(), pending(prompts_), source) == 0
    assert source.regenerated == {LINE_CHANGED: 2}


def test_a_shard_without_usable_rows_does_not_hide_the_next_shards_rows(tmp_path):
    layout = RunLayout(tmp_path / "night1")
    first, second = layout.shard_file("reuse", 1), layout.shard_file("reuse", 2)
    first.parent.mkdir(parents=True)
    first.write_text('{"h": "ab\n')  # only a torn row
    second.write_text(json.dumps({"h": prompt_hash(ask(1)).hex(), "o": 0, "n": 10, "c": "00" * 8}) + "\n")
    assert write_reuse_index(layout, material=MATERIAL, run_id="r", launches=read_back()) == 1
    assert int(np.load(layout.reuse_index)[0]["shard"]) == 2


def test_tonights_own_folder_listed_first_does_not_end_the_search(tmp_path, monkeypatch):
    source_run(tmp_path, "tonight", {0: [ask(0)]}, written_at=300.0)
    source_run(tmp_path, "night1", {0: [ask(0)]}, written_at=100.0)
    listed = Path.glob

    def tonight_first(self, pattern):
        return sorted(listed(self, pattern), key=lambda path: path.parent.parent.name != "tonight")

    monkeypatch.setattr(Path, "glob", tonight_first)
    assert look_up_reuse(tmp_path, "tonight", MATERIAL).source.run_folder == "night1"


@pytest.mark.parametrize("validation", ["failed", "none"])
def test_a_run_whose_validation_did_not_pass_is_never_a_source_and_the_lookup_says_why(tmp_path, validation, caplog):
    older = source_run(tmp_path, "older", {0: [ask(1)]}, written_at=1_000.0)
    newest = source_run(tmp_path, "unvalidated", {0: [ask(1)]}, written_at=2_000.0)
    if validation == "failed":  # validate failed and was marked success by hand
        validated(newest, success=False)
    else:  # validate never wrote its summary
        newest.validation_summary.unlink()
    with caplog.at_level(logging.WARNING, logger="tests.reuse"):
        lookup = look_up_reuse(tmp_path, "tonight", MATERIAL, logging.getLogger("tests.reuse"))
    assert lookup.source.run_folder == older.root.name
    [skipped] = lookup.skipped
    assert skipped["run"] == "unvalidated"
    assert (("did not pass (2 expectation(s) failed: missing_prompts, error_share" if validation == "failed"
             else "no validation summary at") in skipped["reason"]) and str(newest.validation_summary) in skipped["reason"]
    assert f"reuse: passing over run unvalidated: {skipped['reason']}" in caplog.messages


# --- what the source's shards accepted: the launches its index records ---------------------------------------------

def test_the_index_records_each_launch_the_shards_accepted_completions_from_as_wait_ready_read_it(tmp_path):
    readiness = [{"server": "n0:30000", "version": "0.5.23", "max_total_num_tokens": 9,
                  "launch_fields": {"model_path": "/models/m", "weight_version": "fleetgen/night1", "tp_size": 2}},
                 {"server": "n1:30000"}]  # an SGLang that reported none of them
    launches = accepted_launches(readiness)
    assert launches == {"n0:30000": {"model_path": "/models/m", "weight_version": "fleetgen/night1",
                                     "version": "0.5.23"},
                        "n1:30000": {"model_path": None, "weight_version": None, "version": None}}
    layout = RunLayout(tmp_path / "night1")
    write_reuse_index(layout, material=MATERIAL, run_id="night1", launches=launches)
    assert json.loads(layout.reuse_index_meta.read_text())["launches"] == launches


@pytest.mark.parametrize("fields, says", [
    ({"model_path": "/models/other"}, "model_path '/models/other', not the identity's '/models/qwen3.6-27b'"),
    ({"version": "0.5.24"}, "version '0.5.24', not the identity's '0.5.23'"),
    ({"model_path": None, "version": None}, "model_path None, not the identity's '/models/qwen3.6-27b'; version None"),
])
def test_a_source_whose_shards_accepted_another_launch_than_its_model_identity_is_passed_over(tmp_path, caplog,
                                                                                              fields, says):
    older = source_run(tmp_path, "older", {0: [ask(1)]}, written_at=1_000.0)
    newest = source_run(tmp_path, "other-model", {0: [ask(1)]}, written_at=2_000.0)
    meta = json.loads(newest.reuse_index_meta.read_text())  # its completions were written by another checkpoint
    newest.reuse_index_meta.write_text(json.dumps({**meta, "launches": read_back(**fields)}))
    with caplog.at_level(logging.WARNING, logger="tests.reuse"):
        lookup = look_up_reuse(tmp_path, "tonight", MATERIAL, logging.getLogger("tests.reuse"))
    assert lookup.source.run_folder == older.root.name
    [skipped] = lookup.skipped
    assert skipped["run"] == "other-model" and skipped["reason"].startswith(
        f"its completions were accepted from n0:30000 (launched by run 'night1'), whose launch read back {says}")
    assert f"reuse: passing over run other-model: {skipped['reason']}" in caplog.messages


@pytest.mark.parametrize("launches", [None, {}])
def test_an_index_that_records_no_launch_is_not_a_source(tmp_path, launches):
    layout = source_run(tmp_path, "night1", {0: [ask(1)]})
    meta = json.loads(layout.reuse_index_meta.read_text())
    meta.pop("launches") if launches is None else meta.update(launches=launches)
    layout.reuse_index_meta.write_text(json.dumps(meta))
    lookup = look_up_reuse(tmp_path, "tonight", MATERIAL)
    assert lookup.source is None
    assert lookup.skipped == [{"run": "night1", "reason": "its index records no launch its completions were accepted "
                                                         "from"}]


def test_a_model_path_under_home_matches_the_launch_that_read_it_back_expanded(tmp_path):
    material = generation_material({**MODEL, "parts": {**PARTS, "path": "~/models/m"}}, **SAMPLING)
    layout = source_run(tmp_path, "night1", {0: [ask(1)]}, material=material)
    meta = json.loads(layout.reuse_index_meta.read_text())
    layout.reuse_index_meta.write_text(json.dumps({**meta, "launches": read_back(
        material, model_path="/home/fleetgen/models/m")}))  # the node's shell expanded ~/ for SGLang
    assert look_up_reuse(tmp_path, "tonight", material).source.run_folder == "night1"
