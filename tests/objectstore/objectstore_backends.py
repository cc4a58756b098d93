"""Object store backends under test: a local root, moto's S3 server and the GCS emulator (real HTTP).

A uniquely named module (test folders have no __init__.py), re-exported by conftest.py.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import httpx
import pytest
from gcp_storage_emulator.server import create_server
from moto.server import ThreadedMotoServer

from rollout.shared.objectstore import LocalObjectStore, ObjectStore, open_store

S3_BUCKET = "rollout-test"
GCS_BUCKET = "rollout-test"
# moto accepts any credentials; explicit ones keep the tests off the developer's AWS config.
S3_CREDENTIALS = {"access_key_id": "testing", "secret_access_key": "testing", "region": "us-east-1"}
BACKENDS = ("local", "s3", "gcs")


@dataclass
class Backend:
    """A store under test plus a way to write its storage behind its back."""

    name: str
    store: ObjectStore
    # Writes raw bytes at a key without going through the store (for corruption tests).
    write_raw: Callable[[str, bytes], Awaitable[None]]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """moto in server mode on a free port: a real S3 HTTP API in a thread."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    client = _boto_client(endpoint)
    client.create_bucket(Bucket=S3_BUCKET)
    yield endpoint
    server.stop()


@pytest.fixture(scope="session")
def gcs_endpoint() -> Iterator[str]:
    """gcp-storage-emulator on a free port (in memory): a real GCS JSON API over HTTP."""
    port = _free_port()
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket=GCS_BUCKET)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


def _boto_client(endpoint: str) -> object:
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )


def s3_store(endpoint: str, prefix: str, bucket: str = S3_BUCKET) -> ObjectStore:
    """An S3 store on the moto server through the factory, as the services would open it."""
    return open_store(
        {"url": f"s3://{bucket}/{prefix}", "endpoint_url": endpoint, **S3_CREDENTIALS}
    )


def gcs_store(endpoint: str, prefix: str, bucket: str = GCS_BUCKET) -> ObjectStore:
    """A GCS store on the emulator through the factory."""
    return open_store(f"gs://{bucket}/{prefix}?emulator_host={endpoint}")


@pytest.fixture(params=BACKENDS)
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    """Each contract test runs once per backend, in its own root or prefix."""
    prefix = f"t-{uuid.uuid4().hex[:12]}"
    if request.param == "local":
        root = tmp_path / "objects"
        store: ObjectStore = LocalObjectStore(root)

        async def write_raw(key: str, data: bytes) -> None:
            (root / key).parent.mkdir(parents=True, exist_ok=True)
            (root / key).write_bytes(data)

    elif request.param == "s3":
        endpoint = request.getfixturevalue("moto_endpoint")
        store = s3_store(endpoint, prefix)
        raw = _boto_client(endpoint)

        async def write_raw(key: str, data: bytes) -> None:
            # A plain PutObject from another client: new bytes, no sha256 metadata.
            raw.put_object(Bucket=S3_BUCKET, Key=f"{prefix}/{key}", Body=data)  # type: ignore[attr-defined]

    else:
        endpoint = request.getfixturevalue("gcs_endpoint")
        store = gcs_store(endpoint, prefix)

        async def write_raw(key: str, data: bytes) -> None:
            async with httpx.AsyncClient(base_url=endpoint) as http:
                response = await http.post(
                    f"/upload/storage/v1/b/{GCS_BUCKET}/o",
                    params={"uploadType": "media", "name": f"{prefix}/{key}"},
                    content=data,
                    headers={"Content-Type": "application/octet-stream"},
                )
                response.raise_for_status()

    async with store:
        yield Backend(request.param, store, write_raw)
