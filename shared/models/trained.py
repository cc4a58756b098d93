"""Trained policies by name: `BASE:SUFFIX` (or the job id) -> the newest policy of that name.

The learner publishes every policy version as a record in the object store (claim check: the
record names the checkpoint's URI and sha256), `policies/<key>/latest.json` pointing at the
newest. Resolving a name reads that record, fetches the checkpoint into a local cache under
`ROLLOUT_HOME/models/trained/` when it is missing (verified by sha256), and loads it with the
`hf` backend. Records of provider fine-tunes (`openai/...`, `together/...`) resolve to the
provider's fine-tuned model instead.

`install()` makes the names resolvable through `rollout.shared.models.registry`: a resolver asked
before every form looks for a trained policy of that name (whatever its base's form, registered
before or after); job ids (`job-...`) get a form of their own.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import re
import shutil
import tarfile
import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict

from rollout.shared.errors import RolloutError
from rollout.shared.models.base import ModelBackend
from rollout.shared.models.hf import HFBackend
from rollout.shared.models.local_models import root_model
from rollout.shared.models.names import split_trained_name
from rollout.shared.models.openai_compat import openai_backend, together_backend
from rollout.shared.models.registry import register_backend, register_resolver
from rollout.shared.models.weights_proof import weights_digest
from rollout.shared.objectstore import ObjectNotFound, ObjectRef, ObjectStore, open_store
from rollout.shared.objectstore.factory import default_store_url
from rollout.shared.settings import default_home

T = TypeVar("T")

JOB_PREFIX = "job-"
POLICY_PREFIX = "policies"
CHECKPOINT_PREFIX = "checkpoints"
CACHE_FOLDER = Path("models") / "trained"
_UNSAFE = re.compile(r"[^A-Za-z0-9_\-]+")

Kind = Literal["hf", "openai", "together"]


class PolicyRecord(BaseModel):
    """One published policy version: what it is called and where its weights are."""

    model_config = ConfigDict(extra="ignore")

    model: str
    version: int
    kind: Kind = "hf"
    uri: str = ""
    sha256: str = ""
    size: int = 0
    job_id: str | None = None
    base_model: str = ""
    # For provider fine-tunes: the provider's name of the trained model.
    remote_model: str | None = None
    # The digest of the weights themselves (weights_proof.weights_digest); "" for records
    # published before it was kept, and for provider fine-tunes.
    weights_sha256: str = ""


# --- names ------------------------------------------------------------------------------------


def policy_key(model: str) -> str:
    """A subject-token and object-key safe id for a model name (readable part + hash)."""
    readable = _UNSAFE.sub("-", model).strip("-")[:80] or "model"
    digest = hashlib.sha256(model.encode()).hexdigest()[:12]
    return f"{readable}-{digest}"


def new_job_id() -> str:
    """A fresh training job id; it is also a model name of the job's policy."""
    return f"{JOB_PREFIX}{uuid.uuid4().hex[:16]}"


# --- records in the object store ---------------------------------------------------------------


def record_key(model: str, version: int | None = None) -> str:
    """Where a policy record lives (`latest.json` when no version is given)."""
    name = "latest.json" if version is None else f"v{version:08d}.json"
    return f"{POLICY_PREFIX}/{policy_key(model)}/{name}"


def job_record_key(job_id: str) -> str:
    """Where the policy a job produced is recorded."""
    return f"{POLICY_PREFIX}/jobs/{job_id}.json"


def _encode(record: PolicyRecord) -> bytes:
    return json.dumps(record.model_dump(mode="json"), sort_keys=True).encode()


async def publish_record(store: ObjectStore, record: PolicyRecord) -> ObjectRef:
    """Store a version's record and make it the latest of its name (and of its job)."""
    data = _encode(record)
    ref = await store.put(record_key(record.model, record.version), data, overwrite=True)
    latest = await read_record(store, record_key(record.model))
    if latest is None or latest.version <= record.version:
        await store.put(record_key(record.model), data, overwrite=True)
    if record.job_id:
        await store.put(job_record_key(record.job_id), data, overwrite=True)
    return ref


async def read_record(store: ObjectStore, key: str) -> PolicyRecord | None:
    """The record at `key`, or None when there is none."""
    try:
        data = await store.get(key)
    except ObjectNotFound:
        return None
    return PolicyRecord.model_validate_json(data)


async def latest_record(store: ObjectStore, model: str) -> PolicyRecord | None:
    """The newest published version of `model`, or None."""
    return await read_record(store, record_key(model))


async def job_record(store: ObjectStore, job_id: str) -> PolicyRecord | None:
    """The policy a job published, or None."""
    return await read_record(store, job_record_key(job_id))


# --- checkpoints as tar archives -----------------------------------------------------------------


def pack_dir(directory: Path, target: Path, *, arcname: str = ".") -> Path:
    """Write `directory` as an uncompressed tar at `target` (deterministic member order)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(target, "w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(directory.rglob("*")):
            if path.is_file():
                rel = path.relative_to(directory).as_posix()
                name = rel if arcname == "." else f"{arcname}/{rel}"
                info = tar.gettarinfo(str(path), arcname=name)
                info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
                with path.open("rb") as handle:
                    tar.addfile(info, handle)
    return target


def unpack(data: bytes | Path, directory: Path) -> Path:
    """Extract a tar archive into `directory` (no absolute paths, no links, no traversal)."""
    directory.mkdir(parents=True, exist_ok=True)
    source = (
        tarfile.open(data) if isinstance(data, Path) else tarfile.open(fileobj=io.BytesIO(data))
    )
    with source as tar:
        tar.extractall(directory, filter="data")
    return directory


def move_into_place(staged: Path, target: Path) -> None:
    """Rename a fully written folder to `target`; when another writer got there first, theirs
    stays (both wrote the same content-addressed thing)."""
    try:
        os.replace(staged, target)
    except OSError:
        if not target.is_dir():
            raise


async def fetch_checkpoint(store: ObjectStore, uri: str, sha256: str, directory: Path) -> Path:
    """Download a checkpoint archive (verified) and extract it into `directory` atomically."""
    directory = Path(directory)
    if directory.is_dir():
        return directory
    tmp = directory.with_name(f".{directory.name}.{uuid.uuid4().hex}.part")
    archive = tmp.with_suffix(".tar")
    try:
        await store.download_to(uri, archive, sha256=sha256)
        await asyncio.to_thread(unpack, archive, tmp)
        await asyncio.to_thread(move_into_place, tmp, directory)
    finally:
        archive.unlink(missing_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return directory


# --- resolution ------------------------------------------------------------------------------------


def rollout_home() -> Path:
    """ROLLOUT_HOME (or the per-user default), where stores and caches live."""
    value = os.environ.get("ROLLOUT_HOME")
    return Path(value).expanduser() if value else default_home()


def default_store() -> ObjectStore:
    """The object store this process uses (ROLLOUT_OBJECT_STORE_URL or ROLLOUT_HOME/objects)."""
    return open_store(default_store_url(rollout_home()), source="ROLLOUT_OBJECT_STORE_URL")


def cache_dir(record: PolicyRecord, home: Path | None = None) -> Path:
    """The local folder a policy version is unpacked into."""
    base = (home or rollout_home()) / CACHE_FOLDER / policy_key(record.model)
    return base / f"v{record.version:08d}-{record.sha256[:12]}"


async def materialize(
    record: PolicyRecord, *, store: ObjectStore | None = None, home: Path | None = None
) -> Path:
    """The local folder of an `hf` policy version, fetched from the store when missing."""
    if record.kind != "hf":
        raise RolloutError(
            f"model {record.model!r} is a {record.kind} fine-tune, not local weights"
        )
    own = store is None
    store = store or default_store()
    try:
        return await fetch_checkpoint(store, record.uri, record.sha256, cache_dir(record, home))
    finally:
        if own:
            await store.close()


def run_sync(factory: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to completion from sync code, even inside a running event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(factory())
    # Resolution is called synchronously from async services: use a private loop elsewhere.
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, factory()).result()


async def _with_store(fn: Callable[[ObjectStore], Awaitable[T]]) -> T:
    store = default_store()
    try:
        return await fn(store)
    finally:
        await store.close()


class FollowsPolicy(ABC):
    """A backend serving one trained policy name that moves to each newer version of it."""

    model_name: str
    policy_version: int
    record: PolicyRecord
    # The digest of the weights now generating (stamped on every response).
    weights_sha256: str | None
    _version_lock: threading.Lock

    def load(self, record: PolicyRecord) -> bool:
        """Switch to `record` when it is newer than what is loaded; True when it switched."""
        if record.version <= self.policy_version:
            return False  # nothing to fetch
        return self.load_path(record, run_sync(lambda: materialize(record)))

    def load_path(self, record: PolicyRecord, path: Path) -> bool:
        """Switch to `record`, whose folder is `path`, when it is newer; True when it switched."""
        with self._version_lock:
            if record.version <= self.policy_version:
                return False
            self._switch(record, path)
            self.record, self.policy_version = record, record.version
            return True

    def refresh(self) -> bool:
        """Load the newest published version of this name if it is newer; True when it did."""
        latest = run_sync(lambda: _with_store(lambda s: latest_record(s, self.model_name)))
        return latest is not None and self.load(latest)

    @abstractmethod
    def _switch(self, record: PolicyRecord, path: Path) -> None:
        """Start generating with the weights at `path` (the folder of `record`)."""


class TrainedBackend(HFBackend, FollowsPolicy):
    """An `hf` backend on a trained policy that follows new versions of its name."""

    def __init__(self, record: PolicyRecord, path: Path) -> None:
        # A policy trained from a local model samples as that model does.
        root = root_model(record.model) or root_model(record.base_model)
        super().__init__(
            path,
            threads=root.threads if root else None,
            stop_after_tool_call=root.stop_after_tool_call if root else False,
        )
        self.record = record
        self.model_name = record.model
        self.policy_version = record.version
        self.name = record.model
        self.weights_sha256 = checked_digest(record, path)
        self._version_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"TrainedBackend({self.model_name!r}, v{self.policy_version})"

    def _switch(self, record: PolicyRecord, path: Path) -> None:
        digest = checked_digest(record, path)
        # Weights, name and digest change together under the generation lock (reload).
        self.reload(path, weights_sha256=digest, name=self.model_name)


def checked_digest(record: PolicyRecord, path: Path) -> str:
    """The digest of the weights at `path`; RolloutError when not the one `record` published."""
    digest = weights_digest(path)
    if record.weights_sha256 and record.weights_sha256 != digest:
        raise RolloutError(
            f"{record.model} v{record.version}: the weights at {path} have sha256 {digest}, "
            f"not the {record.weights_sha256} the learner published"
        )
    return digest


# Backends that serve a policy version elsewhere (an inference server): each is asked in
# turn and may decline (None), e.g. for weights it cannot load; then it runs in process.
PolicyServer = Callable[[PolicyRecord, Path], "ModelBackend | None"]
_POLICY_SERVERS: list[PolicyServer] = []


def register_policy_server(server: PolicyServer) -> None:
    """Let `server` serve trained policies (asked before the in-process `hf` backend)."""
    if server not in _POLICY_SERVERS:
        _POLICY_SERVERS.append(server)


def backend_for(record: PolicyRecord, *, path: Path | None = None) -> ModelBackend:
    """A backend on a published policy version (its folder `path`, else fetched)."""
    if record.kind == "openai":
        return openai_backend(record.remote_model or "")
    if record.kind == "together":
        return together_backend(record.remote_model or "")
    path = path or run_sync(lambda: materialize(record))
    for server in _POLICY_SERVERS:
        backend = server(record, path)
        if backend is not None:
            return backend
    return TrainedBackend(record, path)


def find_trained(name: str) -> PolicyRecord | None:
    """The newest policy called `name` (a `BASE:SUFFIX` or a job id), or None."""
    name = name.strip()
    if name.startswith(JOB_PREFIX) and ":" not in name:
        return run_sync(lambda: _with_store(lambda s: job_record(s, name)))
    # `job-...:SUFFIX`: a policy trained from a job's model is named after its base, like any.
    if split_trained_name(name) is None:
        return None
    return run_sync(lambda: _with_store(lambda s: latest_record(s, name)))


def resolve_trained(name: str) -> ModelBackend:
    """The backend of a trained policy name; RolloutError when no such policy was published."""
    record = find_trained(name)
    if record is None:
        job = name.strip()
        if job.startswith(JOB_PREFIX) and ":" not in job:
            # A job publishes its model when it completes: say why there may be none yet.
            raise RolloutError(
                f"job {job!r} has published no model",
                problems=[
                    "a job publishes its model when it completes; one that is still running, "
                    f"failed or was cancelled has none: see `rollout job {job}`"
                ],
            )
        raise RolloutError(
            f"no trained model {name!r}",
            problems=["see `rollout jobs` for finished jobs and the model names they produced"],
        )
    return backend_for(record)


def refresh_policy(backend: Any) -> None:
    """Bring a trained backend to its newest version (a no-op for every other backend)."""
    if isinstance(backend, FollowsPolicy):
        backend.refresh()


def apply_update(backend: Any, payload: Any) -> bool:
    """Load the version a `policy.updated` event announces into `backend` if it serves it."""
    if not isinstance(backend, FollowsPolicy) or backend.model_name != payload.model:
        return False
    record = run_sync(lambda: _with_store(lambda s: latest_record(s, payload.model)))
    if record is None or record.version < payload.version:
        record = PolicyRecord(
            model=payload.model,
            version=payload.version,
            uri=payload.checkpoint_uri,
            sha256=payload.sha256,
            job_id=payload.job_id,
            weights_sha256=payload.weights_sha256 or "",
        )
    return backend.load(record)


# --- registration ----------------------------------------------------------------------------------


def resolve_trained_name(name: str) -> ModelBackend | None:
    """A trained policy's backend for `BASE:SUFFIX`, or None (then the base's form decides)."""
    if name.startswith(JOB_PREFIX):
        return None  # the `job-` form resolves (and reports) job ids
    record = find_trained(name)
    return backend_for(record) if record is not None else None


def install() -> None:
    """Make trained names resolvable: a resolver before every form, and the `job-` form."""
    register_resolver(resolve_trained_name)
    register_backend(JOB_PREFIX, resolve_trained, example="job-3f2a9c1d0b7e4a55", whole_name=True)


install()
