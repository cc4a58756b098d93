"""`Environment` and `Task`: what a user writes in their env file."""

from __future__ import annotations

import contextvars
import copy
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from rollout.shared.contracts.envspec import EnvironmentSpec, TaskSpec, VerifierSpec
from rollout.shared.envs.coerce import as_spec, pydantic_problems
from rollout.shared.envs.validation import validate_environment
from rollout.shared.errors import RolloutError
from rollout.shared.jsonl import read_jsonl

# The directory of the env file being loaded: Task.from_jsonl resolves relative paths
# against it when they are not found from the working directory.
LOADING_DIR: contextvars.ContextVar[Path | None] = contextvars.ContextVar(
    "rollout_loading_dir", default=None
)

_TASK_KEYS = {
    "instruction",
    "hidden_ground_truth",
    "hiddenGroundTruth",
    "input",
    "split",
    "id",
    "metadata",
}


class Task(TaskSpec):
    """One task: `instruction` for the agent, `hidden_ground_truth` for the verifier only."""

    @classmethod
    def from_jsonl(cls, path: str | Path) -> list[Task]:
        """Read tasks from a JSONL file (snake_case or camelCase keys); errors name the line."""
        file = _find_file(Path(path))
        tasks: list[Task] = []
        for n, row in read_jsonl(file):
            unknown = sorted(set(row) - _TASK_KEYS)
            if unknown:
                raise RolloutError(
                    f"{file}:{n}: unknown key(s) {unknown}; "
                    f"expected {sorted(_TASK_KEYS - {'hiddenGroundTruth'})}"
                )
            try:
                tasks.append(cls.model_validate(row))
            except ValidationError as exc:
                first = exc.errors()[0]
                field = ".".join(str(p) for p in first["loc"]) or "line"
                raise RolloutError(f"{file}:{n}: {field}: {first['msg']}") from None
        return tasks


def _find_file(path: Path) -> Path:
    """The path as given, else relative to the env file being loaded (like `python file.py`)."""
    if path.exists():
        return path
    if not path.is_absolute():
        base = LOADING_DIR.get()
        if base is not None and (base / path).exists():
            return base / path
    raise RolloutError(f"{path}: no such file")


def _plain(value: Any) -> Any:
    """Pydantic models inside configs (e.g. tasks) become camelCase dicts."""
    if isinstance(value, BaseModel):
        # Python values, not their JSON dump: that would turn a NaN (in a ground truth, say)
        # into null unseen; validation names what JSON cannot carry, by path.
        return _plain(value.model_dump(by_alias=True, exclude_none=True))
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


class Environment:
    """An agent environment: a template, its config, tasks and (optionally) a verifier.

    For the `sql` template, `schema` and `seed` may be given directly instead of in `config`;
    for plugin environments, `entrypoint="module.path:function"`.
    """

    def __init__(
        self,
        slug: str,
        name: str | None = None,
        template: str = "workflow",
        description: str = "",
        config: Mapping[str, Any] | None = None,
        tasks: Iterable[Task | Mapping[str, Any]] | None = None,
        verifier: Any = None,
        *,
        schema: str | None = None,
        seed: str | None = None,
        entrypoint: str | None = None,
        budgets: Mapping[str, Any] | None = None,
    ) -> None:
        self.slug = slug
        self.name = name if name is not None else slug
        self.template = template
        self.description = description
        # A non-mapping config is kept as given so validation can report it by path.
        self.config: Any = dict(config) if isinstance(config, Mapping) else config
        if self.config is None:
            self.config = {}
        if isinstance(self.config, dict):
            if schema is not None:
                self.config["schema"] = schema
            if seed is not None:
                self.config["seed"] = seed
            if entrypoint is not None:
                self.config["entrypoint"] = entrypoint
        # Tasks that are no list (tasks=5) are kept as given so validation names them by path.
        self.tasks: Any = [] if tasks is None else tasks
        # A lone Task is iterable too (its fields): kept as given, validation names it.
        if isinstance(tasks, Iterable) and not isinstance(tasks, str | bytes | Mapping | BaseModel):
            self.tasks = list(tasks)
        self.verifier = verifier
        # Per-rollout limits of this env (max_turn_tokens, max_rollout_tokens,
        # max_rollout_seconds, max_repeated_calls); unset ones are the platform's.
        self.budgets = budgets

    def __repr__(self) -> str:
        return (
            f"Environment(slug={self.slug!r}, template={self.template!r}, "
            f"tasks={len(self.tasks) if isinstance(self.tasks, list) else '?'})"
        )

    def to_raw(self) -> dict[str, Any]:
        """The camelCase dict form, not validated (what validation and push start from)."""
        raw: dict[str, Any] = {
            "slug": self.slug,
            "name": self.name,
            "template": self.template,
            "description": self.description,
            "config": _plain(copy.deepcopy(self.config)),
            "tasks": _plain(self.tasks) if isinstance(self.tasks, list | tuple) else self.tasks,
        }
        if self.verifier is not None:
            raw["verifier"] = _plain(self.verifier)
        if self.budgets is not None:
            raw["budgets"] = _plain(self.budgets)
        return raw

    def to_spec(self) -> EnvironmentSpec:
        """The validated spec (RolloutError listing every structural problem otherwise)."""
        return as_spec(self)

    def to_dict(self) -> dict[str, Any]:
        """The serialised payload with the seed's camelCase keys."""
        return self.to_spec().to_json_dict()

    def to_json(self) -> str:
        """The canonical JSON of the spec."""
        return self.to_spec().canonical_json()

    def spec_hash(self) -> str:
        """sha256 of the canonical JSON spec."""
        return self.to_spec().spec_hash()

    def validate(self) -> list[str]:
        """Every problem with this environment, each naming its path (empty when valid)."""
        return validate_environment(self)

    @classmethod
    def from_spec(cls, spec: EnvironmentSpec | Mapping[str, Any]) -> Environment:
        """Rebuild an Environment from a spec or its camelCase dict."""
        if not isinstance(spec, EnvironmentSpec):
            try:
                spec = EnvironmentSpec.model_validate(dict(spec))
            except ValidationError as exc:
                raise RolloutError(
                    "invalid environment spec", problems=pydantic_problems(exc)
                ) from None
        verifier: VerifierSpec | None = spec.verifier
        return cls(
            slug=spec.slug,
            name=spec.name,
            template=spec.template,
            description=spec.description,
            config=copy.deepcopy(spec.config),
            tasks=[Task.model_validate(t.model_dump()) for t in spec.tasks],
            verifier=verifier.model_dump(mode="json", by_alias=True) if verifier else None,
            budgets=spec.budgets.model_dump(exclude_none=True) if spec.budgets else None,
        )
