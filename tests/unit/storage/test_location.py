"""prompts_path / output_root as locations: local paths and file:// URLs stay local, s3:// URLs name a bucket and a
prefix, and anything else is refused naming the DAG parameter."""

import pathlib

import pytest

from fleetgen.errors import ConfigError
from fleetgen.storage.location import ObjectLocation, is_object_location, parse_location


def test_a_local_path_and_a_file_url_are_local_folders():
    assert parse_location("/data/out", parameter="output_root") == pathlib.Path("/data/out")
    assert parse_location("~/out", parameter="output_root") == pathlib.Path("~/out").expanduser()
    assert parse_location("file:///data/my%20out", parameter="output_root") == pathlib.Path("/data/my out")
    assert parse_location("file://localhost/data", parameter="output_root") == pathlib.Path("/data")
    assert not is_object_location(parse_location("relative/out", parameter="output_root"))
    assert parse_location("C:/data/out", parameter="output_root") == pathlib.Path("C:/data/out")  # a drive letter


def test_an_s3_url_names_its_bucket_and_prefix_without_slashes():
    location = parse_location("s3://runs/nightly/2026/", parameter="output_root")
    assert location == ObjectLocation("s3", "runs", "nightly/2026") and is_object_location(location)
    assert parse_location("s3://runs/X1/", parameter="output_root").key == "X1"
    assert parse_location("s3://runs/a%20b", parameter="output_root").key == "a b"
    assert location.url == "s3://runs/nightly/2026"
    assert location.child("run_1", "shards/shard-00001.json").url == "s3://runs/nightly/2026/run_1/shards/shard-00001.json"
    assert location.key_of("a//b/") == "nightly/2026/a/b"
    root = parse_location("S3://runs", parameter="output_root")
    assert root == ObjectLocation("s3", "runs", "") and root.url == "s3://runs" and root.child("x").key == "x"
    assert str(root) == "s3://runs"


@pytest.mark.parametrize("text, reason", [
    ("", "is empty"),
    ("   ", "is empty"),
    ("s3:///prefix", "no bucket"),
    ("s3://key:secret@runs/x", "no bucket"),
    ("s3://key@runs/x", "no bucket"),
    ("s3://runs:9000/x", "no bucket"),
    ("s3://runs/./x", "'.', '..'"),
    ("s3://runs/..", "'.', '..'"),
    ("s3://runs/x?versionId=1", "no ?query"),
    ("s3://runs/a/../b", "'.', '..'"),
    ("s3://runs/a//b", "empty segment"),
    ("gs://runs/x", "gs:// is not served yet"),
    ("abfs://runs/x", "abfs:// is not served yet"),
    ("http://runs/x", "unknown scheme http://"),
    ("file://otherhost/data", "not on 'otherhost'"),
])
def test_a_location_that_cannot_be_used_is_refused_naming_the_parameter(text, reason):
    with pytest.raises(ConfigError) as refused:
        parse_location(text, parameter="prompts_path")
    assert reason in str(refused.value) and "prompts_path" in str(refused.value)
    assert refused.value.hint.startswith(("set the DAG parameter prompts_path", "write the DAG parameter prompts_path"))


def test_a_store_of_another_kind_is_refused_saying_what_is_served():
    with pytest.raises(ConfigError) as refused:
        parse_location("gs://runs/x", parameter="output_root")
    assert refused.value.message == ("output_root='gs://runs/x': gs:// is not served yet; object storage is s3:// "
                                     "(any S3-compatible store, through an Airflow aws connection with endpoint_url)")
    assert refused.value.hint == ("set the DAG parameter output_root to an s3:// URL or a local folder "
                                  "(docs/object-storage.md §1)")
    with pytest.raises(ConfigError) as empty:
        parse_location("", parameter="output_root")
    assert empty.value.hint == "set the DAG parameter output_root to a local folder or an s3://bucket/prefix URL"
    with pytest.raises(ConfigError) as credentials:
        parse_location("s3://a@runs", parameter="output_root")
    assert credentials.value.hint == ("write the DAG parameter output_root as s3://bucket/prefix; credentials belong "
                                      "in the Airflow connection named by storage_conn_id")
