"""Where a run's prompts and outputs live: a local folder (the default) or a prefix of an object store.

``prompts_path`` and ``output_root`` are read here and nowhere else: a local path, a ``file://`` URL or an
``s3://bucket/prefix`` URL. docs/object-storage.md §1 lists what each form means.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from fleetgen.errors import ConfigError

# The Airflow connection an object store is reached through: the DAG parameter that names it and its default.
STORAGE_CONN_PARAMETER = "storage_conn_id"
DEFAULT_STORAGE_CONN_ID = "aws_default"
# The deployment's connection to its object store: the DAG parameter's default and the one the results view uses.
STORAGE_CONN_VARIABLE = "FLEETGEN_STORAGE_CONN_ID"


def default_storage_conn_id() -> str:
    return os.environ.get(STORAGE_CONN_VARIABLE) or DEFAULT_STORAGE_CONN_ID
# Schemes the object seam (storage/objects.py) serves; gs:// and abfs:// are named so that their refusal says why.
OBJECT_SCHEMES = ("s3",)
PLANNED_SCHEMES = ("gs", "gcs", "abfs", "abfss", "az")


@dataclass(frozen=True)
class ObjectLocation:
    """``s3://<bucket>/<key>``: ``key`` has no leading or trailing ``/`` (empty for the bucket's root)."""

    scheme: str
    bucket: str
    key: str = ""

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.key}" if self.key else f"{self.scheme}://{self.bucket}"

    def child(self, *names: str) -> "ObjectLocation":
        """The location ``names`` below this one (each a plain name or a relative ``a/b`` path)."""
        parts = [self.key] if self.key else []
        for name in names:
            parts.extend(part for part in name.split("/") if part)
        return ObjectLocation(self.scheme, self.bucket, "/".join(parts))

    def key_of(self, *names: str) -> str:
        return self.child(*names).key

    def __str__(self) -> str:
        return self.url


Location = Path | ObjectLocation


def parse_location(text: str, *, parameter: str) -> Location:
    """``text`` as a location; ``parameter`` (the DAG parameter it came from) is named when it is refused."""
    value = str(text).strip()
    if not value:
        raise ConfigError(f"{parameter} is empty", hint=f"set the DAG parameter {parameter} to a local folder or an "
                                                        "s3://bucket/prefix URL")
    scheme = urlsplit(value).scheme.lower()
    if len(scheme) <= 1:  # no scheme, or a Windows drive letter
        return Path(value).expanduser()
    if scheme == "file":
        split = urlsplit(value)
        if split.netloc not in ("", "localhost"):
            raise ConfigError(f"{parameter}={value!r}: a file:// URL names a path on this machine, not on "
                              f"{split.netloc!r}", hint=f"write the DAG parameter {parameter} as file:///path")
        return Path(unquote(split.path))
    if scheme in OBJECT_SCHEMES:
        return _object_location(value, scheme, parameter)
    if scheme in PLANNED_SCHEMES:
        raise ConfigError(f"{parameter}={value!r}: {scheme}:// is not served yet; object storage is s3:// "
                          "(any S3-compatible store, through an Airflow aws connection with endpoint_url)",
                          hint=f"set the DAG parameter {parameter} to an s3:// URL or a local folder "
                               "(docs/object-storage.md §1)")
    raise ConfigError(f"{parameter}={value!r}: unknown scheme {scheme}://",
                      hint=f"set the DAG parameter {parameter} to a local folder, a file:// URL or an s3:// URL")


def _object_location(value: str, scheme: str, parameter: str) -> ObjectLocation:
    split = urlsplit(value)
    bucket = split.netloc
    if not bucket or "@" in bucket or ":" in bucket:
        raise ConfigError(f"{parameter}={value!r}: no bucket (or credentials in the URL)",
                          hint=f"write the DAG parameter {parameter} as {scheme}://bucket/prefix; credentials belong "
                               f"in the Airflow connection named by {STORAGE_CONN_PARAMETER}")
    if split.query or split.fragment:
        raise ConfigError(f"{parameter}={value!r}: an object URL takes no ?query or #fragment",
                          hint=f"write the DAG parameter {parameter} as {scheme}://bucket/prefix")
    key = unquote(split.path).strip("/")
    if key and posixpath.normpath("/" + key) != "/" + key:
        raise ConfigError(f"{parameter}={value!r}: the prefix holds '.', '..' or an empty segment",
                          hint=f"write the DAG parameter {parameter} as a plain {scheme}://bucket/prefix")
    return ObjectLocation(scheme, bucket, key)


def is_object_location(location: Location) -> bool:
    return isinstance(location, ObjectLocation)
