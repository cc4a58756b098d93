"""Checkpoints and policies in the object store (claim checks), and getting them back."""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import tempfile
from pathlib import Path
from typing import Any

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from rollout.services.learner.journal import JobJournal, job_owner
from rollout.shared import subjects
from rollout.shared.auth.ownership import describe, may_change
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.contracts.events import CheckpointSaved, JobRequested, PolicyUpdated
from rollout.shared.errors import RolloutError
from rollout.shared.learning.checkpoints import load_checkpoint_state
from rollout.shared.models import trained
from rollout.shared.models.weights_proof import weights_digest
from rollout.shared.objectstore import ObjectRef, ObjectStore, sha256_file
from rollout.shared.objectstore.claimcheck import to_json_bytes
from rollout.shared.observability import get_logger

log = get_logger(__name__)


async def upload_dir(
    store: ObjectStore, directory: Path, prefix: str, *, arcname: str
) -> ObjectRef:
    """Pack `directory` as a tar and store it under a content-addressed key in `prefix`."""
    with tempfile.TemporaryDirectory(prefix="rollout-pack-") as tmp:
        archive = Path(tmp) / "pack.tar"
        await asyncio.to_thread(trained.pack_dir, directory, archive, arcname=arcname)
        sha, _ = await asyncio.to_thread(sha256_file, archive)
        return await store.put(f"{prefix}/{sha}.tar", archive)


async def save_checkpoint(
    store: ObjectStore, journal: JobJournal, out_dir: Path, path: Path, step: int
) -> ObjectRef:
    """Upload a checkpoint folder (kept relative to `out_dir`), then record checkpoint.saved."""
    try:
        arcname = path.relative_to(out_dir).as_posix()
    except ValueError:
        arcname = path.name
    prefix = f"{trained.CHECKPOINT_PREFIX}/{journal.job_id}"
    ref = await upload_dir(store, path, prefix, arcname=arcname)
    await journal.checkpoint(step, ref.uri, ref.sha256, ref.size)
    log.info("checkpoint saved", job_id=journal.job_id, step=step, uri=ref.uri)
    return ref


async def restore_checkpoint(
    store: ObjectStore, out_dir: Path, checkpoint: CheckpointSaved | None
) -> int | None:
    """Put the job's last recorded checkpoint back in `out_dir` when it is not there already."""
    if checkpoint is None:
        return None
    local = await asyncio.to_thread(load_checkpoint_state, out_dir)
    if local is not None and local.step >= checkpoint.step:
        return local.step
    with tempfile.TemporaryDirectory(prefix="rollout-restore-") as tmp:
        archive = Path(tmp) / "checkpoint.tar"
        await store.download_to(checkpoint.uri, archive, sha256=checkpoint.sha256)
        staged = Path(tmp) / "staged"
        await asyncio.to_thread(trained.unpack, archive, staged)
        for child in staged.rglob("*"):
            if child.is_file():
                target = out_dir / child.relative_to(staged)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(str(child), target)
    log.info("checkpoint restored", out_dir=str(out_dir), step=checkpoint.step)
    return checkpoint.step


async def check_name_owner(
    store: ObjectStore, js: JetStreamContext, model: str, job_id: str, owner: str | None
) -> None:
    """RolloutError when `model`'s newest version came from another user's job.

    A trained name is its publisher's: runs, compares and `serve-model` pick up its newest
    version, so a colleague's key training with the same base and suffix must not replace it.
    The admin and the services may; jobs recorded before owners were kept are not checked.
    """
    latest = await trained.latest_record(store, model)
    if latest is None or latest.job_id in (None, job_id) or owner is None:
        return
    theirs = await job_owner(js, latest.job_id)
    if may_change(owner, theirs):
        return
    raise RolloutError(
        f"suffix: model {model!r} was trained by {describe(theirs)} (job {latest.job_id}), not "
        f"by {describe(owner)}: a key may publish new versions only of its own trained models; "
        "choose another --suffix"
    )


def owner_of(journal: JobJournal) -> str | None:
    """The owner of the journal's job, from its job.requested."""
    body = journal.parent.body() if journal.parent is not None else None
    return body.owner if isinstance(body, JobRequested) else None


async def publish_policy(
    store: ObjectStore,
    journal: JobJournal,
    *,
    model: str,
    version: int,
    model_dir: Path,
    base_model: str,
    off_policy: dict[str, float] | None = None,
    signals: dict[str, Any] | None = None,
) -> trained.PolicyRecord:
    """Upload a loadable model folder as `model` version `version`; announce policy.updated.

    `signals`: the step's per-token signals by rollout (shared/learning/grpo.py
    `last_signals`), stored beside the model by their content hash for the viewer.
    """
    await check_name_owner(store, journal.js, model, journal.job_id, owner_of(journal))
    ref = await upload_dir(store, model_dir, f"models/{trained.policy_key(model)}", arcname=".")
    weights = await asyncio.to_thread(weights_digest, model_dir)
    record = trained.PolicyRecord(
        model=model,
        version=version,
        kind="hf",
        uri=ref.uri,
        sha256=ref.sha256,
        size=ref.size,
        job_id=journal.job_id,
        base_model=base_model,
        weights_sha256=weights,
    )
    await trained.publish_record(store, record)
    signals_ref = None
    if signals:
        body = to_json_bytes({"model": model, "version": version, "job_id": journal.job_id,
                              "rollouts": signals})  # fmt: skip
        digest = hashlib.sha256(body).hexdigest()
        signals_ref = await store.put(f"signals/{trained.policy_key(model)}/{digest}.json", body)
    await journal.policy(
        model, version, ref.uri, ref.sha256, off_policy, signals_ref, sorted(signals or {}),
        weights_sha256=weights,
    )  # fmt: skip
    log.info("policy updated", model=model, version=version, uri=ref.uri)
    return record


async def next_version(store: ObjectStore, model: str, job_id: str) -> int:
    """The version this job's policy gets: its own if it published one, else latest + 1."""
    mine = await trained.job_record(store, job_id)
    if mine is not None and mine.model == model:
        return mine.version
    latest = await trained.latest_record(store, model)
    return (latest.version + 1) if latest is not None else 1


async def announced_version(js: JetStreamContext, model: str) -> int | None:
    """The newest version policy.updated announced for `model` (None: none yet).

    The log, not the store's record, says what actors were told: a learner killed between
    writing the record and appending the event must still announce that version.
    """
    subject = subjects.event(
        "policy", trained.policy_key(model), subjects.event_name(PolicyUpdated.event_type)
    )
    try:
        raw = await js.get_last_msg(subjects.EVENTS_STREAM, subject)
    except NotFoundError:
        return None
    body = EventEnvelope.from_bytes(raw.data).body()
    return body.version if isinstance(body, PolicyUpdated) else None
