"""The ART bridge (OpenPipe ART): a run's rollouts as ART `TrajectoryGroup`s, and back.

Export: the n samples of each task become one `art.TrajectoryGroup`; each sample an
`art.Trajectory` whose `messages_and_choices` holds the prompt messages as dicts and every
sampled assistant turn as an OpenAI `Choice` (with the token ids and logprobs we kept, as
`token_id:<id>` tokens, so ART trains on exactly what was sampled); `reward` is our verifier's
score and `metrics` carry passed and each primitive's score. Errored rollouts (no verdict) are
left out: they are nobody's reward.

Import: ART trajectory groups become scored rollouts, one task per group (the task's prompt is
the group's shared prompt), in the rollout shape the training-data builders take
(`{"trajectory", "tools", "score", "passed"}`, shared/learning/data.py), so SFT sets, DPO pairs
and GRPO groups can be built from them.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rollout.shared.contracts.envspec import EnvironmentSpec
from rollout.shared.contracts.requests import ImportedRollout, ImportRun
from rollout.shared.contracts.trajectory import Trajectory
from rollout.shared.envs.engine import build_runtime
from rollout.shared.envs.templates import get_template, typed_config
from rollout.shared.errors import RolloutError
from rollout.shared.interop.backends import require
from rollout.shared.learning.data import dpo_pairs, sft_examples

require("art")


def _import_art_without_its_transformers_patch():
    """Import openpipe-art, undoing the transformers monkeypatch its import applies.

    `import art` replaces `transformers.masking_utils._preprocess_mask_arguments` process-wide
    with a wrapper written for an older signature; on transformers 5.x every later causal-mask
    call (every model forward in this process: actors, learners) then fails with a TypeError.
    The bridge only uses ART's data classes, so the original function is put back.
    """
    try:
        from transformers import masking_utils
    except ImportError:  # no training extra: ART's patch has nothing to touch
        masking_utils = None
    original = getattr(masking_utils, "_preprocess_mask_arguments", None)
    import art as module

    if masking_utils is not None and original is not None:
        masking_utils._preprocess_mask_arguments = original
    return module


art = _import_art_without_its_transformers_patch()
from openai.types.chat.chat_completion import Choice, ChoiceLogprobs  # noqa: E402
from openai.types.chat.chat_completion_message import ChatCompletionMessage  # noqa: E402
from openai.types.chat.chat_completion_token_logprob import (  # noqa: E402
    ChatCompletionTokenLogprob,
)

MAX_IMPORT_GROUPS = 100_000


def _choice(message: Mapping[str, Any], tokens: Sequence[int] | None, lps: Sequence[float] | None):
    logprobs = None
    if tokens is not None and lps is not None and len(tokens) == len(lps):
        logprobs = ChoiceLogprobs(
            content=[
                ChatCompletionTokenLogprob(token=f"token_id:{t}", logprob=lp, top_logprobs=[])
                for t, lp in zip(tokens, lps, strict=True)
            ]
        )
    body: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        body["tool_calls"] = message["tool_calls"]
    return Choice(
        index=0,
        finish_reason="tool_calls" if message.get("tool_calls") else "stop",
        message=ChatCompletionMessage.model_validate(body),
        logprobs=logprobs,
    )


def to_art_trajectory(rollout: Mapping[str, Any], tools: list[dict] | None = None) -> Any:
    """One scored rollout (a `get_rollouts` row with its trajectory) as an `art.Trajectory`."""
    raw = rollout.get("trajectory")
    if not isinstance(raw, Mapping):
        raise RolloutError(f"rollout {rollout.get('rolloutId')!r} has no trajectory to export")
    trajectory = Trajectory.model_validate(raw)
    token_ids, logprobs = trajectory.token_ids or [], trajectory.logprobs or []
    turn = 0
    items: list[Any] = []
    for message in trajectory.messages:
        if message.get("role") == "assistant":
            tokens = token_ids[turn] if turn < len(token_ids) else None
            lps = logprobs[turn] if turn < len(logprobs) else None
            items.append(_choice(message, tokens, lps))
            turn += 1
        else:
            items.append(dict(message))
    metrics: dict[str, float | int | bool] = {"passed": bool(rollout.get("passed"))}
    for prim in rollout.get("primitives") or []:
        metrics[f"primitive/{prim['name']}"] = float(prim["score"])
    metadata = {
        "rollout_id": rollout.get("rolloutId"),
        "run_id": rollout.get("runId"),
        "task_index": rollout.get("taskIndex"),
        "sample_index": rollout.get("sampleIndex"),
        "model": rollout.get("model"),
        "policy_version": rollout.get("policyVersion"),
    }
    return art.Trajectory(
        messages_and_choices=items,
        tools=tools or None,
        reward=float(rollout.get("score") or 0.0),
        metrics=metrics,
        metadata={k: v for k, v in metadata.items() if v is not None},
        initial_policy_version=rollout.get("policyVersion"),
        final_policy_version=rollout.get("policyVersion"),
    )


def to_trajectory_groups(
    rollouts: Iterable[Mapping[str, Any]], tools: Mapping[int, list[dict]] | None = None
) -> list[Any]:
    """A run's rollouts as one `art.TrajectoryGroup` per task (errored rollouts left out)."""
    by_task: dict[int, list[Mapping[str, Any]]] = {}
    for r in rollouts:
        if r.get("outcome") == "errored" or r.get("score") is None:
            continue
        by_task.setdefault(int(r["taskIndex"]), []).append(r)
    groups = []
    for task_index in sorted(by_task):
        samples = sorted(by_task[task_index], key=lambda r: r.get("sampleIndex") or 0)
        group_tools = (tools or {}).get(task_index)
        groups.append(
            art.TrajectoryGroup(
                [to_art_trajectory(r, group_tools) for r in samples],
                metadata={"task_index": task_index, "run_id": samples[0].get("runId")},
            )
        )
    return groups


# The files `rollout art import -o DIR` writes (a folder holding exactly these may be replaced).
ART_IMPORT_FILES = ("rollouts.jsonl", "sft.jsonl", "dpo.jsonl", "grpo.jsonl")


def is_earlier_groups(path: Path) -> bool:
    """Whether PATH's first line is a trajectory group, as `write_groups` writes them."""
    try:
        with path.open("rb") as f:
            first = json.loads(f.readline(MAX_LINE_BYTES) or b"null")
    except (OSError, ValueError):
        return False
    return isinstance(first, dict) and isinstance(first.get("trajectories"), list)


def write_groups(groups: Sequence[Any], path: str | Path) -> Path:
    """JSONL, one `TrajectoryGroup` per line (ART's own pydantic dump), in place of PATH at
    once (what may be replaced is the caller's to check)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as f:
            for group in groups:
                f.write(group.model_dump_json() + "\n")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


# Hostile input: caps on what one file, one line and one trajectory may hold.
MAX_LINE_BYTES = 16 * 1024 * 1024
MAX_TRAJECTORY_BYTES = 1024 * 1024
MAX_ITEMS = 1_000
MAX_IMPORT_TRAJECTORIES = 10_000
_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
_MESSAGE_KEYS = frozenset({"role", "content", "name", "tool_calls", "tool_call_id", "refusal"})


class ArtInputError(RolloutError):
    """A trajectory group or trajectory that may not be imported, named by where it is."""


def _fields(model: Any) -> frozenset[str]:
    return frozenset(model.model_fields)


def _check_message(item: Any, where: str) -> None:
    if not isinstance(item, Mapping):
        raise ArtInputError(f"{where}: must be a message or a Choice object")
    if "message" in item and "finish_reason" in item:  # a Choice: its message is the turn
        message = item["message"]
        if not isinstance(message, Mapping):
            raise ArtInputError(f"{where}.message: must be an object")
        where, item = f"{where}.message", message
    else:
        extra = sorted(set(item) - _MESSAGE_KEYS)
        if extra:
            raise ArtInputError(f"{where}: field {extra[0]!r} is not a chat message field")
    role = item.get("role")
    if role not in _ROLES:
        raise ArtInputError(f"{where}.role: must be one of {', '.join(sorted(_ROLES))}")
    content = item.get("content")
    if content is None and role == "assistant" and item.get("tool_calls"):
        return
    if not isinstance(content, str):
        raise ArtInputError(f"{where}.content: must be a string, got {type(content).__name__}")
    if "\x00" in content:
        raise ArtInputError(f"{where}.content: must not contain NUL characters")


def check_trajectory(raw: Any, where: str) -> None:
    """Refuse what a well-formed ART Trajectory cannot hold, naming the field."""
    if not isinstance(raw, Mapping):
        raise ArtInputError(f"{where}: must be an ART Trajectory object")
    extra = sorted(set(raw) - _fields(art.Trajectory))
    if extra:
        raise ArtInputError(f"{where}: field {extra[0]!r} is not an ART Trajectory field")
    size = len(json.dumps(raw, default=str).encode())
    if size > MAX_TRAJECTORY_BYTES:
        raise ArtInputError(
            f"{where}: {size} bytes, over the {MAX_TRAJECTORY_BYTES} bytes one may hold"
        )
    items = raw.get("messages_and_choices")
    if not isinstance(items, list) or not items:
        raise ArtInputError(f"{where}.messages_and_choices: must be a non-empty list")
    if len(items) > MAX_ITEMS:
        raise ArtInputError(f"{where}.messages_and_choices: more than {MAX_ITEMS} items")
    for i, item in enumerate(items):
        _check_message(item, f"{where}.messages_and_choices[{i}]")
    reward = raw.get("reward", 0.0)
    if isinstance(reward, bool) or not isinstance(reward, int | float):
        raise ArtInputError(f"{where}.reward: must be a number, got {type(reward).__name__}")
    if not math.isfinite(reward) or not 0.0 <= reward <= 1.0:
        raise ArtInputError(
            f"{where}.reward: {reward!r} is not a score in [0, 1] (rescale ART's rewards first)"
        )
    if raw.get("additional_histories"):
        raise ArtInputError(f"{where}.additional_histories: not imported; must be empty")
    tools = raw.get("tools")
    if tools is not None and not (
        isinstance(tools, list) and all(isinstance(t, Mapping) for t in tools)
    ):
        raise ArtInputError(f"{where}.tools: must be a list of tool objects")
    metrics = raw.get("metrics") or {}
    if not isinstance(metrics, Mapping):
        raise ArtInputError(f"{where}.metrics: must be an object")
    passed = metrics.get("passed")
    if passed is not None and not isinstance(passed, bool):
        raise ArtInputError(f"{where}.metrics.passed: must be true or false")


def check_group(raw: Any, where: str) -> None:
    """Refuse a TrajectoryGroup with fields ART's model does not have, or no trajectories."""
    if not isinstance(raw, Mapping):
        raise ArtInputError(f"{where}: must be an ART TrajectoryGroup object")
    extra = sorted(set(raw) - _fields(art.TrajectoryGroup))
    if extra:
        raise ArtInputError(f"{where}: field {extra[0]!r} is not an ART TrajectoryGroup field")
    trajectories = raw.get("trajectories")
    if not isinstance(trajectories, list) or not trajectories:
        raise ArtInputError(f"{where}.trajectories: must be a non-empty list")
    task = (raw.get("metadata") or {}).get("task_index")
    if task is not None and (isinstance(task, bool) or not isinstance(task, int) or task < 0):
        raise ArtInputError(f"{where}.metadata.task_index: must be a whole number >= 0")


def _raw_groups(path: str | Path) -> list[tuple[str, Any]]:
    """(where, parsed JSON) per non-empty line of PATH."""
    out: list[tuple[str, Any]] = []
    try:
        with Path(path).open("rb") as f:
            for number, line in enumerate(f, start=1):
                if len(line) > MAX_LINE_BYTES:
                    raise ArtInputError(f"{path}:{number}: a line of over {MAX_LINE_BYTES} bytes")
                if not line.strip():
                    continue
                if len(out) >= MAX_IMPORT_GROUPS:
                    raise ArtInputError(f"{path}: more than {MAX_IMPORT_GROUPS} trajectory groups")
                try:
                    out.append((f"{path}:{number}", json.loads(line)))
                except ValueError as exc:
                    raise ArtInputError(
                        f"{path}:{number}: not an ART TrajectoryGroup (not JSON: {exc})"
                    ) from None
    except OSError as exc:
        raise RolloutError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not out:
        raise RolloutError(f"{path}: no trajectory groups")
    return out


def _group_model(data: Any, where: str) -> Any:
    try:
        trajectories = [art.Trajectory.model_validate(t) for t in data["trajectories"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise ArtInputError(
            f"{where}: not an ART TrajectoryGroup ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:200]})"
        ) from None
    return art.TrajectoryGroup(trajectories, metadata=data.get("metadata") or {})


def read_groups(path: str | Path) -> list[Any]:
    """`TrajectoryGroup`s from JSONL (each line validated by ART's model; errors name it)."""
    groups = []
    for where, data in _raw_groups(path):
        if not isinstance(data, Mapping) or "trajectories" not in data:
            raise ArtInputError(f"{where}: not an ART TrajectoryGroup (no trajectories)")
        groups.append(_group_model(data, where))
    return groups


def checked_groups(source: str | Path | Iterable[Any]) -> list[tuple[str, Any, dict]]:
    """(where, TrajectoryGroup, its raw JSON) for a JSONL file or `art.TrajectoryGroup`s,
    each group and trajectory checked strictly (first problem raised, naming where it is)."""
    if isinstance(source, str | Path):
        raw = _raw_groups(source)
        label = str(source)
    else:
        raw = [
            (f"groups[{i}]", g.model_dump(mode="json") if hasattr(g, "model_dump") else g)
            for i, g in enumerate(source)
        ]
        label = "groups"
    out, count = [], 0
    for index, (where, data) in enumerate(raw):
        where = f"{where}: group {index}" if isinstance(source, str | Path) else where
        check_group(data, where)
        group = _group_model(data, where)
        for t, trajectory in enumerate(data["trajectories"]):
            check_trajectory(trajectory, f"{where} trajectory {t}")
        count += len(data["trajectories"])
        if count > MAX_IMPORT_TRAJECTORIES:
            raise ArtInputError(f"{label}: more than {MAX_IMPORT_TRAJECTORIES} trajectories")
        out.append((where, group, data))
    if not out:
        raise ArtInputError(f"{label}: no trajectory groups")
    return out


def _message(item: Any) -> dict[str, Any]:
    if isinstance(item, Choice):
        message: dict[str, Any] = {"role": "assistant", "content": item.message.content or ""}
        if item.message.tool_calls:
            message["tool_calls"] = [c.model_dump(mode="json") for c in item.message.tool_calls]
        return message
    return {k: v for k, v in dict(item).items() if v is not None}


def _tokens(item: Any) -> tuple[list[int], list[float]] | None:
    if not isinstance(item, Choice) or item.logprobs is None or not item.logprobs.content:
        return None
    ids, lps = [], []
    for entry in item.logprobs.content:
        if not entry.token.startswith("token_id:"):
            return None  # text tokens cannot be mapped back to ids without the tokenizer
        ids.append(int(entry.token.removeprefix("token_id:")))
        lps.append(float(entry.logprob))
    return ids, lps


def _as_choice(item: Any) -> Any:
    # A Choice read back from JSON is a plain dict (ART's union keeps the dict): restore it.
    if isinstance(item, Mapping) and "message" in item and "finish_reason" in item:
        return Choice.model_validate(item)
    return item


def from_art_trajectory(trajectory: Any, pass_at: float = 1.0) -> dict[str, Any]:
    """One `art.Trajectory` as a scored rollout `{trajectory, tools, score, passed, prompt}`."""
    items = [_as_choice(item) for item in trajectory.messages_and_choices]
    messages = [_message(item) for item in items]
    if not any(m.get("role") == "assistant" for m in messages):
        raise RolloutError("an ART trajectory with no assistant turn cannot be imported")
    turns = [_tokens(item) for item in items if isinstance(item, Choice)]
    keep_tokens = bool(turns) and all(t is not None for t in turns)
    final = next(
        (m.get("content") for m in reversed(messages) if m.get("role") == "assistant"), None
    )
    ours = Trajectory(
        messages=messages,
        final_output=final,
        token_ids=[t[0] for t in turns] if keep_tokens else None,  # type: ignore[index]
        logprobs=[t[1] for t in turns] if keep_tokens else None,  # type: ignore[index]
    )
    score = float(trajectory.reward)
    passed = trajectory.metrics.get("passed")
    prompt = next((m.get("content") for m in messages if m.get("role") == "user"), "")
    return {
        "trajectory": ours.model_dump(mode="json"),
        "tools": list(trajectory.tools or []),
        "score": score,
        "passed": bool(passed) if isinstance(passed, bool) else score >= pass_at,
        "prompt": prompt if isinstance(prompt, str) else json.dumps(prompt),
    }


def from_trajectory_groups(groups: Iterable[Any], pass_at: float = 1.0) -> list[dict[str, Any]]:
    """ART groups as scored rollouts: group i is task i, its trajectories the samples."""
    rollouts = []
    for task_index, group in enumerate(groups):
        for sample_index, trajectory in enumerate(group.trajectories):
            try:
                row = from_art_trajectory(trajectory, pass_at)
            except RolloutError as exc:
                raise RolloutError(
                    f"group {task_index} trajectory {sample_index}: {exc.message}"
                ) from None
            rollouts.append({**row, "task_index": task_index, "sample_index": sample_index})
    return rollouts


def import_request(
    source: str | Path | Iterable[Any],
    env_slug: str,
    *,
    task_count: int,
    env_version: int | None = None,
    model: str = "imported/art",
    name: str | None = None,
    pass_at: float = 1.0,
) -> Any:
    """An `ImportRun` request from ART groups (a JSONL file or `art.TrajectoryGroup`s).

    Every group and trajectory is checked first; the first problem is raised naming the file,
    line, group, trajectory and field, so nothing is sent unless every row is good. Group i is
    task i of the environment unless its metadata names a `task_index` (our export does).
    """
    rollouts = []
    samples: dict[int, int] = {}
    for position, (where, group, data) in enumerate(checked_groups(source)):
        task = (data.get("metadata") or {}).get("task_index", position)
        if task >= task_count:
            raise ArtInputError(
                f"{where}: task {task} is not a task of {env_slug!r} (it has {task_count}); "
                "set the group's metadata.task_index"
            )
        for t, trajectory in enumerate(group.trajectories):
            at = f"{where} trajectory {t}"
            try:
                row = from_art_trajectory(trajectory, pass_at)
            except RolloutError as exc:
                raise ArtInputError(f"{at}: {exc.message}") from None
            sample = samples.get(task, 0)
            samples[task] = sample + 1
            sampled_by = (trajectory.metadata or {}).get("model")
            try:
                rollouts.append(
                    ImportedRollout(
                        task_index=task,
                        sample_index=sample,
                        trajectory=row["trajectory"],
                        score=row["score"],
                        passed=row["passed"],
                        reason=f"ART reward {row['score']:g}",
                        model=sampled_by if isinstance(sampled_by, str) and sampled_by else None,
                    )
                )
            except ValidationError as exc:
                err = exc.errors()[0]
                field = ".".join(str(x) for x in err["loc"])
                raise ArtInputError(f"{at}: {field}: {err['msg']}") from None
    try:
        return ImportRun(
            env_slug=env_slug, env_version=env_version, model=model, name=name, rollouts=rollouts
        )
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(x) for x in err["loc"])
        raise ArtInputError(f"import: {field}: {err['msg']}") from None


async def import_run(
    client: Any,
    source: str | Path | Iterable[Any],
    env_slug: str,
    *,
    env_version: int | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Record ART groups as an imported run of `env_slug`; the tracker's answer (`runId`)."""
    if not isinstance(source, str | Path):
        source = list(source)  # read twice: checked here, converted below
    checked_groups(source)  # a bad file is refused before anything is asked of the platform
    doc = await client.get_environment(env_slug, env_version)
    spec = doc.get("spec", doc)
    request = import_request(
        source,
        env_slug,
        task_count=len(spec.get("tasks", [])),
        env_version=env_version,
        **options,
    )
    return await client.import_run(request)


def training_sets(rollouts: Sequence[Mapping[str, Any]], min_margin: float = 0.0) -> dict:
    """SFT examples (passing rollouts), DPO pairs and GRPO prompt groups from imported rollouts."""
    if not (math.isfinite(min_margin) and min_margin >= 0):
        raise RolloutError(f"--min-margin must be a finite number >= 0, got {min_margin}")
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for r in rollouts:
        groups.setdefault(str(r["task_index"]), []).append(r)
    return {
        "sft": sft_examples([r for r in rollouts if r["passed"]]),
        "dpo": dpo_pairs(groups, min_margin),
        "grpo": [
            {"prompt": samples[0]["prompt"], "rewards": [s["score"] for s in samples]}
            for samples in groups.values()
        ],
    }


def tools_known_statically(spec: Any) -> bool:
    """True when `spec`'s template knows its tools without running user or remote code.

    Asked of the Template protocol (`tool_names` is None when only a plugin or a remote server
    knows them), so a template added to the registry is handled here without naming it.
    """
    template = get_template(spec.template)
    if template is None:
        return False
    try:
        config = typed_config(spec)
    except (ValueError, TypeError):
        return False
    return template.tool_names(config) is not None


async def _task_tools(spec: Any, task_indices: Iterable[int]) -> dict[int, list[dict]]:
    # Tools of declarative templates are known without running user code; plugin and remote
    # envs (plugin hosts, servers) are not started just to export.

    if not tools_known_statically(spec):
        return {}
    tools = {}
    for index in task_indices:
        runtime = build_runtime(spec, index)
        try:
            tools[index] = [t.to_openai() for t in runtime.tool_specs()]
        finally:
            await runtime.close()
    return tools


async def export_run(client: Any, run_id: str) -> list[Any]:
    """A run's scored rollouts as ART trajectory groups (one per task), from the platform."""
    run = await client.get_run(run_id, include_rollouts=True, include_trajectories=True)
    rollouts = run.get("rollouts") or []
    if not rollouts:
        raise RolloutError(f"run {run_id} has no rollouts to export")
    tools: dict[int, list[dict]] = {}
    slug, version = run.get("envSlug"), run.get("envVersion")
    if slug:
        doc = await client.get_environment(slug, version)
        spec = EnvironmentSpec.model_validate(doc.get("spec", doc))
        tools = await _task_tools(spec, sorted({int(r["taskIndex"]) for r in rollouts}))
    return to_trajectory_groups(rollouts, tools)
