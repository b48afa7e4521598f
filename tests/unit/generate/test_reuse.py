"""Regenerate only what changed: which earlier completions are reused, how they are copied, and the index."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from generate_fakes import FakeFleet, fast_settings, shard_output

from fleetgen.generate import run_shard_async
from fleetgen.generate.reuse import (LINE_CHANGED, SOURCE_UNREADABLE, changed_parts, generation_key,
                                     generation_material, look_up_reuse, prompt_hash,
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
    summary = await run_shard_async(shard, fleet.endpoints(), root / run, fast_settings(), transport=fleet.transport(),
                                    reuse=lookup.source)
    write_reuse_index(RunLayout(root / run), material=material, run_id=run)
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
        assert write_reuse_index(layout, material=MATERIAL, run_id="night1") == 50
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
        write_reuse_index(layout, material=MATERIAL, run_id="night1")
    assert layout.reuse_index.read_bytes() == b"the index of an earlier try"


def test_changed_parts_names_each_part_that_differs():
    changed = {**MATERIAL, "model": {**PARTS, "weights": "x", "sglang": "0.5.24"}, "extra_body": {"a": 1}}
    assert changed_parts(MATERIAL, changed) == ["extra_body", "model.sglang", "model.weights"]
    assert changed_parts(MATERIAL, MATERIAL) == []
