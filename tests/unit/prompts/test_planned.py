"""The prompts a run planned, read back: a shard's range with its block checks, resume points, validation's ids."""

import json
import os

import pytest
from prompt_files import _line, _write, make_mixed_file

from fleetgen.errors import PromptsError
from fleetgen.prompts import scan as scan_module
from fleetgen.prompts.planned import (RESTORE_PLANNED, check_blocks, iter_shard, iter_shard_positions,
                                      read_planned_prompts, resume_offset_problem)
from fleetgen.prompts.scan import PromptScan, iter_prompt_ids, plan_shards, scan_prompts


def test_skip_ids_skips_without_yielding(tmp_path):
    path = tmp_path / "p.jsonl"
    valid = make_mixed_file(path, "vvrvbvv")
    shard = plan_shards(path, shard_size=100)[0]
    done = {valid[0].encode(), valid[2].encode()}
    assert [p.id for p in iter_shard(path, shard["start"], shard["count"], skip_ids=done)] == [valid[1]] + valid[3:]


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
        check_blocks(handle, str(path), scan.blocks(), shard=3, scanned_bytes=size)
    assert handle.reads == [1 << 20, 1 << 20, 1]  # exactly the block, never more than 1 MiB at once
    with path.open("r+b") as edit:  # one byte replaced in the last piece: same size, other bytes
        edit.seek(size - 4)
        edit.write(b"y")
    with path.open("rb") as handle, pytest.raises(PromptsError) as caught:
        check_blocks(handle, str(path), scan.blocks(), shard=3, scanned_bytes=size)
    error = caught.value
    assert error.message == _changed_message(0, size, 0, size, scanned=size)
    assert error.message.endswith("the file is now 2,097,153 bytes, 2,097,153 when scanned "
                                  "(lines inserted, removed or replaced)")
    assert (error.path, error.shard, error.hint) == (str(path), 3, RESTORE_PLANNED)
    with path.open("rb") as handle, pytest.raises(PromptsError) as unsized:
        check_blocks(handle, str(path), scan.blocks())
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
            check_blocks(handle, str(path), shard["blocks"], shard=shard["shard_id"])
        check_blocks(handle, str(path), scan.blocks())


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
    assert (caught.value.path, caught.value.shard, caught.value.hint) == (str(path), 7, RESTORE_PLANNED)


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
    assert (error.path, error.shard, error.hint) == (str(path), 7, RESTORE_PLANNED)


def test_a_planned_shard_refuses_a_start_inside_a_line_or_too_few_prompts(tmp_path):
    lines = [_line("a"), _line("b"), _line("c")]
    path, [shard] = _planned_shards(tmp_path, lines, 3)
    with pytest.raises(PromptsError) as inside:
        next(_positions(path, shard, start=3))
    assert inside.value.message == "shard start 3 is not at the beginning of a line"
    assert (inside.value.path, inside.value.shard, inside.value.hint) == (str(path), 7, RESTORE_PLANNED)
    with pytest.raises(PromptsError) as short:
        list(_positions(path, shard, count=4))
    assert short.value.message == "the shard range from byte 0 holds 3 valid prompts, 4 were planned"
    assert (short.value.path, short.value.shard, short.value.hint) == (str(path), 7, RESTORE_PLANNED)


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
    assert (error.path, error.shard, error.hint) == (str(path), 7, RESTORE_PLANNED)


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
    assert (caught.value.path, caught.value.shard, caught.value.hint) == (str(path), 7, RESTORE_PLANNED)


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
    problem = resume_offset_problem(shard, offset)
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
    assert (caught.value.path, caught.value.shard, caught.value.hint) == (str(path), None, RESTORE_PLANNED)


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
