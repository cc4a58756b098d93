"""The embedded default: blobs as files under a root directory, written atomically (temp + rename)."""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import ClassVar
from urllib.parse import quote, unquote, urlsplit

from rollout.shared.objectstore.base import ObjectStore, StoredObject
from rollout.shared.objectstore.errors import InvalidObjectKey, ObjectNotFound, ObjectStoreError
from rollout.shared.objectstore.keys import RESERVED_SEGMENT


class LocalObjectStore(ObjectStore):
    """Objects are files under `root`; URIs are `file:///root/key`."""

    scheme: ClassVar[str] = "file"

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).expanduser().resolve()
        self._base_uri = self.root.as_uri().rstrip("/") + "/"

    def __repr__(self) -> str:
        return f"LocalObjectStore({str(self.root)!r})"

    @property
    def base_uri(self) -> str:
        """`file:///root/`."""
        return self._base_uri

    def uri_for(self, key: str) -> str:
        """`file:///root/<percent-encoded key>`."""
        return self._base_uri + quote(key, safe="/")

    def _key_from_uri(self, uri: str) -> str:
        parts = urlsplit(uri)
        if parts.scheme != "file" or parts.netloc not in ("", "localhost"):
            raise InvalidObjectKey(
                f"URI {uri!r} is not in this store",
                problems=[f"this store holds file:// URIs under {self._base_uri}"],
            )
        path = Path(unquote(parts.path))
        try:
            return path.relative_to(self.root).as_posix()
        except ValueError:
            raise InvalidObjectKey(
                f"URI {uri!r} is not in this store",
                problems=[f"this store holds URIs under {self._base_uri}"],
            ) from None

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*key.split("/"))

    def _spool_dir(self) -> Path:
        # Inside the root, so a spooled stream is committed by a rename on the same filesystem.
        return self.root / RESERVED_SEGMENT

    async def _write_bytes(self, key: str, data: bytes, sha256: str) -> None:
        await asyncio.to_thread(self._commit, key, data=data)

    async def _write_file(
        self, key: str, path: Path, sha256: str, size: int, *, owned: bool
    ) -> None:
        if owned:
            await asyncio.to_thread(self._commit, key, spooled=path)
        else:
            await asyncio.to_thread(self._commit, key, source=path)

    def _commit(
        self,
        key: str,
        *,
        data: bytes | None = None,
        spooled: Path | None = None,
        source: Path | None = None,
    ) -> None:
        """Write to a temp file in the root, fsync, then rename over the destination."""
        dest = self._path(key)
        tmp_dir = self._spool_dir()
        try:
            # The temp folder sits in the root: failing here means the root itself is unusable.
            tmp_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise self._unwritable(exc) from exc
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError) as exc:
            raise self._shape_conflict(key) from exc
        except OSError as exc:
            raise self._unwritable(exc) from exc
        tmp = spooled
        try:
            if tmp is None:
                fd, name = tempfile.mkstemp(prefix="put-", suffix=".part", dir=tmp_dir)
                tmp = Path(name)
                with os.fdopen(fd, "wb") as handle:
                    if data is not None:
                        handle.write(data)
                    else:
                        assert source is not None
                        with source.open("rb") as src:
                            shutil.copyfileobj(src, handle, 1024 * 1024)
                    handle.flush()
                    os.fsync(handle.fileno())
            try:
                os.replace(tmp, dest)
            except (IsADirectoryError, NotADirectoryError) as exc:
                raise self._shape_conflict(key) from exc
            _fsync_dir(dest.parent)
        finally:
            if tmp is not None and tmp != spooled:
                tmp.unlink(missing_ok=True)

    def _unwritable(self, exc: OSError) -> ObjectStoreError:
        return ObjectStoreError(
            f"cannot write under {self.root}: {exc.strerror or exc}",
            problems=["check that the object store root is a writable directory"],
        )

    def _shape_conflict(self, key: str) -> ObjectStoreError:
        """S3 lets `a` and `a/b` coexist; a filesystem cannot, so say so plainly."""
        return ObjectStoreError(
            f"cannot store {self.uri_for(key)}: a key cannot be both an object and a folder "
            "in the local object store",
            problems=[f"another object's key is a prefix of {key!r} (or the other way round)"],
        )

    async def _stat(self, key: str) -> StoredObject | None:
        try:
            st = await asyncio.to_thread(os.stat, self._path(key))
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        return StoredObject(size=st.st_size, sha256=None)

    async def _read_all(self, key: str) -> bytes:
        # One thread hop for a small blob (a trajectory), not four (open, read, EOF, close).
        try:
            return await asyncio.to_thread(self._path(key).read_bytes)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise ObjectNotFound(self.uri_for(key)) from None

    async def _read_chunks(self, key: str, chunk_size: int) -> AsyncIterator[bytes]:
        path = self._path(key)
        try:
            handle = await asyncio.to_thread(path.open, "rb")
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise ObjectNotFound(self.uri_for(key)) from None
        try:
            while chunk := await asyncio.to_thread(handle.read, chunk_size):
                yield chunk
        finally:
            await asyncio.to_thread(handle.close)

    async def _delete(self, key: str) -> bool:
        return await asyncio.to_thread(self._delete_sync, key)

    def _delete_sync(self, key: str) -> bool:
        path = self._path(key)
        try:
            path.unlink()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return False
        # Prune now-empty folders so a deleted `a/b` does not block a later object `a`.
        parent = path.parent
        while parent != self.root:
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent
        return True

    async def _list(self, prefix: str) -> list[str]:
        return await asyncio.to_thread(self._list_sync, prefix)

    def _list_sync(self, prefix: str) -> list[str]:
        # Walk only the folder the prefix points into, then filter by plain string prefix.
        folder = prefix.rpartition("/")[0]
        start = self._path(folder) if folder else self.root
        keys: list[str] = []
        for dirpath, dirnames, filenames in os.walk(start):
            here = Path(dirpath)
            if here == self.root and RESERVED_SEGMENT in dirnames:
                dirnames.remove(RESERVED_SEGMENT)
            rel = here.relative_to(self.root).as_posix()
            for name in filenames:
                key = name if rel == "." else f"{rel}/{name}"
                if key.startswith(prefix):
                    keys.append(key)
        return keys


def _fsync_dir(path: Path) -> None:
    """fsync a directory so a rename into it is durable (best effort: not every OS allows it)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
