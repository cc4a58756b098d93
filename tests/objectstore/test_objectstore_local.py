"""Local-store specifics: atomic writes leave no temp files, and file/folder clashes are clear."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rollout.shared.objectstore import LocalObjectStore, ObjectStoreError


async def chunks(n: int) -> AsyncIterator[bytes]:
    for _ in range(n):
        yield b"y" * 1000


async def test_writes_leave_no_temp_files(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "root")
    await store.put("a.bin", b"x")
    await store.put("b.bin", chunks(5))
    source = tmp_path / "src.bin"
    source.write_bytes(b"z" * 10)
    await store.put("c.bin", source)

    assert os.listdir(tmp_path / "root" / ".rollout-tmp") == []
    assert await store.list() == ["a.bin", "b.bin", "c.bin"]
    assert source.read_bytes() == b"z" * 10  # a given file is copied, never moved


async def test_object_and_folder_with_one_name_is_a_clear_error(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    await store.put("a/b", b"1")
    with pytest.raises(ObjectStoreError, match="cannot be both an object and a folder"):
        await store.put("a", b"2")
    with pytest.raises(ObjectStoreError, match="cannot be both an object and a folder"):
        await store.put("a/b/c", b"3")
    assert await store.list() == ["a/b"]


async def test_unwritable_root_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    store = LocalObjectStore(blocker / "objects")
    with pytest.raises(ObjectStoreError, match="cannot (write|spool a streamed put) under"):
        await store.put("k", b"x")
