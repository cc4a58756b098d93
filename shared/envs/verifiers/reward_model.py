"""The `reward_model` primitive: a trained reward model scores the whole conversation.

`rollout improve --method rm --suffix S` trains a sequence classifier on the buffer's
preference pairs and publishes it as `BASE:S`. This primitive names that model; its name is
resolved as actors resolve trained policies (the newest published version, fetched into the
local cache by sha256). The conversation is rendered exactly as the RM was trained on it (the
trajectory's messages, normalised as for training, with the task's tools), and the score is
sigmoid(logit) in [0, 1], passed at `threshold`.

The verdict comes from the model's logit only: nothing the agent writes is parsed, so an agent
that prints "reward: 1" gets whatever the reward model thinks of such an answer, and
control-token texts in the conversation (`<|im_end|>`...) are removed before it is rendered
(by RewardScorer, for PPO's rescoring too), so an answer cannot close its turn and forge a
transcript the model reads as structure. A conversation longer than `maxLength` tokens fails:
cut to its start, it would be scored on a prefix the policy wrote, the logit read at a token
of its choosing and everything after (the failed calls, the real answer) unseen. Each
checkpoint loads once per process (RewardScorer's cache) and runs in a worker thread, so the
verifier's event loop keeps acking while a batch is scored.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from pathlib import Path
from typing import Any

from pydantic import Field

from rollout.shared.contracts.envspec import CamelModel, EnvironmentSpec, TaskSpec
from rollout.shared.envs.runtimes import start_runtime
from rollout.shared.envs.verifiers.registry import InfraError, Outcome, ScoreContext, register
from rollout.shared.errors import RolloutError
from rollout.shared.learning.data import conversation
from rollout.shared.learning.rm import RM_MARKER
from rollout.shared.learning.rm_scoring import drop_scorer, past_positions, scorer_for
from rollout.shared.models import names, trained
from rollout.shared.models.trained import run_sync


class RewardModelParams(CamelModel):
    """`reward_model`: a trained reward model (`rollout improve --method rm`) scores the whole
    conversation; the score is the sigmoid of its logit, passed when it reaches `threshold`."""

    model: str = Field(
        min_length=1,
        max_length=512,
        description="A trained reward model's name (BASE:SUFFIX or a job id), e.g. "
        "local/tiny-agent:rm.",
    )
    threshold: float = Field(
        default=0.5, ge=0, le=1, description="Passed when sigmoid(logit) >= threshold."
    )
    max_length: int = Field(
        default=2048,
        ge=16,
        le=131072,
        description="Tokens of the conversation the model reads, at most its "
        "max_position_embeddings (checked at plan time); a longer one fails.",
    )


_JOB_ID = re.compile(r"^job-[A-Za-z0-9]{1,64}$")
HINT = "train one with `rollout improve --method rm --suffix S` (see `rollout jobs`)"
# The task's tools, per (spec hash, task): a runtime is built once per task, not per sample.
_TOOLS: dict[tuple[str, str], list[dict[str, Any]]] = {}
# The checkpoint each reward model name last scored with: a newer version frees the older.
_CURRENT: dict[str, Path] = {}


async def resolve(name: str) -> tuple[Any, Path]:
    """(policy record, local checkpoint folder) of the newest version of a trained name."""
    name = name.strip()
    is_job = name.startswith(trained.JOB_PREFIX)
    if (is_job and not _JOB_ID.match(name)) or (
        not is_job and names.split_trained_name(name) is None
    ):
        raise RolloutError(
            f"{name!r} is not a trained model name (BASE:SUFFIX or a job id, "
            f"e.g. local/tiny-agent:rm): {HINT}"
        )
    store = trained.default_store()
    try:
        if is_job:
            record = await trained.job_record(store, name)
        else:
            record = await trained.latest_record(store, name)
        if record is None:
            raise RolloutError(f"no trained reward model {name!r}: {HINT}")
        if record.kind != "hf":
            raise RolloutError(
                f"{name!r} is a {record.kind} fine-tune, not a local reward model: {HINT}"
            )
        path = await trained.materialize(record, store=store)
    finally:
        await store.close()
    return record, path


def not_a_reward_model(name: str, path: Path) -> str | None:
    """Why the checkpoint at `path` is not a one-output reward model, or None when it is one."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return f"{name!r} has no readable config.json: not a reward model ({HINT})"
    architectures = config.get("architectures") or []
    if not (path / RM_MARKER).is_file() or not any(
        str(a).endswith("ForSequenceClassification") for a in architectures
    ):
        shape = ", ".join(map(str, architectures)) or "an unknown architecture"
        return (
            f"{name!r} is not a reward model: its checkpoint is {shape}, not a sequence "
            f"classifier trained by `--method rm` ({HINT})"
        )
    labels = len(config.get("id2label") or {}) or config.get("num_labels", 1)
    if labels != 1:
        return f"{name!r} is a classifier with {labels} outputs, not a one-score reward model"
    return None


def check(params: RewardModelParams) -> list[tuple[str, str]]:
    """Plan time: the name resolves to a published reward model (its checkpoint is fetched)."""
    try:
        _, path = run_sync(lambda: resolve(params.model))
    except RolloutError as exc:
        return [("model", exc.message)]
    except OSError as exc:
        return [("model", f"could not fetch {params.model!r}: {exc}")]
    problem = not_a_reward_model(params.model, path)
    if problem:
        return [("model", problem)]
    # A conversation longer than the model's positions but under maxLength would be fed
    # whole: it fails, or is scored on positions the model never learnt.
    too_long = past_positions(params.max_length, params.model, path)
    return [("maxLength", too_long)] if too_long else []


async def task_tools(spec: EnvironmentSpec, task: TaskSpec) -> list[dict[str, Any]]:
    """The OpenAI tools the task offered the model (what the RM saw in training)."""
    key = (spec.spec_hash(), task.model_dump_json())
    if key not in _TOOLS:
        runtime = await start_runtime(spec, task)
        try:
            _TOOLS[key] = [t.to_openai() for t in runtime.tool_specs()]
        finally:
            await runtime.close()
    return _TOOLS[key]


def sigmoid(x: float) -> float:
    """The logistic function, safe for large |x|."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


@register("reward_model", RewardModelParams, check=check)
async def reward_model(params: RewardModelParams, ctx: ScoreContext) -> Outcome:
    """sigmoid(the reward model's logit) on the conversation; passed at `threshold`."""
    try:
        messages = conversation({"trajectory": ctx.trajectory.model_dump()})
    except RolloutError as exc:
        return Outcome(0.0, False, f"nothing to score: {exc.message}")
    try:
        record, path = await resolve(params.model)
    except (RolloutError, OSError) as exc:
        # Validated at plan time: gone now (or the store failed) is the platform's problem.
        raise InfraError(f"reward model {params.model!r}: {exc}") from None
    problem = not_a_reward_model(params.model, path)
    if problem:
        raise InfraError(problem)
    tools = await task_tools(ctx.spec, ctx.task)
    previous = _CURRENT.get(record.model)
    if previous is not None and previous != path:
        drop_scorer(previous)
    _CURRENT[record.model] = path

    def run() -> tuple[float | None, int, int | None]:
        scorer = scorer_for(path, max_len=params.max_length)
        [tokens] = scorer.token_counts([messages], tools=tools or None)
        if tokens > scorer.readable:
            return None, tokens, scorer.positions
        [logit] = scorer.score([messages], tools=tools or None)
        return logit, tokens, scorer.positions

    try:
        logit, tokens, positions = await asyncio.to_thread(run)
    except (RolloutError, OSError) as exc:
        raise InfraError(f"reward model {params.model!r} could not load: {exc}") from None
    if logit is None and tokens > params.max_length:
        # Cut to its first maxLength tokens, the conversation would be scored on a prefix the
        # policy wrote (the logit read at a token of its choosing), its end never seen.
        return Outcome(
            0.0,
            False,
            f"the conversation is {tokens} tokens, more than the reward model reads "
            f"(maxLength {params.max_length}): its end would go unseen; scored as failed",
        )
    if logit is None:
        # The version scored with now has fewer positions than maxLength (checked against
        # the version there was at plan time): fed whole it fails or reads garbage.
        return Outcome(
            0.0,
            False,
            f"the conversation is {tokens} tokens, more than reward model {record.model} "
            f"v{record.version} reads (max_position_embeddings {positions} in its "
            f"config.json, under maxLength {params.max_length}): scored as failed",
        )
    value = sigmoid(logit)
    return Outcome(
        value,
        value >= params.threshold,
        f"reward model {record.model} v{record.version}: logit {logit:+.3f}, "
        f"score {value:.3f} (threshold {params.threshold:g})",
    )
