"""A dataset snapshot row: one scored rollout with its lineage (`rollout export` / `import`)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from rollout.shared.contracts.trajectory import Trajectory
from rollout.shared.jsonl import jsonl_objects

FORMAT = "rollout.snapshot/1"
Outcome = Literal["passed", "failed", "errored"]


class SnapshotRow(BaseModel):
    """One exported rollout: the verdict, the trajectory and where both came from."""

    model_config = ConfigDict(extra="forbid")

    format: Literal["rollout.snapshot/1"] = Field(description="the snapshot format version")
    rollout_id: str = Field(min_length=1)
    run_id: str = Field(min_length=1)
    task_index: int = Field(ge=0)
    sample_index: int = Field(ge=0)
    task_id: str | None = None
    split: str | None = Field(
        default=None,
        description="the task's split when exported; import leaves held-out tasks (any split but"
        " train) out of the training sets it builds, as the learner does (none: unknown, kept)",
    )
    model: str
    policy_version: int = Field(ge=0)
    seed: int | None = None
    env_slug: str
    env_version: int = Field(ge=1)
    env_hash: str
    score: float | None
    passed: bool | None
    outcome: Outcome
    error: str | None = None
    error_kind: str | None = None
    primitives: str = Field(description="JSON list of the primitives' verdicts")
    trajectory: str = Field(description="JSON Trajectory (messages, token ids, logprobs)")
    tools: str | None = Field(default=None, description="JSON list of OpenAI tools")
    prompt: str | None = None
    completion: str | None = None
    source: str | None = Field(
        default=None,
        description="where the verdict came from: none for the platform's verifier, else the"
        " importer ('art': a reward recorded elsewhere, not verified here)",
    )

    @field_validator("trajectory")
    @classmethod
    def _trajectory(cls, value: str) -> str:
        try:
            trajectory = Trajectory.model_validate_json(value)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "(the document)"
            raise ValueError(f"not a trajectory: {where}: {first['msg']}") from None
        if not trajectory.messages:
            raise ValueError("not a trajectory: messages: missing or empty")
        return value

    @field_validator("primitives", "tools")
    @classmethod
    def _json_list(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                decoded = json.loads(value)
            except ValueError:
                raise ValueError("not JSON text") from None
            if not isinstance(decoded, list):
                raise ValueError("must be a JSON list")
        return value

    def buffer_row(self) -> dict[str, Any]:
        """The row in the shape the buffer keeps (what its training-set builders read)."""
        return {
            "rollout_id": self.rollout_id,
            "run_id": self.run_id,
            "env_hash": self.env_hash,
            "task_index": self.task_index,
            "sample_index": self.sample_index,
            "policy_version": self.policy_version,
            "score": None if self.outcome == "errored" else self.score,
            "passed": bool(self.passed) if self.outcome != "errored" else False,
            "error": self.error if self.outcome == "errored" else None,
            "trajectory": json.loads(self.trajectory),
            "tools": json.loads(self.tools) if self.tools else [],
        }


class DatasetLineage(BaseModel):
    """Where a snapshot's rows came from: runs, policy versions, envs, hashes, verdicts."""

    model_config = ConfigDict(extra="forbid")

    rows: int = Field(ge=1)
    run_ids: list[str]
    policy_versions: list[int]
    envs: list[str] = Field(description="slug@version of every env the rows ran on")
    env_hashes: list[str]
    models: list[str]
    outcomes: dict[str, int] = Field(description="rows per outcome: passed, failed, errored")
    sources: dict[str, int] = Field(
        default_factory=dict,
        description="rows per verdict source: 'verifier' (scored here) or an importer ('art')",
    )


class DatasetSource(BaseModel):
    """A dataset snapshot a training job learns from, stored as canonical JSONL (claim check)."""

    model_config = ConfigDict(extra="forbid")

    uri: str = Field(min_length=1, description="object-store URI of the rows' canonical JSONL")
    sha256: str = Field(
        pattern=r"^[0-9a-f]{64}$", description="the dataset's hash: sha256 of those bytes"
    )
    size: int = Field(ge=1)
    name: str = Field(description="the file or folder it was read from (for people)")
    lineage: DatasetLineage


def lineage_of(rows: list[SnapshotRow]) -> DatasetLineage:
    """The lineage of checked snapshot rows."""
    outcomes: dict[str, int] = {}
    for row in rows:
        outcomes[row.outcome] = outcomes.get(row.outcome, 0) + 1
    return DatasetLineage(
        rows=len(rows),
        run_ids=sorted({r.run_id for r in rows}),
        policy_versions=sorted({r.policy_version for r in rows}),
        envs=sorted({f"{r.env_slug}@{r.env_version}" for r in rows}),
        env_hashes=sorted({r.env_hash for r in rows}),
        models=sorted({r.model for r in rows}),
        outcomes=dict(sorted(outcomes.items())),
        sources=source_counts(r.source for r in rows),
    )


def source_counts(sources: Iterable[str | None]) -> dict[str, int]:
    """Rows per verdict source: 'verifier' for the platform's own, else the importer's name."""
    counts: dict[str, int] = {}
    for source in sources:
        counts[source or "verifier"] = counts.get(source or "verifier", 0) + 1
    return dict(sorted(counts.items()))


def canonical_jsonl(rows: list[SnapshotRow]) -> bytes:
    """The rows as one JSON object a line, in order: equal rows give equal bytes (and hash)."""
    # A verifier-scored row leaves `source` out, so its bytes (and hash) are as before it.
    return "".join(
        row.model_dump_json(exclude=None if row.source else {"source"}) + "\n" for row in rows
    ).encode()


def row_problems(row: SnapshotRow) -> list[str]:
    """What the row's schema lets through but no verdict or trajectory may hold, by field."""
    problems = _verdict_problems(row)
    for name in ("trajectory", "primitives", "tools"):
        text = getattr(row, name)
        if text is not None:
            bad = _non_finite(json.loads(text), name)
            if bad:
                problems.append(f"{bad}: must be a finite number (NaN and infinity are not JSON)")
    messages = json.loads(row.trajectory)["messages"]
    problem = _messages_problem(messages, "trajectory.messages")
    if problem:
        problems.append(problem)
    # The builders copy tools into every example: an OpenAI tool is an object.
    tools = json.loads(row.tools) if row.tools is not None else []
    bad = next((i for i, tool in enumerate(tools) if not isinstance(tool, dict)), None)
    if bad is not None:
        problems.append(f"tools[{bad}]: must be an OpenAI tool object {{'type', 'function'}}")
    return problems


def _verdict_problems(row: SnapshotRow) -> list[str]:
    # The verifier's verdicts: score in [0, 1] (clamped there), outcome "passed" exactly when
    # passed is true, "failed" when false; an errored row has no verdict (passed is never true).
    score, problems = row.score, []
    if score is not None and not math.isfinite(score):
        problems.append(f"score: must be a finite number, got {score}")
    elif score is not None and not 0.0 <= score <= 1.0:
        problems.append(f"score: must be in [0, 1], got {score}")
    elif score is None and row.outcome != "errored":
        problems.append(f"score: missing; a {row.outcome} row has a score")
    if row.outcome == "errored":
        if row.passed:
            problems.append("passed: true contradicts outcome 'errored' (no verdict)")
    elif row.passed is None:
        problems.append(f"passed: missing; outcome {row.outcome!r} needs true or false")
    elif row.passed != (row.outcome == "passed"):
        problems.append(f"passed: {str(row.passed).lower()} contradicts outcome {row.outcome!r}")
    return problems


def _non_finite(value: Any, where: str) -> str | None:
    """The path of the first NaN or infinity in decoded JSON (json reads both), or None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else where
    # A loop, not recursion: any depth json.loads read is walked; a path is made only for
    # containers (token id lists hold many numbers).
    stack = [(where, value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, dict):
            entries: Iterable[tuple[Any, Any]] = item.items()
            step = ".{}"
        elif isinstance(item, list):
            entries, step = enumerate(item), "[{}]"
        else:
            continue
        for key, child in entries:
            if isinstance(child, float):
                if not math.isfinite(child):
                    return path + step.format(key)
            elif isinstance(child, dict | list):
                stack.append((path + step.format(key), child))
    return None


# What a trajectory's messages may be: the agent loop's and the model backends' chat (OpenAI's
# shape; ART imports add "developer"). Looser than a prompts file's (contracts/chat.py): a
# model may say nothing (content null) or write a call it could not name or give JSON for.
_ROLES = ("system", "developer", "user", "assistant", "tool")


def _messages_problem(messages: list[Any], where: str) -> str | None:
    """`where[i].field: why` for the first message the training-set builders cannot read."""
    for i, message in enumerate(messages):
        at = f"{where}[{i}]"
        if not isinstance(message, dict):
            return f"{at}: must be a chat message object {{'role': ..., 'content': ...}}"
        role = message.get("role")
        if role not in _ROLES:
            return f"{at}.role: must be one of {', '.join(_ROLES)}, got {role!r}"
        content = message.get("content")
        if not isinstance(content, str) and not (content is None and role == "assistant"):
            kind = "a string or null" if role == "assistant" else "a string"
            return f"{at}.content: must be {kind}, got {type(content).__name__}"
        calls = message.get("tool_calls")
        if calls is None:
            continue
        if not isinstance(calls, list):
            return f"{at}.tool_calls: must be a list of calls, got {type(calls).__name__}"
        if calls and role != "assistant":
            return f"{at}.tool_calls: only an assistant message calls tools"
        for j, call in enumerate(calls):
            problem = _call_problem(call, f"{at}.tool_calls[{j}]")
            if problem:
                return problem
    return None


def _call_problem(call: Any, where: str) -> str | None:
    """What keeps one tool call from being a call: OpenAI's {"id", "function": {...}} shape."""
    if not isinstance(call, dict):
        return f"{where}: must be a call {{'id': ..., 'function': {{'name', 'arguments'}}}}"
    if "id" in call and call["id"] is not None and not isinstance(call["id"], str):
        return f"{where}.id: must be a string"
    # The learner's builder also reads a flat {"name", "arguments"} call.
    function, at = (call["function"], f"{where}.function") if "function" in call else (call, where)
    if not isinstance(function, dict):
        return f"{at}: must be {{'name': str, 'arguments': str}}"
    # A call the model could not name is kept with an empty name (the loop answered it).
    if not isinstance(function.get("name"), str):
        return f"{at}.name: must be a string"
    arguments = function.get("arguments", "")
    if arguments is not None and not isinstance(arguments, str | dict):
        return f"{at}.arguments: must be JSON text or an object"
    return None


def rows_from_jsonl(data: bytes, where: str) -> list[SnapshotRow]:
    """Canonical JSONL back as checked rows; a bad line is a ValueError `where:LINE: why`."""
    rows: list[SnapshotRow] = []
    seen: set[str] = set()
    for number, obj in jsonl_objects(data, where):
        try:
            row = SnapshotRow.model_validate(obj)
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"]) or "(row)"
            raise ValueError(f"{where}:{number}: {field}: {first['msg']}") from None
        try:
            problems = row_problems(row)
        except RecursionError:  # a JSON text field nested thousands deep
            problems = ["a JSON text field is nested too deeply"]
        if problems:
            # Staged datasets were checked by the CLI; one written past it is refused here too.
            raise ValueError(f"{where}:{number}: {problems[0]}")
        if row.rollout_id in seen:
            raise ValueError(f"{where}:{number}: rollout {row.rollout_id} repeats")
        seen.add(row.rollout_id)
        rows.append(row)
    return rows
