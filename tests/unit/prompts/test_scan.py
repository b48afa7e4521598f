"""The prompts file as a whole: scan figures, problem listings, the sparse index and shard cuts."""

import hashlib
import json
import os

import pytest
from hypothesis import given, settings, strategies as st
from prompt_files import _line, _write, chat, make_mixed_file, write_lines

from fleetgen.errors import PromptsError
from fleetgen.prompts import scan as scan_module
from fleetgen.prompts.planned import iter_shard, iter_shard_positions
from fleetgen.prompts.scan import (CHANGED_SINCE_SCAN, INDEX_STRIDE, PromptScan, fast_id, iter_prompt_ids, plan_shards,
                                   scan_prompts, shard_size_within)


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


@settings(max_examples=40, deadline=None)
@given(kinds=st.lists(st.sampled_from("vvvvrb"), min_size=1, max_size=60), shard_size=st.integers(1, 9),
       head=st.integers(0, 70))
def test_a_head_of_trial_prompts_gets_shards_of_its_own_and_the_rest_follows(tmp_path_factory, kinds, shard_size,
                                                                             head):
    path = tmp_path_factory.mktemp("shards") / "p.jsonl"
    valid = make_mixed_file(path, kinds)
    if not valid:
        return
    shards = plan_shards(path, shard_size=shard_size, head=head)
    assert [s["shard_id"] for s in shards] == list(range(len(shards)))
    assert all(0 < s["count"] <= shard_size for s in shards)
    got = [p.id for s in shards for p in iter_shard(s["input_path"], s["start"], s["count"])]
    assert got == valid
    # no shard straddles the head: the first ones cover exactly its prompts
    within = min(head, len(valid))
    assert sum(s["count"] for s in shards if s["first"] < within) == within
    assert all(s["first"] + s["count"] <= within for s in shards if s["first"] < within)


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

    assert shard_size_within(913_786, 500, 1024) == 893      # 1,023 shards instead of 1,828
    assert shard_size_within(913_786, 5000, 1024) == 5000    # already fits
    assert shard_size_within(0, 500, 1024) == 500
    assert -(-913_786 // shard_size_within(913_786, 1, 1024)) <= 1024


def test_scan_figures_rejects_and_a_round_trip(tmp_path):
    lines = [_line("a", "1234"), "\n", _line("b", "12345678"), _line("r", "x", sampling={"top_p": 0}),
             _line("c", "12")]
    path = _write(tmp_path / "p.jsonl", lines)
    scan = scan_prompts(path, rejects_path=tmp_path / "out" / "rejects.jsonl")
    assert (scan.count, scan.rejected, scan.lines, scan.bytes) == (3, 1, 5, path.stat().st_size)
    assert (scan.prompt_chars_mean, scan.prompt_chars_max) == (14 / 3, 8)
    assert (scan.est_prompt_tokens_mean, scan.est_prompt_tokens_max) == (14 / 12, 2)
    assert scan.mtime_ns == path.stat().st_mtime_ns and scan.index == ((0, 0),)
    assert json.loads((tmp_path / "out" / "rejects.jsonl").read_text()) == {
        "line": 4, "id": "r", "error": 'sampling override "top_p" must be a number in (0, 1], got 0'}
    data = scan.to_dict()
    assert data["est_prompt_tokens_mean"] == 1.2 and data["est_prompt_tokens_max"] == 2
    assert data["index"] == [[0, 0]] and data["rejects_path"] == str(tmp_path / "out" / "rejects.jsonl")
    assert PromptScan.from_dict({**data, "unknown": 1}) == scan
    assert not (tmp_path / "out" / "rejects.jsonl.partial").exists()


def test_the_sparse_index_holds_every_strides_first_valid_prompt(tmp_path, monkeypatch):
    monkeypatch.setattr(scan_module, "INDEX_STRIDE", 2)
    lines = [_line(f"p{n}") for n in range(5)]
    lines.insert(2, _line("bad", ""))
    path = _write(tmp_path / "p.jsonl", lines)
    scan = scan_prompts(path)
    offsets = [sum(len(x) for x in lines[:i]) for i in range(len(lines))]
    assert scan.index == ((0, 0), (2, offsets[3]), (4, offsets[5]))
    shards = plan_shards(path, shard_size=2, scan=scan)
    assert [(s["start"], s["count"]) for s in shards] == [(0, 2), (offsets[3], 2), (offsets[5], 1)]
    assert [s["shard_id"] for s in shards] == [0, 1, 2]
    assert [[p.id for p in iter_shard(path, s["start"], s["count"])] for s in shards] == [
        ["p0", "p1"], ["p2", "p3"], ["p4"]]
    assert [s["start"] for s in plan_shards(path, shard_size=3, scan=scan)] == [0, offsets[4]]


def test_structural_problems_are_listed_with_lines_then_counted(tmp_path):
    lines = ["[1]\n", _line("a"), "{bad\n", _line("a"), '{"prompt": "x"}\n', _line("b"), _line("a")]
    path = _write(tmp_path / "p.jsonl", lines)
    with pytest.raises(PromptsError) as caught:
        scan_prompts(path, rejects_path=tmp_path / "rejects.jsonl", max_listed=3)
    error = caught.value
    assert error.message.startswith("5 structural problem(s) in the prompts file:\n"
                                    "  line 1: expected a JSON object, got list\n  line 3: malformed JSON (")
    assert error.message.endswith("  line 4: duplicate id 'a' (first at line 2)\n  ... and 2 more")
    assert error.line == 1 and error.path == str(path) and len(error.problems) == 3
    assert not (tmp_path / "rejects.jsonl").exists() and not (tmp_path / "rejects.jsonl.partial").exists()


def test_every_duplicate_names_where_its_id_first_appeared(tmp_path):
    lines = [_line("x"), json.dumps({"prompt": "q", "id": "y"}) + "\n", _line("x"), _line("y"), _line("x")]
    with pytest.raises(PromptsError) as caught:
        scan_prompts(_write(tmp_path / "p.jsonl", lines))
    assert caught.value.problems == [(3, "duplicate id 'x' (first at line 1)"),
                                     (4, "duplicate id 'y' (first at line 2)"),
                                     (5, "duplicate id 'x' (first at line 1)")]


def test_a_file_without_valid_prompts(tmp_path):
    path = _write(tmp_path / "p.jsonl", [_line("a", ""), "\n"])
    with pytest.raises(PromptsError) as caught:
        scan_prompts(path, rejects_path=tmp_path / "r.jsonl")
    rejects = tmp_path / "r.jsonl"
    assert caught.value.message == (f"no valid prompts (1 rejected, 2 lines); every reason is in {rejects}\n"
                                    '  line 1: "prompt" is empty')
    assert caught.value.line == 1 and caught.value.hint.startswith(
        "check that prompts_path is the prompts JSONL and fix the rejected lines")
    # The error points at the rejects: they are there to read.
    assert [json.loads(line)["id"] for line in rejects.read_text().splitlines()] == ["a"]
    with pytest.raises(PromptsError) as empty:
        scan_prompts(_write(tmp_path / "e.jsonl", []))
    assert empty.value.hint == "check that prompts_path is the prompts JSONL"
    with pytest.raises(PromptsError, match="cannot read the prompts file: No such file or directory"):
        scan_prompts(tmp_path / "missing.jsonl")


@pytest.mark.parametrize("count, size, most, expected", [
    (900_000, 500, 1024, 879), (1000, 500, 1024, 500), (0, 500, 1, 500), (10, 3, 2, 5), (10, 5, 2, 5)])
def test_shard_size_within(count, size, most, expected):
    assert shard_size_within(count, size, most) == expected


def test_shard_size_within_refuses_no_shards():
    with pytest.raises(ValueError, match="max_shards must be >= 1, got 0"):
        shard_size_within(10, 5, 0)


@pytest.mark.parametrize("size", [0, -1, 2.0, "2"])
def test_plan_shards_refuses_a_bad_size(tmp_path, size):
    with pytest.raises(PromptsError, match=f"shard_size must be a positive integer, got {size!r}"):
        plan_shards(_write(tmp_path / "p.jsonl", [_line("a")]), shard_size=size)


def test_plan_shards_refuses_a_file_changed_since_the_scan(tmp_path):
    path = _write(tmp_path / "p.jsonl", [_line("a")])
    scan = scan_prompts(path)
    with path.open("a") as handle:
        handle.write(_line("b"))
    with pytest.raises(PromptsError, match="changed after it was scanned"):
        plan_shards(path, shard_size=1, scan=scan)
    os.utime(path, ns=(scan.mtime_ns, scan.mtime_ns + 1))
    path.write_text(_line("a"))
    os.utime(path, ns=(scan.mtime_ns, scan.mtime_ns + 5))
    with pytest.raises(PromptsError, match="changed after it was scanned"):
        plan_shards(path, shard_size=1, scan=scan)


def test_shard_boundaries_are_found_from_the_index_or_the_cursor_not_from_the_top(tmp_path, monkeypatch):
    monkeypatch.setattr(scan_module, "INDEX_STRIDE", 4)
    path = _write(tmp_path / "p.jsonl", [_line(f"p{n}") for n in range(12)])
    scan = scan_prompts(path)
    parsed = []
    real_parse = scan_module.parse_line
    monkeypatch.setattr(scan_module, "parse_line", lambda raw: parsed.append(raw) or real_parse(raw))
    starts = [s["start"] for s in plan_shards(path, shard_size=4, scan=scan)]
    assert len(parsed) == 3  # one line read per boundary: each sits on an index entry
    parsed.clear()
    assert [s["start"] for s in plan_shards(path, shard_size=2, scan=scan)][::2] == starts
    assert len(parsed) == 12  # 1 + 3 per pair: a boundary between index entries reads on from the entry


def test_errors_carry_the_file_and_what_to_do(tmp_path):
    path = _write(tmp_path / "p.jsonl", [_line("a"), _line("b")])
    scan = scan_prompts(path)
    failures = []
    for attempt in (lambda: list(iter_shard(path, 1, 1)), lambda: list(iter_shard(path, 0, 3)),
                    lambda: plan_shards(path, shard_size=0), lambda: scan_module._find_valid(
                        path.open("rb"), scan, 5, (0, 0))):
        with pytest.raises(PromptsError) as caught:
            attempt()
        failures.append(caught.value)
    assert [f.path for f in failures] == [str(path)] * 4
    assert [f.hint for f in failures] == [CHANGED_SINCE_SCAN, CHANGED_SINCE_SCAN,
                                          "set shard_size to the number of prompts one task should generate",
                                          CHANGED_SINCE_SCAN]
    assert failures[3].message == "the file ends before valid prompt 5"
    path.write_text(_line("a") + "[1]\n")
    with pytest.raises(PromptsError) as bad_line:
        list(iter_shard(path, 0, 2))
    assert (bad_line.value.path, bad_line.value.hint) == (str(path), CHANGED_SINCE_SCAN)
    path.write_text(_line("a") + _line("bb"))
    with pytest.raises(PromptsError) as changed:
        plan_shards(path, shard_size=1, scan=scan)
    assert (changed.value.message, changed.value.path, changed.value.hint) == (
        "the prompts file changed after it was scanned", str(path), CHANGED_SINCE_SCAN)
    with pytest.raises(PromptsError) as missing:
        scan_prompts(tmp_path / "none.jsonl")
    assert missing.value.path == str(tmp_path / "none.jsonl")
    assert missing.value.hint == "check the prompts_path parameter and that the file is readable from the worker"


def test_problem_listing_edges(tmp_path):
    path = _write(tmp_path / "p.jsonl", ["[1]\n"] * 25)
    with pytest.raises(PromptsError) as caught:
        scan_prompts(path)
    assert len(caught.value.problems) == 20 and caught.value.message.endswith("\n  ... and 5 more")
    assert caught.value.path == str(path)
    assert caught.value.hint == ('fix these lines (each needs valid JSON and a unique string id: "custom_id" in a Batch '
                                 'API file, all in one format) and start the run again')
    _write(path, ["[1]\n", "[2]\n", _line("a")])
    with pytest.raises(PromptsError) as exact:
        scan_prompts(path, max_listed=2)
    assert exact.value.message.endswith("line 2: expected a JSON object, got list")
    with pytest.raises(PromptsError) as none_valid:
        scan_prompts(_write(path, [_line("x", "")]))
    assert none_valid.value.path == str(path)


def test_a_single_prompt_with_rejects_in_a_new_folder(tmp_path):
    path = _write(tmp_path / "p.jsonl", [_line("r1", ""), _line("a"), _line("r2", " ")])
    rejects = tmp_path / "a" / "b" / "rejects.jsonl"
    scan = scan_prompts(path, rejects_path=rejects)
    assert (scan.count, scan.rejected, scan.path, scan.rejects_path) == (1, 2, str(path), str(rejects))
    assert [json.loads(x)["id"] for x in rejects.read_text().splitlines()] == ["r1", "r2"]
    assert scan_prompts(path).rejects_path is None
    assert PromptScan.from_dict({k: v for k, v in scan.to_dict().items() if k != "index"}).index == ()
    assert [i for i, _, _, _ in iter_shard_positions(path, 0, 1)] == [0]


def test_each_shard_carries_its_end_and_the_digested_blocks_it_overlaps(tmp_path, monkeypatch):
    monkeypatch.setattr(scan_module, "INDEX_STRIDE", 2)
    lines = [_line(f"p{n}") for n in range(5)]
    lines.insert(2, _line("bad", ""))  # a rejected line inside the second block is part of its bytes
    path = _write(tmp_path / "p.jsonl", lines)
    scan = scan_prompts(path)
    offsets = [sum(len(x) for x in lines[:i]) for i in range(len(lines) + 1)]
    data = path.read_bytes()
    assert scan.blocks() == [
        [first, start, end, hashlib.sha256(data[start:end]).hexdigest()[:32]]
        for first, start, end in ((0, 0, offsets[3]), (2, offsets[3], offsets[5]), (4, offsets[5], offsets[6]))]
    assert PromptScan.from_dict(json.loads(json.dumps(scan.to_dict()))).blocks() == scan.blocks()
    shards = plan_shards(path, shard_size=3, scan=scan)
    assert [(s["start"], s["end"]) for s in shards] == [(0, offsets[4]), (offsets[4], offsets[6])]
    assert [[block[0] for block in s["blocks"]] for s in shards] == [[0, 2], [2, 4]]


def test_the_scan_records_the_largest_own_max_tokens_and_request(tmp_path):
    from fleetgen.prompts.length import LengthLimit

    path = _write(tmp_path / "p.jsonl", [_line("a", "x" * 400), _line("b", "x" * 40, sampling={"max_tokens": 700}),
                                         _line("c", "x" * 4000, sampling={"max_tokens": 900})])
    scan = scan_prompts(path, length_limit=LengthLimit(context_tokens=1000, max_tokens=500, source="test"))
    assert (scan.count, scan.too_long) == (2, 1)  # c: 1000 + 900 does not fit
    assert (scan.own_max_tokens_max, scan.request_tokens_max) == (700, 10 + 700)
    assert (scan.output_tokens_max(500), scan.output_tokens_max(800)) == (700, 800)
    assert scan_prompts(_write(tmp_path / "q.jsonl", [_line("a")])).own_max_tokens_max is None


def test_the_scan_dict_is_plain_json(tmp_path):
    path = _write(tmp_path / "p.jsonl", [_line("a"), _line("b")])
    data = scan_prompts(path).to_dict()
    assert data == json.loads(json.dumps(data))  # lists, not tuples; no extra keys
    assert data["digests"] == [hashlib.sha256(path.read_bytes()).hexdigest()[:32]]


def test_a_file_of_rejected_prompts_lists_the_first_reasons_and_counts_the_rest(tmp_path):
    path = _write(tmp_path / "p.jsonl", [_line("a", ""), _line("b", ""), _line("c", "")])
    with pytest.raises(PromptsError) as caught:
        scan_prompts(path, max_listed=2)
    assert caught.value.message == ('no valid prompts (3 rejected, 3 lines)\n  line 1: "prompt" is empty\n'
                                    '  line 2: "prompt" is empty\n  ... and 1 more')
    assert caught.value.hint == (
        "check that prompts_path is the prompts JSONL and fix the rejected lines (or raise the context: the "
        "context_length param or --context-length in the fleet's server.extra_args, when they are too long)")
    empty = _write(tmp_path / "e.jsonl", [])
    for rejects in (None, tmp_path / "r.jsonl"):
        with pytest.raises(PromptsError) as nothing:
            scan_prompts(empty, rejects_path=rejects)
        assert nothing.value.message == "no valid prompts (0 rejected, 0 lines)"


@pytest.mark.parametrize("head, expected", [
    (b"\x1f\x8b\x08\x00", ("gzip", "gunzip -k")), (b"BZh91AY", ("bzip2", "bunzip2 -k")),
    (b"\xfd7zXZ\x00\x00", ("xz", "unxz -k")), (b"\x28\xb5\x2f\xfd\x00", ("zstd", "unzstd")),
    (b'{"id": "a", "prompt": "hi"}\n', None), (b"\x1f", None), (b"", None)])
def test_a_compressed_file_is_told_by_its_first_bytes(tmp_path, head, expected):
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(head)
    assert scan_module.compression_of(path) == expected


def test_a_file_that_cannot_be_opened_is_left_for_the_scan_to_name(tmp_path):
    assert scan_module.compression_of(tmp_path / "absent.jsonl") is None
    assert scan_module.compression_of(tmp_path) is None


@pytest.mark.parametrize("chars, longest_line, runner_up_tokens", [
    ([40, 120], 2, 10),  # a longer prompt takes over: the one it displaces is the runner-up
    ([120, 40, 80], 1, 20),  # the most characters among the others
    ([120, 120], 1, 30),  # a tie: the first keeps its place, the second is the runner-up
    ([120], 1, None),  # nothing else: no runner-up
])
def test_the_longest_prompt_is_the_first_with_the_most_characters_and_the_runner_up_the_most_of_the_others(
        tmp_path, chars, longest_line, runner_up_tokens):
    path = _write(tmp_path / "p.jsonl", [_line(f"p{number}", "x" * count) for number, count in enumerate(chars, 1)])
    scan = scan_prompts(path)
    assert scan.longest == {"id": f"p{longest_line}", "line": longest_line, "prompt_tokens": 30}
    assert scan.runner_up_prompt_tokens == runner_up_tokens


def test_the_trial_head_ends_in_a_shorter_shard_when_the_shard_size_does_not_divide_it(tmp_path):
    path = _write(tmp_path / "p.jsonl", [_line(f"p{number}") for number in range(10)])
    shards = plan_shards(path, shard_size=2, head=5)
    assert [(s["first"], s["count"]) for s in shards] == [(0, 2), (2, 2), (4, 1), (5, 2), (7, 2), (9, 1)]
