"""The prompts file as a whole: scan figures, problem listings, the sparse index, shard cuts and reads."""

import json
import os
import pytest
from hypothesis import given, settings, strategies as st
from fleetgen.errors import PromptsError
from fleetgen.prompts.scan import (INDEX_STRIDE, PromptScan, fast_id, iter_prompt_ids, iter_shard, plan_shards,
                              scan_prompts)
import hashlib
from fleetgen.prompts import scan as scan_module
from fleetgen.prompts.scan import (PromptScan, iter_prompt_ids, iter_shard, iter_shard_positions, plan_shards,
                                   read_planned_prompts, scan_prompts, shard_size_within)

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


def _line(prompt_id, text="q", **extra):
    return json.dumps({"id": prompt_id, "prompt": text, **extra}) + "\n"


def _write(path, lines):
    path.write_text("".join(lines))
    return path


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


def test_positions_skip_ids_and_count_them(tmp_path):
    lines = [_line("a"), "\n", _line("b", ""), _line("c"), json.dumps({"prompt": "q", "id": "d"}) + "\n",
             _line("e")]
    path = _write(tmp_path / "p.jsonl", lines)
    starts = [sum(len(x) for x in lines[:i]) for i in range(len(lines) + 1)]
    got = list(iter_shard_positions(path, 0, 4, skip_ids={b"c", b"d"}, first_index=10))
    assert [(i, s, e, p.id) for i, s, e, p in got] == [(10, starts[0], starts[1], "a"), (13, starts[5], starts[6], "e")]
    assert list(iter_prompt_ids(path)) == ["a", "c", "d", "e"]
    assert [p.id for p in iter_shard(path, starts[3], 2)] == ["c", "d"]


def test_shard_reads_refuse_ranges_that_do_not_fit(tmp_path):
    lines = [_line("a"), _line("b")]
    path = _write(tmp_path / "p.jsonl", lines)
    with pytest.raises(PromptsError, match="shard start 3 is not at the beginning of a line"):
        list(iter_shard(path, 3, 1))
    with pytest.raises(PromptsError, match=f"the shard range from byte {len(lines[0])} holds 1 valid prompts, "
                                           "2 were planned"):
        list(iter_shard(path, len(lines[0]), 2))
    _write(path, [_line("a"), "[1]\n"])
    with pytest.raises(PromptsError, match=f"line at byte {len(lines[0])}: expected a JSON object, got list"):
        list(iter_shard(path, 0, 2))


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
    assert [f.hint for f in failures] == [scan_module._CHANGED, scan_module._CHANGED,
                                          "set shard_size to the number of prompts one task should generate",
                                          scan_module._CHANGED]
    assert failures[3].message == "the file ends before valid prompt 5"
    path.write_text(_line("a") + "[1]\n")
    with pytest.raises(PromptsError) as bad_line:
        list(iter_shard(path, 0, 2))
    assert (bad_line.value.path, bad_line.value.hint) == (str(path), scan_module._CHANGED)
    path.write_text(_line("a") + _line("bb"))
    with pytest.raises(PromptsError) as changed:
        plan_shards(path, shard_size=1, scan=scan)
    assert (changed.value.message, changed.value.path, changed.value.hint) == (
        "the prompts file changed after it was scanned", str(path), scan_module._CHANGED)
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
    assert caught.value.hint == "fix these lines (each needs valid JSON and a unique string id) and start the run again"
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


def test_the_planned_prompts_are_the_scans_whatever_was_appended_and_a_changed_block_is_refused(tmp_path):
    path = _write(tmp_path / "p.jsonl", [_line("a"), _line("b", sampling={"max_tokens": 9000}), _line("c")])
    scan = scan_prompts(path).to_dict()  # as the validate task receives it
    with path.open("a") as handle:
        handle.write(_line("appended-after-the-scan"))
    planned = read_planned_prompts(scan)
    assert (planned.ids, planned.own_max_tokens) == (["a", "b", "c"], {"b": 9000})
    path.write_text(_line("a") + _line("B") + _line("c"))
    with pytest.raises(PromptsError) as caught:
        read_planned_prompts(scan)
    assert caught.value.message.startswith("the prompts file changed after the run was planned: bytes 0 to ")
    assert "put the prompts_path file back" in caught.value.hint


def test_the_scan_records_the_largest_own_max_tokens_and_request(tmp_path):
    from fleetgen.prompts.length import LengthLimit

    path = _write(tmp_path / "p.jsonl", [_line("a", "x" * 400), _line("b", "x" * 40, sampling={"max_tokens": 700}),
                                         _line("c", "x" * 4000, sampling={"max_tokens": 900})])
    scan = scan_prompts(path, length_limit=LengthLimit(context_tokens=1000, max_tokens=500, source="test"))
    assert (scan.count, scan.too_long) == (2, 1)  # c: 1000 + 900 does not fit
    assert (scan.own_max_tokens_max, scan.request_tokens_max) == (700, 10 + 700)
    assert (scan.output_tokens_max(500), scan.output_tokens_max(800)) == (700, 800)
    assert scan_prompts(_write(tmp_path / "q.jsonl", [_line("a")])).own_max_tokens_max is None


def test_a_file_written_while_a_shard_reads_it_is_checked_again_at_the_end(tmp_path):
    path = _write(tmp_path / "p.jsonl", [_line(f"p{n}") for n in range(4)])
    [shard] = plan_shards(path, shard_size=4, scan=scan_prompts(path))

    def read(change):
        positions = iter_shard_positions(path, shard["start"], shard["count"], end=shard["end"],
                                         blocks=shard["blocks"], shard=0)
        first = next(positions)
        change()
        return [first[3].id] + [position[3].id for position in positions]

    stat = path.stat()
    assert read(lambda: os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))) == ["p0", "p1", "p2", "p3"]
    # Same size, other bytes: what was read may not be what was planned.
    with pytest.raises(PromptsError, match="changed after the run was planned") as caught:
        read(lambda: path.write_text(path.read_text().replace('"p3"', '"pX"')))
    assert caught.value.shard == 0


def _changed_message(start, end, first, now, scanned=None):
    size = f"the file is now {now:,} bytes" + (f", {scanned:,} when scanned" if scanned is not None else "")
    return (f"the prompts file changed after the run was planned: bytes {start:,} to {end:,} (valid prompts from "
            f"{first:,} on) no longer hold what the scan read; {size} (lines inserted, removed or replaced)")


class _ReadSizes:
    """A file handle that records the size of every read."""

    def __init__(self, handle):
        self.handle, self.reads = handle, []

    def read(self, size=-1):
        data = self.handle.read(size)
        self.reads.append(size)
        return data

    def __getattr__(self, name):
        return getattr(self.handle, name)


def test_a_block_of_several_mebibytes_is_checked_in_pieces_of_at_most_one(tmp_path):
    size = 2 * (1 << 20) + 1  # two full pieces and one byte
    head = '{"id": "big", "prompt": "'
    path = tmp_path / "p.jsonl"
    path.write_text(head + "x" * (size - len(head) - 3) + '"}\n')
    scan = scan_prompts(path)
    assert scan.bytes == size and scan.blocks()[0][1:3] == [0, size]
    with path.open("rb") as raw:
        handle = _ReadSizes(raw)
        scan_module.check_blocks(handle, str(path), scan.blocks(), shard=3, scanned_bytes=size)
    assert handle.reads == [1 << 20, 1 << 20, 1]  # exactly the block, never more than 1 MiB at once
    with path.open("r+b") as edit:  # one byte replaced in the last piece: same size, other bytes
        edit.seek(size - 4)
        edit.write(b"y")
    with path.open("rb") as handle, pytest.raises(PromptsError) as caught:
        scan_module.check_blocks(handle, str(path), scan.blocks(), shard=3, scanned_bytes=size)
    error = caught.value
    assert error.message == _changed_message(0, size, 0, size, scanned=size)
    assert error.message.endswith("the file is now 2,097,153 bytes, 2,097,153 when scanned "
                                  "(lines inserted, removed or replaced)")
    assert (error.path, error.shard, error.hint) == (str(path), 3, scan_module._RESTORE)
    with path.open("rb") as handle, pytest.raises(PromptsError) as unsized:
        scan_module.check_blocks(handle, str(path), scan.blocks())
    assert unsized.value.message == _changed_message(0, size, 0, size)
    assert (unsized.value.path, unsized.value.shard) == (str(path), None)


def test_each_shard_carries_only_the_blocks_it_reads_and_they_check_out(tmp_path, monkeypatch):
    monkeypatch.setattr(scan_module, "INDEX_STRIDE", 2)
    path = _write(tmp_path / "p.jsonl", [_line(f"p{n}") for n in range(5)])
    scan = scan_prompts(path)
    shards = plan_shards(path, shard_size=2, scan=scan)
    # Shards cut on block boundaries: a block that ends where a shard starts, or starts where it ends, is not its.
    assert [[block[0] for block in s["blocks"]] for s in shards] == [[0], [2], [4]]
    with path.open("rb") as handle:
        for shard in shards:  # blocks that do not start the file check out too
            scan_module.check_blocks(handle, str(path), shard["blocks"], shard=shard["shard_id"])
        scan_module.check_blocks(handle, str(path), scan.blocks())


def _planned_shards(tmp_path, lines, shard_size):
    path = _write(tmp_path / "p.jsonl", lines)
    return path, plan_shards(path, shard_size=shard_size, scan=scan_prompts(path))


def _positions(path, shard, start=None, count=None):
    return iter_shard_positions(path, shard["start"] if start is None else start,
                                shard["count"] if count is None else count, end=shard["end"],
                                blocks=shard["blocks"], shard=7)


def test_a_shard_refuses_a_file_changed_since_the_plan_before_reading(tmp_path):
    lines = [_line("a"), _line("b")]
    path, [shard] = _planned_shards(tmp_path, lines, 2)
    _write(path, [_line("a"), _line("c")])
    with pytest.raises(PromptsError) as caught:
        next(_positions(path, shard))
    size = len("".join(lines))
    assert caught.value.message == _changed_message(0, size, 0, size)
    assert (caught.value.path, caught.value.shard, caught.value.hint) == (str(path), 7, scan_module._RESTORE)


def test_resume_points_at_and_past_the_shards_end(tmp_path):
    lines = [_line("a"), _line("b"), _line("c").rstrip("\n")]  # the last line has no newline
    path, shards = _planned_shards(tmp_path, lines, 2)
    end = shards[1]["end"]
    assert end == path.stat().st_size
    # A finished last shard: the resume point is its end, right after a line without newline.
    assert list(_positions(path, shards[1], start=end, count=0)) == []
    assert list(_positions(path, shards[0], start=shards[0]["end"], count=0)) == []
    with pytest.raises(PromptsError) as caught:
        next(_positions(path, shards[0], start=shards[0]["end"] + 1, count=0))
    error = caught.value
    assert error.message == f"resume point {shards[0]['end'] + 1} lies past the shard's end {shards[0]['end']}"
    assert (error.path, error.shard, error.hint) == (str(path), 7, scan_module._RESTORE)


def test_a_planned_shard_refuses_a_start_inside_a_line_or_too_few_prompts(tmp_path):
    lines = [_line("a"), _line("b"), _line("c")]
    path, [shard] = _planned_shards(tmp_path, lines, 3)
    with pytest.raises(PromptsError) as inside:
        next(_positions(path, shard, start=3))
    assert inside.value.message == "shard start 3 is not at the beginning of a line"
    assert (inside.value.path, inside.value.shard, inside.value.hint) == (str(path), 7, scan_module._RESTORE)
    with pytest.raises(PromptsError) as short:
        list(_positions(path, shard, count=4))
    assert short.value.message == "the shard range from byte 0 holds 3 valid prompts, 4 were planned"
    assert (short.value.path, short.value.shard, short.value.hint) == (str(path), 7, scan_module._RESTORE)


def test_a_line_broken_while_a_planned_shard_reads_it_names_the_shard(tmp_path):
    lines = [_line(f"p{n:03d}") for n in range(400)]  # well past one read buffer
    path, [shard] = _planned_shards(tmp_path, lines, 400)
    broken = 300
    offset = sum(len(x) for x in lines[:broken])
    positions = _positions(path, shard)
    assert next(positions)[3].id == "p000"
    with path.open("r+b") as edit:  # same size, no longer an object
        edit.seek(offset)
        edit.write(b"[1" + b" " * (len(lines[broken]) - 4) + b"]\n")
    with pytest.raises(PromptsError) as caught:
        list(positions)
    error = caught.value
    assert error.message == f"line at byte {offset}: expected a JSON object, got list"
    assert (error.path, error.shard, error.hint) == (str(path), 7, scan_module._RESTORE)


def test_a_shard_followed_by_others_is_checked_again_when_written_while_it_reads(tmp_path):
    lines = [_line(f"p{n}") for n in range(4)]
    path, shards = _planned_shards(tmp_path, lines, 2)
    stat = path.stat()
    positions = _positions(path, shards[0])
    assert next(positions)[3].id == "p0"
    path.write_text(path.read_text().replace('"p1"', '"pX"'))  # inside the first shard, same size
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    with pytest.raises(PromptsError) as caught:
        list(positions)  # the read stops at the shard's end, then checks the blocks again
    size = stat.st_size
    assert caught.value.message == _changed_message(0, size, 0, size)
    assert (caught.value.path, caught.value.shard, caught.value.hint) == (str(path), 7, scan_module._RESTORE)


def test_a_last_line_without_newline_appended_to_since_the_scan_reads_as_planned(tmp_path):
    lines = [_line("a"), _line("b"), _line("c").rstrip("\n")]
    path, shards = _planned_shards(tmp_path, lines, 2)
    scan = scan_prompts(path).to_dict()
    size = path.stat().st_size
    with path.open("a") as handle:  # another file concatenated without a newline between
        handle.write(_line("d"))
    start = len(lines[0]) + len(lines[1])
    assert shards[1]["start"] == start
    assert [(i, s, e, p.id) for i, s, e, p in _positions(path, shards[1])] == [(0, start, size, "c")]
    assert read_planned_prompts(scan).ids == ["a", "b", "c"]


@pytest.mark.parametrize("offset, end, expected", [
    (0, "end", "byte 0 lies outside the shard's planned range {start} to {end}"),
    ("start", "end", None),
    ("start+1", "end", "byte {offset} is not the start of a line of the prompts file"),
    ("line", "end", None),
    ("end", "end", None),  # the end of a file without newline: nothing follows
    ("end+1", "end", "byte {offset} lies outside the shard's planned range {start} to {end}"),
    ("line", None, None),
    (0, None, "byte 0 lies outside the shard's planned range {start} to EOF"),
])
def test_a_resume_offset_must_be_a_line_start_within_the_planned_range(tmp_path, offset, end, expected):
    lines = [_line("a"), _line("b"), _line("c"), _line("d").rstrip("\n")]
    path, shards = _planned_shards(tmp_path, lines, 2)
    shard = dict(shards[1])
    if end is None:
        del shard["end"]
    start, shard_end = shard["start"], shards[1]["end"]
    where = {"start": start, "start+1": start + 1, "line": start + len(lines[2]), "end": shard_end,
             "end+1": shard_end + 1}
    offset = where.get(offset, offset)
    problem = scan_module.resume_offset_problem(shard, offset)
    assert problem == (expected.format(offset=offset, start=start, end=shard_end) if expected else None)


def test_the_planned_prompts_of_a_scan_object_with_a_length_limit(tmp_path):
    from fleetgen.prompts.length import LengthLimit

    path = _write(tmp_path / "p.jsonl", [_line("a"), _line("long", "x" * 4000), _line("c")])
    scan = scan_prompts(path, length_limit=LengthLimit(context_tokens=500, max_tokens=100, source="test"))
    assert scan.too_long == 1
    assert read_planned_prompts(scan).ids == ["a", "c"]  # the scan itself, not its dict; the long one set aside
    assert read_planned_prompts(scan.to_dict()).ids == ["a", "c"]


def test_the_planned_prompts_refuse_a_same_size_edit_naming_the_file_and_sizes(tmp_path):
    lines = [_line("a"), _line("b"), _line("c")]
    path = _write(tmp_path / "p.jsonl", lines)
    scan = scan_prompts(path).to_dict()
    _write(path, [_line("a"), _line("B"), _line("c")])
    with pytest.raises(PromptsError) as caught:
        read_planned_prompts(scan)
    size = len("".join(lines))
    assert caught.value.message == _changed_message(0, size, 0, size, scanned=size)
    assert (caught.value.path, caught.value.shard, caught.value.hint) == (str(path), None, scan_module._RESTORE)


def test_the_planned_prompts_of_a_scan_from_before_digests(tmp_path, monkeypatch):
    monkeypatch.setattr(scan_module, "INDEX_STRIDE", 2)
    path = _write(tmp_path / "p.jsonl", [_line("r", "")] + [_line(f"p{n}") for n in range(5)])
    data = scan_prompts(path).to_dict()
    del data["digests"]
    assert PromptScan.from_dict(data).digests == ()
    assert read_planned_prompts(data).ids == [f"p{n}" for n in range(5)]
    older = scan_prompts(_write(tmp_path / "q.jsonl", [_line("a"), _line("b")])).to_dict()
    del older["digests"], older["index"]  # older still: no index either, the range starts the file
    assert read_planned_prompts(older).ids == ["a", "b"]


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
