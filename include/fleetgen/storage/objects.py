"""The one seam to an object store: every object of a run that lives on S3 is read, written, listed and deleted here.

A ``ObjectStore`` is one prefix of one bucket, reached through an Airflow ``aws`` connection (the Amazon
provider's hook builds the client: credentials, region and ``endpoint_url`` for any S3-compatible store). Besides
plain reads and writes it offers what exactly-once output rests on (docs/object-storage.md §2): a write that only
creates (``If-None-Match: *``), a write that only replaces the version read (``If-Match: <ETag>``), and range reads.

Faults come out as fleetgen's own errors (``fleetgen.errors.StoreError`` and below), each naming the object's URL,
the connection id and the DAG parameter to change. Throttling (503 SlowDown), 500s and dropped connections are
retried by botocore's standard retry mode (``RETRY_ATTEMPTS`` tries with backoff) before they surface. The
connection's credentials never reach a message: only its id does.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from fleetgen.errors import (ObjectMissing, StoreBucketMissing, StoreConflict, StoreDenied, StoreError,
                             StoreUnreachable)
from fleetgen.storage.location import STORAGE_CONN_PARAMETER, ObjectLocation

RETRY_ATTEMPTS = 5
CONNECT_TIMEOUT_S = 10
READ_TIMEOUT_S = 60
# Connections kept open to the store: enough for the readers that fetch parts side by side (commit_log.py).
MAX_CONNECTIONS = 32
_DENIED = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken",
           "AllAccessDisabled"}
_CONFLICT = {"PreconditionFailed", "ConditionalRequestConflict"}


@dataclass(frozen=True)
class ObjectInfo:
    name: str  # relative to the store's prefix
    size: int
    etag: str
    modified: float = 0.0  # Last-Modified, seconds since the epoch by the store's clock (whole seconds on S3)


class ObjectStore:
    """``location``'s prefix of its bucket; names are relative to it (``a/b.json``)."""

    def __init__(self, client, location: ObjectLocation, *, conn_id: str, parameter: str) -> None:
        self._client = client
        self.location = location
        self.conn_id = conn_id
        self.parameter = parameter

    @classmethod
    def connect(cls, location: ObjectLocation, *, conn_id: str, parameter: str) -> "ObjectStore":
        """A store reached through the Airflow connection ``conn_id`` (``parameter``: the DAG parameter that named
        ``location``, for the errors)."""
        from airflow.providers.amazon.aws.hooks.s3 import S3Hook
        from botocore.config import Config

        config = Config(retries={"mode": "standard", "total_max_attempts": RETRY_ATTEMPTS},
                        connect_timeout=CONNECT_TIMEOUT_S, read_timeout=READ_TIMEOUT_S,
                        max_pool_connections=MAX_CONNECTIONS)
        store = cls(None, location, conn_id=conn_id, parameter=parameter)
        with store._faults("connect to", location.url):
            store._client = S3Hook(aws_conn_id=conn_id, config=config).get_conn()
        return store

    def below(self, *names: str) -> "ObjectStore":
        """The same store, ``names`` further down (one client for both)."""
        return ObjectStore(self._client, self.location.child(*names), conn_id=self.conn_id, parameter=self.parameter)

    def url(self, name: str = "") -> str:
        return self.location.child(name).url

    def _key(self, name: str) -> str:
        return self.location.key_of(name)

    def get(self, name: str, *, start: int | None = None, end: int | None = None) -> bytes:
        """The object's bytes, or bytes ``start`` up to (not including) ``end`` of it."""
        if end is not None and end <= (start or 0):
            return b""
        arguments = self._read_arguments(name, start, end)
        with self._faults("read", self.url(name)):
            return self._client.get_object(**arguments)["Body"].read()

    def download(self, name: str, handle, *, start: int | None = None, end: int | None = None,
                 chunk: int = 1 << 20) -> ObjectInfo:
        """Copy the object (or bytes ``start`` up to ``end``) into the open binary ``handle`` a chunk at a time, not
        holding it in memory; returns what the answer said of the whole object (its size from Content-Range)."""
        with self._faults("read", self.url(name)):
            answer = self._client.get_object(**self._read_arguments(name, start, end))
            for data in answer["Body"].iter_chunks(chunk):
                handle.write(data)
        total = answer.get("ContentRange", "").rpartition("/")[2]
        size = int(total) if total.isdigit() else int(answer["ContentLength"])
        return ObjectInfo(name, size, answer["ETag"], answer["LastModified"].timestamp())

    def _read_arguments(self, name: str, start: int | None, end: int | None) -> dict:
        """A GET of the object, or of bytes ``start`` up to (not including) ``end`` of it (an HTTP Range)."""
        arguments = {"Bucket": self.location.bucket, "Key": self._key(name)}
        if start is not None or end is not None:
            arguments["Range"] = f"bytes={start or 0}-{'' if end is None else end - 1}"
        return arguments

    def get_with_info(self, name: str) -> tuple[bytes, ObjectInfo]:
        """The object's bytes and what the same answer said of it (one request)."""
        with self._faults("read", self.url(name)):
            answer = self._client.get_object(Bucket=self.location.bucket, Key=self._key(name))
            data = answer["Body"].read()
        return data, ObjectInfo(name, len(data), answer["ETag"], answer["LastModified"].timestamp())

    def head(self, name: str) -> ObjectInfo | None:
        """Size, ETag and time, or None when there is no such object."""
        try:
            with self._faults("look up", self.url(name)):
                answer = self._client.head_object(Bucket=self.location.bucket, Key=self._key(name))
        except ObjectMissing:
            return None
        return ObjectInfo(name, int(answer["ContentLength"]), answer["ETag"], answer["LastModified"].timestamp())

    def put(self, name: str, data: bytes, *, if_absent: bool = False, if_match: str | None = None) -> str:
        """Write the whole object at once; returns its ETag. ``if_absent``: only if there is none yet;
        ``if_match``: only if the object is still the version with that ETag. A lost precondition raises
        ``StoreConflict``."""
        arguments = {"Bucket": self.location.bucket, "Key": self._key(name), "Body": data}
        if if_absent:
            arguments["IfNoneMatch"] = "*"
        if if_match is not None:
            arguments["IfMatch"] = if_match
        with self._faults("write", self.url(name)):
            return self._client.put_object(**arguments)["ETag"]

    def upload(self, name: str, path) -> str:
        """Write the local file ``path`` as the whole object, streamed from disk; returns its ETag."""
        with open(path, "rb") as handle, self._faults("write", self.url(name)):
            return self._client.put_object(Bucket=self.location.bucket, Key=self._key(name), Body=handle)["ETag"]

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object whose name starts with ``prefix``, in name order."""
        return list(self.iter_objects(prefix))

    def iter_objects(self, prefix: str = "") -> Iterator[ObjectInfo]:
        base = self._base()
        for page in self._pages(prefix):
            for entry in page.get("Contents", []):
                yield ObjectInfo(entry["Key"][len(base):], int(entry["Size"]), entry["ETag"],
                                 entry["LastModified"].timestamp())

    def folders(self, prefix: str = "") -> Iterator[str]:
        """The names of the "folders" right below ``prefix`` (``prefix`` empty or ending with ``/``): the common
        prefixes of the keys up to their next ``/``, without it, in name order."""
        start = len(self._base()) + len(prefix)
        for page in self._pages(prefix, Delimiter="/"):
            for entry in page.get("CommonPrefixes", []):
                yield entry["Prefix"][start:].rstrip("/")

    def _base(self) -> str:
        return self.location.key + "/" if self.location.key else ""

    def _pages(self, prefix: str, **options) -> Iterator[dict]:
        """Every page of a listing of ``prefix`` (past S3's 1,000 keys a page)."""
        arguments = {"Bucket": self.location.bucket, "Prefix": self._base() + prefix, **options}
        while True:
            with self._faults("list", self.url(prefix)):
                page = self._client.list_objects_v2(**arguments)
            yield page
            if not page.get("IsTruncated"):
                return
            arguments["ContinuationToken"] = page["NextContinuationToken"]

    def delete(self, name: str) -> None:
        with self._faults("delete", self.url(name)):
            self._client.delete_object(Bucket=self.location.bucket, Key=self._key(name))

    def _faults(self, action: str, url: str) -> "_StoreFaults":
        return _StoreFaults(self, action, url)


class _StoreFaults:
    """Translates what botocore raises into the store errors above, naming ``url`` and the connection."""

    def __init__(self, store: ObjectStore, action: str, url: str) -> None:
        self.store = store
        self.action = action
        self.url = url

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, error, traceback) -> bool:
        if error is None or isinstance(error, StoreError):
            return False
        translated = self.translate(error)
        if translated is None:
            return False
        raise translated from error

    def translate(self, error: BaseException) -> StoreError | None:
        from botocore import exceptions as boto

        store = self.store
        where = {"path": self.url, "conn_id": store.conn_id}
        connection = f"the Airflow connection {store.conn_id!r}"
        change = (f"the DAG parameter {store.parameter} (the URL) or {STORAGE_CONN_PARAMETER} (the connection, "
                  f"now {store.conn_id!r})")
        if isinstance(error, boto.ClientError):
            answer = error.response.get("Error", {})
            code = str(answer.get("Code", ""))
            status = int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
            if code in _CONFLICT or status == 412:
                return StoreConflict(f"could not {self.action} the object: another writer changed it first ({code})",
                                     **where)
            if code == "NoSuchBucket":
                return StoreBucketMissing(f"the bucket {store.location.bucket!r} does not exist on the store of "
                                          f"{connection}", hint=f"create the bucket, or change {change}", **where)
            if code in ("NoSuchKey", "404", "NotFound") or status == 404:
                return ObjectMissing(f"no such object to {self.action}", **where)
            if code in _DENIED or status == 403:
                return StoreDenied(f"the store refused to {self.action} the object with the credentials of "
                                   f"{connection}: {code or status}",
                                   hint=f"check the login, password and rights of {connection}, or change {change}",
                                   **where)
            return StoreError(f"could not {self.action} the object: the store answered {code} "
                              f"(HTTP {status}) after {RETRY_ATTEMPTS} tries",
                              hint="the store is overloaded or failing (503 SlowDown, 500): the task's retry "
                                   "resumes from what was committed; if it persists, check the store's health",
                              **where)
        if isinstance(error, (boto.EndpointConnectionError, boto.ConnectTimeoutError, boto.ReadTimeoutError,
                              boto.ConnectionClosedError)):
            return StoreUnreachable(f"could not {self.action} the object: the store does not answer ({error})",
                                    hint=f"check that the store's endpoint (the endpoint_url in the extra of "
                                         f"{connection}) is up and reachable from this worker, or change {change}",
                                    **where)
        if isinstance(error, (boto.NoCredentialsError, boto.PartialCredentialsError)):
            return StoreDenied(f"could not {self.action} the object: {connection} gives no credentials",
                               hint=f"set the login and password of {connection} (or the worker's AWS role), or "
                                    f"change {change}", **where)
        if isinstance(error, boto.BotoCoreError):
            return StoreError(f"could not {self.action} the object: {error}", hint=f"check {change}", **where)
        return None
