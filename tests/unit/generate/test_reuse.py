"""Regenerate only what changed: which earlier completions are reused, how they are copied, and the index."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from generate_fakes import FakeFleet, fast_settings, shard_output

from fleetgen.generate import run_shard_async
from fleetgen.generate.reuse import (find_reuse_source, generation_key, prompt_hash, reuse_enabled,
                                     write_reuse_index)
from fleetgen.outputs import RunLayout
from fleetgen.prompts.scan import Prompt, plan_shards

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validate"))
from validate_fixtures import FileAccessWatch  # noqa: E402

pytestmark = pytest.mark.anyio
MODEL = {"path": "/models/qwen3.6-27b", "config_sha256": "c" * 64, "index_sha256": "i" * 64}
SAMPLING = {"max_tokens": 64, "temperature": 0.6, "top_p": 0.95, "extra_body": {}}
KEY = generation_key(MODEL, **SAMPLING)


def write_prompts(path: Path, records: list[dict]) -> dict:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return plan_shards(path, shard_size=len(records))[0]


def prompts(count: int) -> list[dict]:
    return [{"id": f"p{n:04d}", "messages": [{"role": "user", "content": f"question {n}"}]} for n in range(count)]


async def generate(root: Path, run: str, records: list[dict], *, key: str = KEY, fleet: FakeFleet | None = None):
    """One run's shard; its index is written afterwards as a successful run's is."""
    fleet = fleet or FakeFleet(2)
    shard = write_prompts(root / f"{run}.jsonl", records)
    source = find_reuse_source(root, run, key)
    summary = await run_shard_async(shard, fleet.endpoints(), root / run, fast_settings(), transport=fleet.transport(),
                                    reuse=source)
    write_reuse_index(RunLayout(root / run), key=key, run_id=run)
    return summary, fleet


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
    assert summary["reused"] == 30 and {r["reused_from"] for r in shard_output(tmp_path / "night3")["completions"]} \
        == {"night2"}


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
    {"model": {**MODEL, "path": "/models/other"}}, {"model": {**MODEL, "config_sha256": "d" * 64}},
    {"model": {**MODEL, "index_sha256": "j" * 64}}, {"max_tokens": 128}, {"temperature": 0.7}, {"top_p": 0.9},
    {"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}}])
async def test_a_changed_model_or_sampling_reuses_nothing(tmp_path, change):
    await generate(tmp_path, "night1", prompts(10))
    model = change.get("model", MODEL)
    sampling = {**SAMPLING, **{k: v for k, v in change.items() if k != "model"}}
    key = generation_key(model, **sampling)
    assert key != KEY and find_reuse_source(tmp_path, "night2", key) is None
    summary, fleet = await generate(tmp_path, "night2", prompts(10), key=key)
    assert summary["reused"] == 0 and summary["done"] == 10 and sum(fleet.requests.values()) == 10


async def test_the_index_is_built_without_reading_the_completions(tmp_path):
    await generate(tmp_path, "night1", prompts(50))
    layout = RunLayout(tmp_path / "night1")
    with FileAccessWatch(layout.kind_dir("completions")) as watch:
        assert write_reuse_index(layout, key=KEY, run_id="night1") == 50
    assert watch.touched == []
    assert layout.reuse_index.stat().st_size <= 50 * 32 + 256  # 32 bytes a completion, plus the .npy header
    assert json.loads(layout.reuse_index_meta.read_text())["key"] == KEY


async def test_a_completion_that_changed_since_its_index_is_not_reused(tmp_path):
    await generate(tmp_path, "night1", prompts(5))
    path = RunLayout(tmp_path / "night1").shard_file("completions", 0)
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join([lines[1], lines[0], *lines[2:]]))  # two lines swapped: offsets now wrong
    summary, _ = await generate(tmp_path, "night2", prompts(5))
    assert summary["reused"] == 3 and summary["done"] == 2


def test_prompt_hash_and_the_reuse_modes():
    base = Prompt(id="a", messages=[{"role": "user", "content": "x"}])
    assert prompt_hash(base) == prompt_hash(Prompt(id="a", messages=[{"role": "user", "content": "x"}]))
    assert len({prompt_hash(base), prompt_hash(Prompt(id="a", prompt="x")),
                prompt_hash(Prompt(id="a", messages=[{"role": "user", "content": "x"}], sampling={"top_p": 0.5}))}) == 3
    assert reuse_enabled("scheduled", "scheduled") and not reuse_enabled("scheduled", "manual")
    assert reuse_enabled("always", "manual") and not reuse_enabled("never", "scheduled")

