"""Is a run's trained model there? Job ids and `local/...:SUFFIX` names, checked at creation.

A name's form alone accepts any suffix of a local model and any job id, so a typo'd trained
name used to start a run whose every rollout errored at the actors ("no trained model ...").
Those two kinds of name are unambiguous: a job id, or a local model's name with a suffix, is
nothing but a trained policy, and its record is in the object store the learner publishes to.
Other trained names are left to the actors: `hf:<dir>:<suffix>` may be a folder whose name has
a colon on the actors' machines, and provider names (`openai/ft:...:acme:v1:...`) have colons
of their own.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable

import asyncpg

from rollout.shared.errors import RolloutError
from rollout.shared.models import trained
from rollout.shared.models.local_models import local_model
from rollout.shared.models.names import split_trained_name
from rollout.shared.objectstore import ObjectStore
from rollout.shared.observability import get_logger

log = get_logger(__name__)

# What a job id may be: also a key in the object store, so nothing that could leave its folder.
_JOB_ID = re.compile(r"^job-[A-Za-z0-9_\-]{1,64}$")
_SEE_JOBS = "see `rollout jobs` for the model names finished jobs produced"


def is_checked(model: str) -> bool:
    """True for the names this module can check: job ids, and `BASE:SUFFIX` on a local model's
    name or a job id (`job-...:SUFFIX`: trained from a job's model)."""
    name = model.strip()
    parts = split_trained_name(name)
    if parts is not None:
        return local_model(parts[0]) is not None or bool(_JOB_ID.match(parts[0]))
    return name.startswith(trained.JOB_PREFIX)


async def trained_model_problem(
    model: str, store: ObjectStore | None, pool: asyncpg.Pool | None
) -> str | None:
    """Why `model`, a trained name, cannot be generated with; None if it can (or is unchecked)."""
    name = model.strip()
    if store is None or not is_checked(name):
        return None
    if name.startswith(trained.JOB_PREFIX) and split_trained_name(name) is None:
        if not _JOB_ID.match(name):
            return (
                f"model: {model!r} is not a job id (job-<16 hex digits>, e.g. job-3f2a9c1d0b7e4a55)"
            )
        if await _published(trained.job_record(store, name)):
            return None
        return f"model: {await _why_no_model(name, pool)}"
    if await _published(trained.latest_record(store, name)):
        return None
    return f"model: no trained model {name!r} ({_SEE_JOBS})"


async def _published(lookup: Awaitable[trained.PolicyRecord | None]) -> bool:
    """True when the record is there, or when the store could not say (the actors decide)."""
    try:
        return await lookup is not None
    except (OSError, RolloutError, ValueError) as exc:
        # An unreadable store refuses nothing: the actors read the same store and say why.
        log.warning("object store unreadable; trained name not checked", error=str(exc))
        return True


async def _why_no_model(job_id: str, pool: asyncpg.Pool | None) -> str:
    """Why job `job_id` has no model to generate with, from the jobs read model."""
    row = None
    if pool is not None:
        async with pool.acquire() as conn:
            row = await conn.fetchrow("select status, reason from jobs where job_id = $1", job_id)
    if row is None:
        return f"no training job {job_id!r} ({_SEE_JOBS})"
    if row["status"] == "failed":
        return f"training job {job_id} failed and published no model: {row['reason']}"
    return (
        f"training job {job_id} has published no model yet (it is {row['status']}; "
        f"follow it with `rollout job {job_id} --follow`)"
    )
