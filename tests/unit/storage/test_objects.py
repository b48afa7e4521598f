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
    assert (unreachable.value.path, unreachable.value.conn_id) == (store.url(""), "fleetgen_nowhere")
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


def test_a_store_below_another_shares_its_client_connection_and_parameter(object_store):
    below = object_store.below("run_1", "shards")
    assert below.url() == object_store.url("run_1/shards") and below._client is object_store._client
    assert (below.conn_id, below.parameter) == (object_store.conn_id, object_store.parameter)
    assert object_store.url() == object_store.location.url


def test_the_client_retries_and_times_out_as_declared(object_store):
    from fleetgen.storage import objects

    config = object_store._client.meta.config
    assert config.retries == {"mode": "standard", "total_max_attempts": objects.RETRY_ATTEMPTS}
    assert (config.connect_timeout, config.read_timeout, config.max_pool_connections) == (
        objects.CONNECT_TIMEOUT_S, objects.READ_TIMEOUT_S, objects.MAX_CONNECTIONS)


def test_what_the_store_says_of_an_object_comes_back_with_it(object_store):
    import time

    etag = object_store.put("dir/a.json", b"12345")
    data, info = object_store.get_with_info("dir/a.json")
    head = object_store.head("dir/a.json")
    [listed] = object_store.list()
    assert list(object_store.iter_objects()) == [listed]
    assert data == b"12345"
    for found in (info, head, listed):
        assert (found.name, found.size, found.etag) == ("dir/a.json", 5, etag)
        assert abs(found.modified - time.time()) < 60


def test_a_store_at_the_root_of_its_bucket_lists_names_from_the_root(seaweedfs, object_store):
    root = connect(f"s3://{seaweedfs.bucket}")
    prefix = object_store.location.key
    object_store.put("x.json", b"{}")
    assert [info.name for info in root.list(prefix + "/")] == [f"{prefix}/x.json"]


@pytest.mark.parametrize("action, call", [
    ("read", lambda store: store.get("x.json")), ("read", lambda store: store.get_with_info("x.json")),
    ("look up", lambda store: store.head("x.json")), ("write", lambda store: store.put("x.json", b"{}")),
    ("list", lambda store: store.list("x")), ("delete", lambda store: store.delete("x.json"))])
def test_every_request_refused_names_what_it_was_doing_and_where(seaweedfs, store_prefix, monkeypatch, action, call):
    connection = seaweedfs.connection()
    connection["password"] = "a-wrong-secret-value"
    monkeypatch.setenv("AIRFLOW_CONN_FLEETGEN_WRONG_KEY", __import__("json").dumps(connection))
    store = connect(store_prefix, conn_id="fleetgen_wrong_key")
    with pytest.raises(StoreDenied) as denied:
        call(store)
    error = denied.value
    expected_url = store.url("x") if action == "list" else store.url("x.json")
    assert (error.path, error.conn_id) == (expected_url, "fleetgen_wrong_key")
    assert error.message.startswith(f"the store refused to {action} the object with the credentials of the Airflow "
                                    "connection 'fleetgen_wrong_key': ")
    assert error.hint == ("check the login, password and rights of the Airflow connection 'fleetgen_wrong_key', or "
                          "change the DAG parameter output_root (the URL) or storage_conn_id (the connection, now "
                          "'fleetgen_wrong_key')")


def test_a_connection_without_credentials_is_named(seaweedfs, store_prefix, monkeypatch):
    connection = seaweedfs.connection()
    connection.pop("login"), connection.pop("password")
    monkeypatch.setenv("AIRFLOW_CONN_FLEETGEN_NO_KEY", __import__("json").dumps(connection))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    store = connect(store_prefix, conn_id="fleetgen_no_key")
    with pytest.raises(StoreDenied) as denied:
        store.get("x.json")
    assert denied.value.message == "could not read the object: the Airflow connection 'fleetgen_no_key' gives no credentials"
    assert denied.value.path == store.url("x.json")
    assert denied.value.hint.startswith("set the login and password of the Airflow connection 'fleetgen_no_key' (or the "
                                        "worker's AWS role), or change the DAG parameter output_root")


def test_a_bucket_name_the_client_refuses_is_named(seaweedfs):
    store = connect("s3://bad%7Cbucket/x")
    with pytest.raises(StoreError) as refused:
        store.get("y.json")
    assert type(refused.value) is StoreError and refused.value.path == "s3://bad%7Cbucket/x/y.json"
    assert refused.value.message.startswith("could not read the object: Parameter validation failed")
    assert refused.value.hint == ("check the DAG parameter output_root (the URL) or storage_conn_id (the connection, "
                                  "now 'fleetgen_test_store')")


def test_an_error_that_is_not_the_stores_passes_through_unchanged(object_store, monkeypatch):
    def broken(**kwargs):
        raise ValueError("not a store error")

    monkeypatch.setattr(object_store._client, "get_object", broken)
    with pytest.raises(ValueError, match="not a store error"):
        object_store.get("x.json")


ANSWERS = {
    "skewed": (403, b'<?xml version="1.0"?><Error><Code>RequestTimeTooSkewed</Code><Message>skew</Message></Error>'),
    "conflict": (409, b'<?xml version="1.0"?><Error><Code>ConditionalRequestConflict</Code><Message>x</Message>'
                      b'</Error>'),
    "precondition": (412, b'<?xml version="1.0"?><Error><Code>Odd</Code><Message>x</Message></Error>'),
    "gone": (404, b'<?xml version="1.0"?><Error><Code>Gone</Code><Message>x</Message></Error>'),
}


def test_answers_are_sorted_by_their_status_when_their_code_is_unknown(proxied):
    proxy, store = proxied
    proxy.fail(ANSWERS["skewed"], 1, {"GET"})
    with pytest.raises(StoreDenied) as denied:
        store.get("x.json")
    assert denied.value.message.endswith("'fleetgen_proxied': RequestTimeTooSkewed")
    proxy.fail(ANSWERS["conflict"], 1, {"PUT"})
    with pytest.raises(StoreConflict):
        store.put("x.json", b"{}", if_absent=True)
    proxy.fail(ANSWERS["precondition"], 1, {"PUT"})
    with pytest.raises(StoreConflict, match=r"another writer changed it first \(Odd\)"):
        store.put("x.json", b"{}", if_absent=True)
    proxy.fail(ANSWERS["gone"], 1, {"GET"})
    with pytest.raises(ObjectMissing):
        store.get("x.json")


def test_a_failing_store_names_the_answer_and_what_a_retry_does(proxied):
    proxy, store = proxied
    proxy.fail(INTERNAL, RETRY_ATTEMPTS, {"GET"})
    with pytest.raises(StoreError) as failing:
        store.get("x.json")
    assert failing.value.message == (f"could not read the object: the store answered InternalError (HTTP 500) after "
                                     f"{RETRY_ATTEMPTS} tries")
    assert failing.value.hint == ("the store is overloaded or failing (503 SlowDown, 500): the task's retry resumes "
                                  "from what was committed; if it persists, check the store's health")
    assert failing.value.path == store.url("x.json")


def test_folders_are_the_names_right_below_a_prefix_past_one_page(object_store, monkeypatch):
    for name in ("run-a/x.json", "run-a/deep/y.json", "run-b/z.json", "top.json", "run-c/shards/s/1.json"):
        object_store.put(name, b"{}")
    assert list(object_store.folders()) == ["run-a", "run-b", "run-c"]
    assert list(object_store.folders("run-a/")) == ["deep"]
    assert list(object_store.folders("nothing/")) == []
    client = object_store._client
    pages = []
    list_objects = client.list_objects_v2

    def one_at_a_time(**arguments):  # a store answering one common prefix a page
        pages.append(arguments.get("ContinuationToken"))
        return list_objects(**arguments, MaxKeys=1)

    monkeypatch.setattr(client, "list_objects_v2", one_at_a_time)
    assert list(object_store.folders()) == ["run-a", "run-b", "run-c"] and len(pages) >= 3


def test_a_download_streams_the_object_or_a_range_and_says_the_whole_objects_size(object_store, tmp_path):
    import io

    data = bytes(range(256)) * 40
    object_store.put("big.bin", data)
    whole, part = io.BytesIO(), io.BytesIO()
    info = object_store.download("big.bin", whole, chunk=1000)
    assert whole.getvalue() == data and (info.name, info.size) == ("big.bin", len(data))
    assert info.etag == object_store.head("big.bin").etag and info.modified > 0
    ranged = object_store.download("big.bin", part, start=100, end=3000, chunk=7)
    assert part.getvalue() == data[100:3000] and ranged.size == len(data)
    tail = io.BytesIO()
    assert object_store.download("big.bin", tail, start=10_000).size == len(data) and tail.getvalue() == data[10_000:]
    head = io.BytesIO()
    object_store.download("big.bin", head, end=5)
    assert head.getvalue() == data[:5]


def test_an_upload_writes_a_local_file_as_the_whole_object(object_store, tmp_path):
    path = tmp_path / "out.parquet"
    path.write_bytes(b"PAR1" * 1000)
    etag = object_store.upload("dataset/out.parquet", path)
    assert object_store.get("dataset/out.parquet") == b"PAR1" * 1000
    assert object_store.head("dataset/out.parquet").etag == etag
    path.write_bytes(b"again")
    object_store.upload("dataset/out.parquet", path)  # over what is there
    assert object_store.get("dataset/out.parquet") == b"again"


def test_a_missing_object_downloaded_is_named(object_store):
    import io

    with pytest.raises(ObjectMissing) as caught:
        object_store.download("nowhere.bin", io.BytesIO())
    assert caught.value.path == object_store.url("nowhere.bin")
