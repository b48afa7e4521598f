"""The hot path's JSON (generate/jsonio.py): compact UTF-8 bytes, keys in insertion order, one error type."""

import json

import pytest

from fleetgen.generate import jsonio


def test_dumps_gives_compact_utf8_bytes_with_keys_in_insertion_order():
    encoded = jsonio.dumps({"z": 1, "a": [True, None, 2.5], "text": "café ü"})
    assert isinstance(encoded, bytes)
    assert encoded == '{"z":1,"a":[true,null,2.5],"text":"café ü"}'.encode()


def test_what_dumps_writes_loads_reads_back_with_json_booleans_kept_as_booleans():
    value = {"id": "p0001", "try": 1, "draining": True, "in_flight": {"s0:1": 0}}
    back = jsonio.loads(jsonio.dumps(value))
    assert back == value and back["draining"] is True and type(back["try"]) is int
    assert jsonio.loads(jsonio.dumps(value).decode()) == value  # str is read too


@pytest.mark.parametrize("text", [b'{"servers": {"s1:1": {"state": "do', b"", b"not json"])
def test_a_torn_or_foreign_file_raises_the_decode_error_callers_catch_as_a_value_error(text):
    with pytest.raises(jsonio.JSONDecodeError):
        jsonio.loads(text)
    assert issubclass(jsonio.JSONDecodeError, ValueError)  # callers catch ValueError


def test_the_standard_library_reads_what_dumps_writes():
    assert json.loads(jsonio.dumps({"a": "ü", "b": [1, 2]})) == {"a": "ü", "b": [1, 2]}
