"""The prompts file as a whole: scan figures, problem listings, the sparse index, shard cuts and reads."""

import json
import os

import pytest

from fleetgen.errors import PromptsError
from fleetgen.prompts import scan as scan_module
from fleetgen.prompts.scan import (PromptScan, iter_prompt_ids, iter_shard, iter_shard_positions, plan_shards,
                                   scan_prompts, shard_size_within)


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
    assert caught.value.message == "no valid prompts (1 rejected, 2 lines)"
    assert caught.value.hint == "check the file is the prompts JSONL and read the rejects"
    assert not (tmp_path / "r.jsonl").exists()
    with pytest.raises(PromptsError) as empty:
        scan_prompts(_write(tmp_path / "e.jsonl", []))
    assert empty.value.hint == "check the file is the prompts JSONL"
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
