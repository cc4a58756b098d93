"""Can the actors generate with a run's model? Asked before the run is recorded.

The name's form and the operator's allow-list are checked here, but what a model needs is at
the actors: the API key in their environment, a reachable endpoint, an `hf:` folder on their
disk. Without this, a run on a model they cannot serve was accepted and every rollout errored.
One actor replica answers (the pool's replicas are configured alike); none answering, or not
in time (a large model still loading), refuses nothing: the run waits for the actors, as before.
"""

from __future__ import annotations

import os
import time
import weakref

from nats.aio.client import Client

from rollout.shared import subjects
from rollout.shared.bus.requests import call
from rollout.shared.contracts.requests import CheckModel
from rollout.shared.errors import RolloutError
from rollout.shared.observability import get_logger

log = get_logger(__name__)

# How long run creation waits for the actors' answer (a first load of a local model included).
TIMEOUT_ENV = "ROLLOUT_MODEL_CHECK_S"
DEFAULT_TIMEOUT_S = 10.0


def check_timeout_s() -> float:
    """The wait for the actors' answer; 0 turns the check off."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    try:
        return max(0.0, float(raw)) if raw else DEFAULT_TIMEOUT_S
    except ValueError:
        raise RolloutError(f"{TIMEOUT_ENV} must be a number of seconds, got {raw!r}") from None


# A model the actors said they can serve is not asked about again for this long: an online
# job's rounds, a plan's stages, a sweep start many runs of one model.
SERVABLE_FOR_S = 60.0
# Per tracker connection (a replica's, or a test's platform): when each model was found servable.
_servable: weakref.WeakKeyDictionary[Client, dict[str, float]] = weakref.WeakKeyDictionary()


async def actors_problem(nc: Client | None, model: str) -> str | None:
    """Why the actors cannot generate with `model`, in their words; None if they can, or if
    no actor answered in time."""
    timeout_s = check_timeout_s()
    if nc is None or timeout_s == 0:
        return None
    now = time.monotonic()
    servable = _servable.setdefault(nc, {})
    if (seen := servable.get(model)) is not None and now - seen < SERVABLE_FOR_S:
        return None
    subject = subjects.request("actor", "check_model")
    try:
        data = await call(nc, subject, CheckModel(model=model), timeout_s=timeout_s)
    except RolloutError as exc:
        # No actor running yet, or one still loading: the run waits for them.
        log.info("model not checked by the actors", model=model, why=str(exc))
        return None
    if not (problem := data.get("problem")):
        if not data.get("loading"):
            servable[model] = now
            if len(servable) > 1024:  # names are free-form: keep the newest only
                for name in sorted(servable, key=servable.__getitem__)[:512]:
                    del servable[name]
        return None
    return f"model: the actors cannot generate with {model!r}: {problem}"
