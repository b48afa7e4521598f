import json
import os

import pytest
from hypothesis import given, settings, strategies as st

from fleetgen.errors import PromptsError
from fleetgen.prompts.scan import (INDEX_STRIDE, PromptScan, fast_id, iter_prompt_ids, iter_shard, plan_shards,
                              scan_prompts)


def chat(prompt_id, text="hello", **extra):
    return {"id": prompt_id, "messages": [{"role": "user", "content": text}], **extra}


def write_lines(path, lines):
    with open(path, "w", encoding="utf-8") as handle:
        for line in lines:
            handle.write((line if isinstance(line, str) else json.dumps(line)) + "\n")
    return path


def test_scan_counts_valid_prompts_and_estimates_tokens(tmp_path):
    path = write_lines(tmp_path / "p.jsonl", [
        chat("a", "x" * 40),
        {"id": "b", "prompt": "y" * 80, "sampling": {"temperature": 0.2, "max_tokens": 16}},
        {"id": "c", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                                 {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]},
        "",
    ])
    scan = scan_prompts(path)
    assert (scan.count, scan.rejected, scan.lines) == (3, 0, 4)
    assert scan.bytes == os.path.getsize(path)
    assert scan.prompt_chars_max == 80
    assert scan.est_prompt_tokens_max == 20
    assert scan.prompt_chars_mean == pytest.approx((40 + 80 + 8 + 2 + 5 + 4) / 3)
    assert json.loads(json.dumps(scan.to_dict()))["count"] == 3


@pytest.mark.parametrize("line, expected", [
    ('{"id": "a", "messages": [', "malformed JSON"),
    ('["not", "an", "object"]', "expected a JSON object, got list"),
    ('{"messages": [{"role": "user", "content": "hi"}]}', 'missing "id"'),
    ('{"id": 7, "prompt": "hi"}', '"id" must be a non-empty string'),
    ('{"id": "  ", "prompt": "hi"}', '"id" must be a non-empty string'),
])
def test_structural_problems_fail_with_file_and_line(tmp_path, line, expected):
    path = write_lines(tmp_path / "p.jsonl", [chat("ok"), line, chat("ok2")])
    with pytest.raises(PromptsError) as caught:
        scan_prompts(path, rejects_path=tmp_path / "rejects.jsonl")
    error = caught.value
    assert error.problems[0][0] == 2 and expected in error.problems[0][1]
    assert error.path == str(path) and error.line == 2
    assert f"{path}:2" in str(error) and "What to check next" in str(error)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.jsonl"]  # nothing half-written left behind
    write_lines(path, [chat("ok"), {"id": "r", "messages": []}, chat("ok2")])  # fixed: the next run works
    assert scan_prompts(path, rejects_path=tmp_path / "rejects.jsonl").rejected == 1
    assert (tmp_path / "rejects.jsonl").exists()


def test_invalid_utf8_is_structural(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"id": "a", "prompt": "hi"}\n{"id": "b", "prompt": "\xff\xfe"}\n')
    with pytest.raises(PromptsError) as caught:
        scan_prompts(path)
    assert caught.value.problems[0][0] == 2


def test_duplicate_ids_name_both_lines(tmp_path):
    path = write_lines(tmp_path / "p.jsonl", [chat("a"), chat("b"), chat("a"), chat("c"), chat("b")])
    with pytest.raises(PromptsError) as caught:
        scan_prompts(path)
    assert caught.value.problems == [(3, "duplicate id 'a' (first at line 1)"),
                                     (5, "duplicate id 'b' (first at line 2)")]


def test_problem_list_is_capped_with_a_count(tmp_path):
    path = write_lines(tmp_path / "p.jsonl", ["{bad"] * 25 + [chat("a")])
    with pytest.raises(PromptsError) as caught:
        scan_prompts(path, max_listed=20)
    assert len(caught.value.problems) == 20
    assert "25 structural problem(s)" in str(caught.value) and "... and 5 more" in str(caught.value)


@pytest.mark.parametrize("record, expected", [
    ({"id": "r", "messages": []}, '"messages" is empty'),
    ({"id": "r", "messages": "hi"}, '"messages" must be a list'),
    ({"id": "r", "messages": [{"role": "wizard", "content": "hi"}]}, "message 1 has role 'wizard'"),
    ({"id": "r", "messages": [{"role": "user", "content": 5}]}, "content must be a string, got int"),
    ({"id": "r", "messages": [{"role": "system", "content": "only system"}]}, "no user message"),
    ({"id": "r", "prompt": ""}, '"prompt" is empty'),
    ({"id": "r", "prompt": ["hi"]}, '"prompt" must be a string'),
    ({"id": "r"}, 'needs exactly one of "messages" and "prompt"'),
    ({"id": "r", "prompt": "hi", "messages": [{"role": "user", "content": "hi"}]}, "exactly one"),
    ({"id": "r", "prompt": "hi", "sampling": {"temperature": "hot"}}, 'sampling override "temperature"'),
    ({"id": "r", "prompt": "hi", "sampling": {"temprature": 0.1}}, 'unknown sampling override "temprature"'),
    ({"id": "r", "prompt": "hi", "sampling": {"max_tokens": True}}, '"max_tokens" must be a positive integer'),
    ({"id": "r", "prompt": "hi", "sampling": [1]}, '"sampling" must be an object'),
])
def test_per_prompt_problems_go_to_rejects_and_the_rest_proceeds(tmp_path, record, expected):
    path = write_lines(tmp_path / "p.jsonl", [chat("a"), record, chat("b")])
    rejects = tmp_path / "out" / "rejects.jsonl"
    scan = scan_prompts(path, rejects_path=rejects)
    assert (scan.count, scan.rejected) == (2, 1)
    [reject] = [json.loads(line) for line in rejects.read_text().splitlines()]
    assert reject["line"] == 2 and reject["id"] == "r" and expected in reject["error"]
    shard = plan_shards(path, shard_size=10, scan=scan)[0]
    assert [p.id for p in iter_shard(path, shard["start"], shard["count"])] == ["a", "b"]
    assert list(iter_prompt_ids(path)) == ["a", "b"]


def test_file_without_valid_prompts_or_missing_file_fails(tmp_path):
    path = write_lines(tmp_path / "p.jsonl", [{"id": "r", "messages": []}])
    with pytest.raises(PromptsError, match="no valid prompts"):
        scan_prompts(path)
    with pytest.raises(PromptsError, match="cannot read the prompts file"):
        scan_prompts(tmp_path / "missing.jsonl")


def test_tool_call_and_content_part_messages_are_valid(tmp_path):
    record = {"id": "t", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function"}]},
        {"role": "tool", "content": "sunny"}]}
    path = write_lines(tmp_path / "p.jsonl", [record])
    assert scan_prompts(path).count == 1


def make_mixed_file(path, kinds):
    """kinds: 'v' valid, 'r' rejected, 'b' blank. Returns the valid ids in order."""
    lines, valid = [], []
    for number, kind in enumerate(kinds):
        if kind == "v":
            record = chat(f"p{number}", "t" * (number % 7 + 1))
            if number % 3 == 0:  # id not first: resume must still find it
                record = {"messages": record["messages"], "id": record["id"]}
            lines.append(record)
            valid.append(f"p{number}")
        elif kind == "r":
            lines.append({"id": f"p{number}", "messages": []})
        else:
            lines.append("   ")
    write_lines(path, lines)
    return valid


@settings(max_examples=40, deadline=None)
@given(kinds=st.lists(st.sampled_from("vvvvrb"), min_size=1, max_size=60), shard_size=st.integers(1, 9))
def test_shards_partition_the_valid_prompts_in_order(tmp_path_factory, kinds, shard_size):
    path = tmp_path_factory.mktemp("shards") / "p.jsonl"
    valid = make_mixed_file(path, kinds)
    if not valid:
        return
    shards = plan_shards(path, shard_size=shard_size)
    assert [s["shard_id"] for s in shards] == list(range(len(shards)))
    assert all(s["count"] <= shard_size for s in shards)
    got = [p.id for s in shards for p in iter_shard(s["input_path"], s["start"], s["count"])]
    assert got == valid


def test_index_stride_boundaries_and_more_than_1024_shards(tmp_path):
    kinds = ("v" * 997 + "r" + "b") * 3
    path = tmp_path / "p.jsonl"
    valid = make_mixed_file(path, kinds)
    scan = scan_prompts(path)
    assert scan.count == len(valid) == 2991
    assert len(scan.index) == -(-scan.count // INDEX_STRIDE)
    shards = plan_shards(path, shard_size=2, scan=scan)
    assert len(shards) == 1496
    got = [p.id for s in shards for p in iter_shard(path, s["start"], s["count"])]
    assert got == valid
    json.dumps(shards)


def test_skip_ids_skips_without_yielding(tmp_path):
    path = tmp_path / "p.jsonl"
    valid = make_mixed_file(path, "vvrvbvv")
    shard = plan_shards(path, shard_size=100)[0]
    done = {valid[0].encode(), valid[2].encode()}
    assert [p.id for p in iter_shard(path, shard["start"], shard["count"], skip_ids=done)] == [valid[1]] + valid[3:]


def test_a_changed_file_is_detected(tmp_path):
    path = write_lines(tmp_path / "p.jsonl", [chat("a"), chat("b"), chat("c")])
    scan = scan_prompts(path)
    shards = plan_shards(path, shard_size=1, scan=scan)
    write_lines(path, [chat("aa"), chat("b")])
    with pytest.raises(PromptsError, match="changed after it was scanned"):
        plan_shards(path, shard_size=1, scan=scan)
    with pytest.raises(PromptsError, match="not at the beginning of a line"):
        list(iter_shard(path, shards[1]["start"], 1))
    with pytest.raises(PromptsError, match="holds 0 valid prompts, 1 were planned"):
        list(iter_shard(path, os.path.getsize(path), 1))


def test_shard_size_must_be_positive(tmp_path):
    path = write_lines(tmp_path / "p.jsonl", [chat("a")])
    with pytest.raises(PromptsError, match="shard_size"):
        plan_shards(path, shard_size=0)


def test_fast_id_reads_only_plain_leading_ids():
    assert fast_id(b'{"id":"abc","x":1}\n') == b"abc"
    assert fast_id(b'{"id": "\xc3\xa9t\xc3\xa9", "x":1}\n') == "été".encode()
    assert fast_id(b'{"id":"a\\"b","x":1}\n') is None
    assert fast_id(b'{"x":1,"id":"abc"}\n') is None


def test_a_scan_survives_xcom_and_plans_the_same_shards(tmp_path):
    path = tmp_path / "p.jsonl"
    make_mixed_file(path, ("v" * 30 + "r") * 80)
    scan = scan_prompts(path)
    again = PromptScan.from_dict(json.loads(json.dumps(scan.to_dict())))
    assert again == scan
    assert plan_shards(path, shard_size=700, scan=again) == plan_shards(path, shard_size=700)


def test_shard_size_grows_only_to_fit_the_map_limit():
    from fleetgen.prompts.scan import shard_size_within

    assert shard_size_within(913_786, 500, 1024) == 893      # 1,023 shards instead of 1,828
    assert shard_size_within(913_786, 5000, 1024) == 5000    # already fits
    assert shard_size_within(0, 500, 1024) == 500
    assert -(-913_786 // shard_size_within(913_786, 1, 1024)) <= 1024
