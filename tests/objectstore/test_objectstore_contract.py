"""The one object store contract, run against local FS, S3 (moto server) and GCS (emulator)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from objectstore_backends import Backend
from pydantic import BaseModel

from rollout.errors import RolloutError
from rollout.shared.objectstore import (
    Inline,
    InvalidObjectKey,
    ObjectConflict,
    ObjectCorrupted,
    ObjectNotFound,
    ObjectRef,
    ObjectStoreError,
    get_json,
    load_claim,
    put_json,
    store_if_large,
)

# Past S3's 8 MiB multipart threshold and GCS's 5 MiB simple-upload limit, so both
# backends take their streaming (multipart / resumable) paths.
LARGE_SIZE = 9 * 1024 * 1024 + 123


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def chunks_of(data: bytes, size: int) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


async def test_bytes_round_trip(backend: Backend) -> None:
    store = backend.store
    data = b"hello, claim check \x00\xff"
    ref = await store.put("runs/r1/batch-0.bin", data)

    assert ref == ObjectRef(
        uri=store.uri_for("runs/r1/batch-0.bin"), sha256=sha(data), size=len(data)
    )
    assert ref.uri.startswith(f"{store.scheme}://")
    assert await store.get(ref) == data
    assert await store.get("runs/r1/batch-0.bin") == data
    assert await store.get(ref.uri, sha256=ref.sha256) == data
    # The ref survives a JSON round trip, as it does inside an event.
    assert await store.get(ObjectRef.model_validate_json(ref.model_dump_json())) == data


async def test_empty_object_round_trip(backend: Backend) -> None:
    ref = await backend.store.put("empty", b"")
    assert ref.size == 0 and ref.sha256 == sha(b"")
    assert await backend.store.get(ref) == b""


async def test_large_file_streams_both_ways(backend: Backend, tmp_path: Path) -> None:
    store = backend.store
    data = os.urandom(LARGE_SIZE)
    source = tmp_path / "checkpoint.bin"
    source.write_bytes(data)

    ref = await store.put("ckpt/v1/model.bin", source)
    assert (ref.sha256, ref.size) == (sha(data), LARGE_SIZE)
    assert await store.put("ckpt/v1/model.bin", source) == ref  # re-put: a no-op

    target = tmp_path / "out" / "model.bin"
    downloaded = await store.download_to(ref, target)
    assert downloaded == ref
    assert target.read_bytes() == data

    received = bytearray()
    async for chunk in store.stream(ref, chunk_size=256 * 1024):
        assert len(chunk) <= 256 * 1024
        received += chunk
    assert bytes(received) == data


async def test_async_iterator_put_matches_bytes_put(backend: Backend) -> None:
    store = backend.store
    data = os.urandom(3 * 1024 * 1024 + 7)
    streamed = await store.put("streamed.bin", chunks_of(data, 64 * 1024))
    assert (streamed.sha256, streamed.size) == (sha(data), len(data))
    assert await store.get(streamed) == data
    # Same content under a second key: same checksum, different URI.
    direct = await store.put("direct.bin", data)
    assert direct.sha256 == streamed.sha256 and direct.uri != streamed.uri


async def test_failed_stream_stores_nothing(backend: Backend) -> None:
    async def broken_source() -> AsyncIterator[bytes]:
        yield b"x" * 1000
        raise RuntimeError("source went away")

    with pytest.raises(RuntimeError, match="source went away"):
        await backend.store.put("half.bin", broken_source())
    assert not await backend.store.exists("half.bin")
    assert await backend.store.list() == []


async def test_corrupted_blob_is_refused(backend: Backend, tmp_path: Path) -> None:
    store = backend.store
    data = b"A" * 4096
    ref = await store.put("traj/batch.json", data)
    await backend.write_raw("traj/batch.json", b"B" * 4096)

    with pytest.raises(ObjectCorrupted) as caught:
        await store.get(ref)
    assert ref.uri in str(caught.value) and ref.sha256 in str(caught.value)
    with pytest.raises(ObjectCorrupted):
        await store.get(ref.uri, sha256=ref.sha256)
    with pytest.raises(ObjectCorrupted):
        async for _ in store.stream(ref):
            pass
    target = tmp_path / "downloads" / "batch.json"
    with pytest.raises(ObjectCorrupted):
        await store.download_to(ref, target)
    # Neither the target nor the partial download is left behind.
    assert os.listdir(target.parent) == []
    # Without an expected checksum there is nothing to verify against: the bytes come back.
    assert await store.get("traj/batch.json") == b"B" * 4096


async def test_wrong_or_malformed_expected_sha_is_refused(backend: Backend) -> None:
    store = backend.store
    await store.put("k", b"data")
    with pytest.raises(ObjectCorrupted):
        await store.get("k", sha256="0" * 64)
    with pytest.raises(ObjectStoreError, match="64 hexadecimal"):
        await store.get("k", sha256="not-a-sha")
    # Upper-case hex is the same checksum.
    assert await store.get("k", sha256=sha(b"data").upper()) == b"data"


async def test_exists_and_delete(backend: Backend) -> None:
    store = backend.store
    ref = await store.put("a/b/c.bin", b"x")
    assert await store.exists("a/b/c.bin")
    assert await store.exists(ref)
    assert not await store.exists("a/b")  # a prefix is not an object

    assert await store.delete(ref) is True
    assert not await store.exists("a/b/c.bin")
    assert await store.delete("a/b/c.bin") is False  # deleting twice is not an error
    assert await store.list() == []
    # The key is free again, even as a "folder" name on the local filesystem.
    await store.put("a/b", b"now a file")
    assert await store.get("a/b") == b"now a file"


async def test_list_with_prefix(backend: Backend) -> None:
    store = backend.store
    keys = ["runs/r1/a", "runs/r1/b", "runs/r2/a", "runsx", "other/x"]
    for key in keys:
        await store.put(key, key.encode())

    assert await store.list() == sorted(keys)
    assert await store.list("runs/") == ["runs/r1/a", "runs/r1/b", "runs/r2/a"]
    assert await store.list("runs/r1") == ["runs/r1/a", "runs/r1/b"]
    assert await store.list("runs") == ["runs/r1/a", "runs/r1/b", "runs/r2/a", "runsx"]
    assert await store.list("runs/r3/") == []
    assert await store.list("nothing") == []
    with pytest.raises(InvalidObjectKey):
        await store.list("../")


async def test_missing_key_is_a_clear_error(backend: Backend, tmp_path: Path) -> None:
    store = backend.store
    uri = store.uri_for("no/such/key")
    with pytest.raises(ObjectNotFound) as caught:
        await store.get("no/such/key")
    assert isinstance(caught.value, RolloutError)
    assert str(caught.value) == f"no object at {uri}"
    with pytest.raises(ObjectNotFound):
        async for _ in store.stream(uri):
            pass
    with pytest.raises(ObjectNotFound):
        await store.download_to("no/such/key", tmp_path / "x")
    assert not (tmp_path / "x").exists()
    assert not await store.exists("no/such/key")


BAD_KEYS = [
    ("", "must not be empty"),
    ("../escape", "path traversal"),
    ("a/../../escape", "path traversal"),
    ("./a", "path traversal"),
    ("/etc/passwd", "must be relative"),
    ("a\x00b", "null byte"),
    ("a\nb", "control character"),
    ("a//b", "empty path segment"),
    ("a/", "empty path segment"),
    ("a\\b", "separator"),
    ("x" * 256, "longer than 255"),
    ("/".join(["y" * 200] * 6), "max 1024"),
    ("s3://bucket/key", "looks like a URI"),
    (".rollout-tmp/x", "reserved"),
]


@pytest.mark.parametrize(("key", "problem"), BAD_KEYS, ids=[repr(k)[:20] for k, _ in BAD_KEYS])
async def test_bad_keys_are_rejected(backend: Backend, key: str, problem: str) -> None:
    store = backend.store
    with pytest.raises(InvalidObjectKey) as caught:
        await store.put(key, b"data")
    assert problem in str(caught.value)
    for call in (store.get, store.exists, store.delete):
        with pytest.raises(InvalidObjectKey):
            await call(key)
    assert await store.list() == []


async def test_non_string_key_and_bad_data_are_rejected(backend: Backend) -> None:
    with pytest.raises(InvalidObjectKey, match="must be a string"):
        await backend.store.put(42, b"x")  # type: ignore[arg-type]
    with pytest.raises(ObjectStoreError, match="bytes, a pathlib.Path"):
        await backend.store.put("k", "text is ambiguous")  # type: ignore[arg-type]


async def test_uri_of_another_store_is_rejected(backend: Backend) -> None:
    store = backend.store
    for uri in ("s3://elsewhere/k", "gs://elsewhere/k", "file:///elsewhere/k"):
        with pytest.raises(InvalidObjectKey, match="not in this store"):
            await store.get(uri)


async def test_reput_same_content_is_idempotent(backend: Backend) -> None:
    store = backend.store
    first = await store.put("batch/1.json", b'{"n":1}')
    again = await store.put("batch/1.json", b'{"n":1}')
    assert again == first
    assert await store.list("batch/") == ["batch/1.json"]


async def test_reput_different_content_conflicts_unless_overwrite(backend: Backend) -> None:
    store = backend.store
    await store.put("batch/1.json", b'{"n":1}')
    with pytest.raises(ObjectConflict, match="already exists with different content"):
        await store.put("batch/1.json", b'{"n":2}')
    with pytest.raises(ObjectConflict):
        await store.put("batch/1.json", b'{"n":1} ')  # same length family, different bytes
    assert await store.get("batch/1.json") == b'{"n":1}'

    replaced = await store.put("batch/1.json", b'{"n":2}', overwrite=True)
    assert await store.get(replaced) == b'{"n":2}'


async def test_reput_after_out_of_band_write_compares_content(backend: Backend) -> None:
    store = backend.store
    # Written by another tool (no sha256 metadata): the store hashes what is there.
    await backend.write_raw("foreign.bin", b"same bytes")
    ref = await store.put("foreign.bin", b"same bytes")
    assert ref.sha256 == sha(b"same bytes")
    with pytest.raises(ObjectConflict):
        await store.put("foreign.bin", b"other byte")


class Step(BaseModel):
    tool: str
    output: str


async def test_claim_check_helpers(backend: Backend) -> None:
    store = backend.store
    batch = [Step(tool="search", output="x" * 100) for _ in range(50)]

    ref = await put_json(store, "batches/b1.json", batch)
    assert await get_json(store, ref) == [{"output": "x" * 100, "tool": "search"}] * 50
    assert await get_json(store, ref, model=list[Step]) == batch

    small = await store_if_large(store, batch[:1], threshold=1024)
    assert isinstance(small, Inline)
    assert await load_claim(store, small, model=list[Step]) == batch[:1]

    large = await store_if_large(store, batch, threshold=1024)
    assert isinstance(large, ObjectRef)
    # Content-addressed: the same batch stored again is the same object.
    assert await store_if_large(store, batch, threshold=1024) == large
    assert large.uri.endswith(f"{large.sha256}.json")
    assert await load_claim(store, large, model=list[Step]) == batch
    with pytest.raises(ObjectStoreError, match="does not hold the expected JSON"):
        await get_json(store, ref, model=list[int])
