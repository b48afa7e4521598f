"""The object seam against a real S3-compatible store (SeaweedFS): whole-object and range reads, conditional
writes, listing past one page, and every fault named by URL, connection and DAG parameter."""

import concurrent.futures
import os

import pytest

from fleetgen.errors import (ObjectMissing, StoreBucketMissing, StoreConflict, StoreDenied, StoreError,
                             StoreUnreachable)
from fleetgen.storage.location import parse_location
from fleetgen.storage.objects import RETRY_ATTEMPTS, ObjectStore
from store_fault_proxy import INTERNAL, SLOW_DOWN, FaultProxy

CONN_ID = "fleetgen_test_store"


def connect(url, conn_id=CONN_ID, parameter="output_root"):
    return ObjectStore.connect(parse_location(url, parameter=parameter), conn_id=conn_id, parameter=parameter)


def test_an_object_reads_back_whole_and_by_range(object_store):
    etag = object_store.put("a/data.jsonl", b"0123456789")
    assert object_store.get("a/data.jsonl") == b"0123456789"
    assert object_store.get("a/data.jsonl", start=2, end=5) == b"234"
    assert object_store.get("a/data.jsonl", start=7) == b"789"
    assert object_store.get("a/data.jsonl", end=2) == b"01"
    assert object_store.get("a/data.jsonl", start=4, end=4) == b""
    info = object_store.head("a/data.jsonl")
    assert (info.name, info.size, info.etag) == ("a/data.jsonl", 10, etag)
    assert object_store.head("a/none") is None
    object_store.delete("a/data.jsonl")
    with pytest.raises(ObjectMissing, match=r"\[s3://fleetgen/.*/a/data.jsonl\] no such object to read"):
        object_store.get("a/data.jsonl")


def test_a_create_only_write_loses_to_an_existing_object(object_store):
    object_store.put("lease.json", b"first", if_absent=True)
    with pytest.raises(StoreConflict, match=r"lease.json\] could not write the object: another writer changed it "
                                            r"first \(PreconditionFailed\)"):
        object_store.put("lease.json", b"second", if_absent=True)
    assert object_store.get("lease.json") == b"first"


def test_a_replace_only_write_needs_the_version_it_read(object_store):
    first = object_store.put("lease.json", b"v1")
    second = object_store.put("lease.json", b"v2", if_match=first)
    with pytest.raises(StoreConflict):
        object_store.put("lease.json", b"stale", if_match=first)
    assert object_store.get("lease.json") == b"v2"
    object_store.put("lease.json", b"v3", if_match=second)
    assert object_store.get("lease.json") == b"v3"


def test_listing_returns_every_object_under_a_prefix_in_name_order_past_one_page(object_store):
    names = [f"log/{index:06d}.json" for index in range(1003)]  # S3 answers at most 1,000 keys a page
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda name: object_store.put(name, b"{}"), names))
    object_store.put("logbook.json", b"{}")
    listed = object_store.list("log/")
    assert [info.name for info in listed] == names and {info.size for info in listed} == {2}
    assert [info.name for info in object_store.below("log").list("00100")] == [
        "001000.json", "001001.json", "001002.json"]


def test_a_missing_bucket_is_named_with_the_connection_and_the_parameter(seaweedfs):
    store = connect("s3://no-such-bucket/runs", parameter="output_root")
    with pytest.raises(StoreBucketMissing) as missing:
        store.get("x.json")
    text = str(missing.value)
    assert "[s3://no-such-bucket/runs/x.json]" in text and "'no-such-bucket' does not exist" in text
    assert "the DAG parameter output_root" in text and f"storage_conn_id (the connection, now '{CONN_ID}')" in text
    assert missing.value.conn_id == CONN_ID


def test_wrong_credentials_are_refused_without_being_shown(seaweedfs, store_prefix, monkeypatch):
    connection = seaweedfs.connection()
    connection["password"] = "a-wrong-secret-value"
    monkeypatch.setenv("AIRFLOW_CONN_FLEETGEN_WRONG_KEY", __import__("json").dumps(connection))
    store = connect(store_prefix, conn_id="fleetgen_wrong_key", parameter="prompts_path")
    with pytest.raises(StoreDenied) as denied:
        store.put("x.json", b"{}")
    text = str(denied.value)
    assert "refused to write the object with the credentials of the Airflow connection 'fleetgen_wrong_key'" in text
    assert "the DAG parameter prompts_path" in text and "a-wrong-secret-value" not in text
    assert seaweedfs.secret_key not in text


def test_a_store_that_does_not_answer_is_named_unreachable(monkeypatch, store_prefix, seaweedfs):
    connection = seaweedfs.connection()
    connection["extra"]["endpoint_url"] = "http://127.0.0.1:9"  # discard: nothing listens
    monkeypatch.setenv("AIRFLOW_CONN_FLEETGEN_NOWHERE", __import__("json").dumps(connection))
    monkeypatch.setattr("fleetgen.storage.objects.RETRY_ATTEMPTS", 2)
    store = connect(store_prefix, conn_id="fleetgen_nowhere")
    with pytest.raises(StoreUnreachable) as unreachable:
        store.list("")
    text = str(unreachable.value)
    assert "the store does not answer" in text and "endpoint_url in the extra of the Airflow connection " \
                                                  "'fleetgen_nowhere'" in text


@pytest.fixture
def proxied(seaweedfs, store_prefix, monkeypatch):
    proxy = FaultProxy(seaweedfs.endpoint_url)
    connection = seaweedfs.connection()
    connection["extra"]["endpoint_url"] = proxy.url
    monkeypatch.setenv("AIRFLOW_CONN_FLEETGEN_PROXIED", __import__("json").dumps(connection))
    yield proxy, connect(store_prefix, conn_id="fleetgen_proxied")
    proxy.close()


def test_slow_down_and_internal_errors_are_retried_until_the_store_answers(proxied):
    proxy, store = proxied
    proxy.fail(SLOW_DOWN, 2, {"PUT"})
    proxy.fail(INTERNAL, 1, {"GET"})
    store.put("part.jsonl", b"line\n")
    assert store.get("part.jsonl") == b"line\n"
    assert [method for method, _ in proxy.requests] == ["PUT", "PUT", "PUT", "GET", "GET"]


def test_a_store_that_keeps_failing_is_named_after_the_retries(proxied):
    proxy, store = proxied
    proxy.fail(SLOW_DOWN, RETRY_ATTEMPTS, {"PUT"})
    with pytest.raises(StoreError) as failing:
        store.put("part.jsonl", b"line\n")
    assert type(failing.value) is StoreError
    text = str(failing.value)
    assert f"the store answered SlowDown (HTTP 503) after {RETRY_ATTEMPTS} tries" in text
    assert "part.jsonl]" in text and "resumes from what was committed" in text
    assert len(proxy.requests) == RETRY_ATTEMPTS
    store.put("part.jsonl", b"line\n")  # the store answers again: nothing is left broken
