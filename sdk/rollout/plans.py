"""Experiment plans: load a TOML file, validate all of it, pin it, hash it; fold its events.

`check_plan` reports every problem as `path: message` (the path as written in the file:
`stages[2].train.config.clip_range`, `envs.refunds.ref`), resolving environment refs against
the registry and trained model names against the object store when they can be reached.
A valid plan's canonical form (sorted-keys JSON of the validated model, each environment pinned
to the version and spec hash it resolved to) is what its sha256 is taken of: the same file
against the same registry is the same plan, and `rollout run --config` resumes it by that hash.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pydantic

from rollout.environment import split_check
from rollout.errors import RolloutError
from rollout.shared import subjects
from rollout.shared.aggregates.run_options import MAX_ROLLOUTS
from rollout.shared.bus.reader import read_events
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.contracts.plan import (
    STAGE_KINDS,
    CheckpointPolicy,
    EnvEntry,
    ExperimentPlan,
    Resources,
    RunStage,
    Stage,
)
from rollout.shared.contracts.training import (
    METHOD_ALIASES,
    _message,
    config_error_lines,
    parse_config,
    resolve_method,
    validate_strict,
)
from rollout.shared.envs import load_environments, select_environment, validate_environment
from rollout.shared.envs.splits import ids_matter
from rollout.shared.envs.verifiers.reward_model import not_a_reward_model, resolve
from rollout.shared.learning import methods
from rollout.shared.models.catalog import (
    backend_forms,
    has_backend_form,
    local_model,
    local_model_names,
)
from rollout.shared.models.names import check_suffix, split_trained_name
from rollout.shared.models.trained import find_trained

# Event types of the plan aggregate, in the order a plan emits them.
PLAN_STARTED = "plan.started"
STAGE_STARTED = "plan.stage_started"
STAGE_COMPLETED = "plan.stage_completed"
STAGE_FAILED = "plan.stage_failed"
PLAN_COMPLETED = "plan.completed"
PLAN_FAILED = "plan.failed"
RUN_KINDS = ("run", "evaluate")


@dataclass
class PlanCheck:
    """What validating a plan file found: the plan (when it parsed), problems, pins, hash."""

    path: str
    plan: ExperimentPlan | None = None
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # What is probably a mistake but may be meant (e.g. scoring a trained model on every
    # split): shown by path with the plan, never blocking it.
    warnings: list[str] = field(default_factory=list)
    # env name -> {"slug", "version" (None: pushed when run), "specHash", "source"}
    envs: dict[str, dict[str, Any]] = field(default_factory=dict)
    canonical: dict[str, Any] | None = None
    hash: str | None = None
    # Names of envs and stages that are themselves invalid: references to them are not
    # reported again.
    unchecked: set[str] = field(default_factory=set)
    # stage name -> its fields left out for being wrong (their defaults in their place): what
    # depends on them (sizes, splits, what a model learned from) is not judged.
    repaired: dict[str, set[str]] = field(default_factory=dict)
    # env name -> the splits its tasks have (when its spec could be read)
    splits: dict[str, set[str]] = field(default_factory=dict)
    # env name -> each task's split, in order (None: no split), to size its runs
    task_splits: dict[str, list[str | None]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when there is nothing to fix."""
        return not self.problems and self.plan is not None

    @property
    def plan_id(self) -> str:
        """The id of this plan's aggregate: its name and the first 16 hex digits of its hash."""
        assert self.plan is not None and self.hash is not None
        return f"{self.plan.name}-{self.hash[:16]}"

    def to_json(self) -> dict[str, Any]:
        """The document `rollout plan --json` prints."""
        doc: dict[str, Any] = {"ok": self.ok, "file": self.path, "problems": self.problems}
        if self.notes:
            doc["notes"] = self.notes
        if self.warnings:
            doc["warnings"] = self.warnings
        if self.ok:
            doc |= {"planId": self.plan_id, "hash": self.hash, "plan": self.canonical}
        return doc


def error_path(loc: tuple[Any, ...]) -> str:
    """A pydantic error location as written in TOML: `stages[2].train.config`."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def structure_problems(errors: list[Any], prefix: str = "") -> list[str]:
    """pydantic's errors as `path: message` lines (a model check names its own field first)."""
    problems = []
    for err in errors:
        # A stage's kinds are tried one by one: the first field error is the useful one.
        path = error_path(tuple(err["loc"]))
        if prefix:
            path = f"{prefix}.{path}" if path else prefix
        message = _nan_message(err) or _SHAPES.get(err.get("type", "")) or _message(err)
        if err.get("type") == "value_error" and ": " in message:
            head, rest = message.split(": ", 1)
            if head.isidentifier():
                path, message = (f"{path}.{head}" if path else head), rest
        problems.append(f"{path}: {message}")
    return problems


# What a value of the wrong shape should have been, in TOML's words (pydantic says
# "Input should be a valid dictionary or instance of Resources").
_SHAPES = {
    "dict_type": "must be a table",
    "model_type": "must be a table",
    "model_attributes_type": "must be a table",
    "list_type": "must be a list",
    "string_too_short": "must not be empty",
}


def _nan_message(err: Any) -> str | None:
    """`not a number` for a NaN input (its range check would say `must be <= 2` otherwise)."""
    value = err.get("input")
    return "not a number (nan)" if isinstance(value, float) and math.isnan(value) else None


def read_plan_file(path: str | Path) -> tuple[dict[str, Any] | None, list[str]]:
    """The TOML document, or the problem that kept it from being read (syntax: with its line)."""
    file = Path(path)
    try:
        data = file.read_bytes()
    except OSError as exc:
        return None, [f"{path}: cannot read the plan: {exc.strerror or exc}"]
    try:
        # utf-8-sig: a byte-order mark (what some Windows editors write first) is dropped.
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        byte = data[exc.start]
        return None, [f"{path}: not UTF-8 text (byte 0x{byte:02x} at offset {exc.start})"]
    try:
        return tomllib.loads(text), []
    except tomllib.TOMLDecodeError as exc:
        return None, [f"{path}: TOML syntax error: {exc}"]


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> list[str]:
    """Replace models of `[models]` by `NAME=MODEL` overrides (e.g. a local model dir in tests)."""
    problems = []
    models = data.get("models", {})
    if not isinstance(models, dict):
        return ["models: must be a table"] if overrides else []
    # The names the file has: an override of a name it lacks (a typo) would add a model no
    # stage uses, and the plan would run the model it was meant to replace.
    names = [str(k) for k in models]
    for item in overrides:
        name, sep, model = item.partition("=")
        if not sep or not name.strip() or not model.strip():
            problems.append(f"--with {item!r}: expected NAME=MODEL")
            continue
        if name.strip() not in names:
            problems.append(
                f"--with {name.strip()!r}: the plan has no model {name.strip()!r} "
                f"(models: {', '.join(names) or 'none'})"
            )
            continue
        models[name.strip()] = model.strip()
    return problems


def _pin_model_dirs(data: dict[str, Any]) -> None:
    """`hf:DIR` / `vllm:DIR` models relative to the current folder, where they are checked, as
    absolute paths: the actors load them from their own working folder, where `./ckpt` names
    nothing (the plan checked, then its first stage was refused)."""
    models = data.get("models")
    if not isinstance(models, dict):
        return
    for key, name in models.items():
        prefix = next(
            (p for p in ("hf:", "vllm:") if isinstance(name, str) and name.startswith(p)), None
        )
        if prefix is None:
            continue
        folder = Path(name[len(prefix) :].strip())
        if folder.parts and not folder.is_absolute() and folder.is_dir():
            models[key] = f"{prefix}{folder.resolve()}"


async def check_plan(
    path: str | Path, *, client: Any = None, overrides: list[str] | None = None
) -> PlanCheck:
    """Validate a plan file; with `client`, env refs are resolved against its registry."""
    data, problems = read_plan_file(path)
    if data is None:
        return PlanCheck(str(path), problems=problems)
    return await check_plan_data(data, path, client=client, overrides=overrides)


async def check_plan_data(
    data: dict[str, Any],
    path: str | Path,
    *,
    client: Any = None,
    overrides: list[str] | None = None,
) -> PlanCheck:
    """Validate a plan already read (`path`: where its relative env files are found)."""
    check = PlanCheck(str(path))
    check.problems += apply_overrides(data, overrides or [])
    _pin_model_dirs(data)
    # Strict: TOML's values have their own types, and a `seed = true` or an `n = "4"` is a
    # mistake to name, not one to run as seed 1 or 4.
    valid, errors, repaired, dropped = validate_every_part(data)
    if valid is None:
        # Every problem, not just the first section's: the parts that are valid are still
        # checked against each other (and the registry) below.
        check.problems += structure_problems(errors)
        plan = _salvage(repaired, check, names=data)
    else:
        plan = check.plan = valid
    check.repaired = _repaired_stages(data, dropped)
    before = len(check.problems)
    base = Path(path).parent
    _check_stages(plan, check)
    _check_models(plan, check)
    _check_resources(plan, check)
    await _check_reward_models(plan, check)
    await _check_envs(plan, base, check, client)
    _check_splits(plan, check)
    _check_run_sizes(plan, check)
    _check_compares(plan, check)
    _check_held_out(plan, check)
    # A value found wrong was left out to check the rest: what its absence would say
    # (`from: required`) is not another problem of the plan.
    check.problems[before:] = [p for p in check.problems[before:] if not _under(p, dropped)]
    check.warnings = [w for w in check.warnings if not _under(w, dropped)]
    if check.problems:
        check.plan = None
    else:
        check.canonical = canonical_plan(plan, check.envs)
        check.hash = plan_hash(check.canonical)
    return check


# How many times a plan is validated again without the values already found wrong: the model
# checks of a table (exactly one kind, one source) run only once its fields parse.
_PASSES = 4


def validate_every_part(
    data: dict[str, Any],
) -> tuple[ExperimentPlan | None, list[Any], dict[str, Any], list[str]]:
    """(plan, errors, the document without the wrong values, their TOML paths).

    pydantic skips a table's own checks while a field of it is wrong: a plan with a typo in a
    stage and that stage's two kinds said the typo only, and the next run said the other. So
    the values found wrong are left out and the rest validated again, until nothing new.
    """
    work = copy.deepcopy(data)
    errors: list[Any] = []
    dropped: list[tuple[Any, ...]] = []
    # Known fields left out (not unknown keys): a table missing one of them would be judged
    # on what the user did not write, so its own checks are not reported.
    emptied: set[tuple[Any, ...]] = set()
    seen: set[tuple[Any, ...]] = set()
    for _ in range(_PASSES):
        valid, found = validate_strict(ExperimentPlan.model_validate, work)
        new = [
            e for e in found
            if not _dropped_here(tuple(e["loc"]), dropped, emptied)
            and (tuple(e["loc"]), e.get("type")) not in seen
        ]  # fmt: skip
        seen |= {(tuple(e["loc"]), e.get("type")) for e in new}
        errors += new
        if valid is not None or not new:
            return (valid if not errors else None), errors, work, [error_path(d) for d in dropped]
        progress = False
        for err in new:
            loc = tuple(err["loc"])
            if err.get("type") == "value_error" or not loc or isinstance(loc[-1], int):
                continue  # a table's own check, or a list entry (its index must stay)
            if _drop(work, loc):
                dropped.append(loc)
                if err.get("type") != "extra_forbidden":
                    emptied.add(loc[:-1])
                progress = True
        if not progress:
            break
    return None, errors, work, [error_path(d) for d in dropped]


def _dropped_here(
    loc: tuple[Any, ...], dropped: list[tuple[Any, ...]], emptied: set[tuple[Any, ...]]
) -> bool:
    """True when an error is about a value already left out, or its table lost a field."""
    if any(loc[: len(d)] == d for d in dropped):
        return True
    # A table check (value_error at the table) of a table whose field was left out.
    return loc in emptied


def _drop(doc: Any, loc: tuple[Any, ...]) -> bool:
    """Remove the value at `loc` from the document; False when it is not there."""
    for part in loc[:-1]:
        if isinstance(doc, dict) and part in doc:
            doc = doc[part]
        elif isinstance(doc, list) and isinstance(part, int) and 0 <= part < len(doc):
            doc = doc[part]
        else:
            return False
    if isinstance(doc, dict) and loc[-1] in doc:
        del doc[loc[-1]]
        return True
    return False


def _under(line: str, paths: list[str]) -> bool:
    """True when a `path: message` line is about one of `paths` (or a value inside one)."""
    where = line.split(": ", 1)[0]
    return any(where == p or where.startswith((f"{p}.", f"{p}[")) for p in paths)


def _repaired_stages(data: dict[str, Any], dropped: list[str]) -> dict[str, set[str]]:
    """stage name -> the fields of its kind left out for being wrong (`n`, `split`, ...)."""
    stages = data.get("stages") if isinstance(data.get("stages"), list) else []
    out: dict[str, set[str]] = {}
    for i, stage in enumerate(stages):
        for kind in STAGE_KINDS:
            head = f"stages[{i}].{kind}."
            fields = {
                p[len(head) :].split(".")[0].split("[")[0] for p in dropped if p.startswith(head)
            }
            if isinstance(stage, dict) and fields:
                out.setdefault(str(stage.get("name")), set()).update(fields)
    return out


def _repaired(check: PlanCheck, names: list[Any], fields: set[str]) -> bool:
    """True when a stage of `names` was checked without one of `fields` (its default in its
    place): what depends on them would judge what the user did not write."""
    return any(isinstance(n, str) and check.repaired.get(n, set()) & fields for n in names)


def _salvage(
    data: dict[str, Any], check: PlanCheck, names: dict[str, Any] | None = None
) -> ExperimentPlan:
    """The valid parts of an invalid plan (invalid stages as None), to check them further;
    the invalid ones' names as `names` (the document as written) gives them."""

    def part(model: type[pydantic.BaseModel], value: Any) -> Any:
        return validate_strict(model.model_validate, value)[0]

    raw_envs = data.get("envs") if isinstance(data.get("envs"), dict) else {}
    raw_stages = data.get("stages") if isinstance(data.get("stages"), list) else []
    raw_models = data.get("models") if isinstance(data.get("models"), dict) else {}
    stages = [part(Stage, s) for s in raw_stages]
    # Names as written: an entry left out for being wrong is not "no such env" to its users.
    original = names or data
    written_envs = original.get("envs") if isinstance(original.get("envs"), dict) else {}
    written_models = original.get("models") if isinstance(original.get("models"), dict) else {}
    check.unchecked = {str(k) for k, v in written_envs.items() if part(EnvEntry, v) is None}
    check.unchecked |= {str(k) for k, v in written_models.items() if not isinstance(v, str)}
    written = original.get("stages")
    written = (
        written if isinstance(written, list) and len(written) == len(raw_stages) else raw_stages
    )
    check.unchecked |= {
        str(s.get("name")) for s, ok in zip(written, stages, strict=True)
        if ok is None and isinstance(s, dict)
    }  # fmt: skip
    # A section that is no table (or missing) was reported itself: the stages naming its
    # entries are not told each that it lacks them.
    for section, fields in (("envs", ("env",)), ("models", ("model",))):
        if not isinstance(original.get(section), dict):
            check.unchecked |= _named_in(written, fields)
    return ExperimentPlan.model_construct(
        name=str(data.get("name") or "plan"),
        seed=0,
        envs={k: e for k, v in raw_envs.items() if (e := part(EnvEntry, v)) is not None},
        models={k: v for k, v in raw_models.items() if isinstance(v, str)},
        resources=part(Resources, data.get("resources", {})) or Resources(),
        checkpoints=part(CheckpointPolicy, data.get("checkpoints", {})) or CheckpointPolicy(),
        stages=stages,
    )


def _named_in(stages: list[Any], fields: tuple[str, ...]) -> set[str]:
    """The names the stages' kinds give in `fields` (`env`, `model`), as written."""
    out = set()
    for stage in stages:
        for kind in STAGE_KINDS:
            spec = stage.get(kind) if isinstance(stage, dict) else None
            if isinstance(spec, dict):
                out |= {spec[f] for f in fields if isinstance(spec.get(f), str)}
    return out


# --- references between stages --------------------------------------------------------------


def _earlier(plan: ExperimentPlan, index: int) -> dict[str, Stage]:
    return {s.name: s for s in plan.stages[:index] if s is not None}


def _stage_ref(
    plan: ExperimentPlan, index: int, name: str, kinds: tuple[str, ...], what: str
) -> str | None:
    """Why `name` is not an earlier stage of one of `kinds`, or None when it is."""
    earlier = _earlier(plan, index)
    later = {s.name for s in plan.stages[index + 1 :] if s is not None}
    this = plan.stages[index]
    if this is not None and name == this.name and name not in earlier:
        return f"refers to its own stage {name!r}: a stage may only use earlier stages"
    if name in earlier:
        kind = earlier[name].kind
        return None if kind in kinds else f"stage {name!r} is a {kind} stage, not a {what} stage"
    if name in later:
        return f"stage {name!r} comes later: a stage may only use earlier stages"
    have = [s.name for s in earlier.values() if s.kind in kinds]
    return f"no earlier {what} stage {name!r} (have {', '.join(have) or 'none'})"


def _model_ref(plan: ExperimentPlan, index: int, name: str) -> str | None:
    """Why `name` is neither a model of [models] nor an earlier train stage, or None."""
    if name in plan.models:
        return None
    problem = _stage_ref(plan, index, name, ("train",), "train")
    if problem is None:
        return None
    models = ", ".join(plan.models) or "none"
    return f"{problem}; nor a model of [models] (have {models})"


def _env_ref(plan: ExperimentPlan, name: str) -> str | None:
    if name in plan.envs:
        return None
    return f"no environment {name!r} in [envs] (have {', '.join(plan.envs) or 'none'})"


def _check_stages(plan: ExperimentPlan, check: PlanCheck) -> None:
    seen: dict[str, int] = {}
    for i, stage in enumerate(plan.stages):
        if stage is None:
            continue
        if stage.name in seen:
            check.problems.append(
                f"stages[{i}].name: {stage.name!r} is already the name of stages[{seen[stage.name]}]"
            )
        seen.setdefault(stage.name, i)
        where = f"stages[{i}].{stage.kind}"
        if stage.run or stage.evaluate:
            spec = stage.run or stage.evaluate
            assert spec is not None
            _add(check, f"{where}.env", _env_ref(plan, spec.env), spec.env)
            _add(check, f"{where}.model", _model_ref(plan, i, spec.model), spec.model)
        elif stage.compare:
            for key in ("base", "other"):
                ref = getattr(stage.compare, key)
                _add(
                    check,
                    f"{where}.{key}",
                    _stage_ref(plan, i, ref, RUN_KINDS, "run/evaluate"),
                    ref,
                )
            if stage.compare.base == stage.compare.other:
                check.problems.append(f"{where}.other: compares {stage.compare.base!r} with itself")
        elif stage.train:
            _check_train(plan, i, check)


def _check_train(plan: ExperimentPlan, i: int, check: PlanCheck) -> None:
    train = plan.stages[i].train
    assert train is not None
    where = f"stages[{i}].train"
    _add(check, f"{where}.model", _model_ref(plan, i, train.model), train.model)
    if train.suffix is not None:
        _add(check, f"{where}.suffix", check_suffix(train.suffix))
    if train.method not in methods.TABLE and train.method not in METHOD_ALIASES:
        check.problems.append(
            f"{where}.method: must be one of {methods.known()} (got {train.method!r})"
        )
        return
    method, config = resolve_method(train.method, dict(train.config))
    reward_model = config.get("reward_model")
    names = {s.name for s in plan.stages if s is not None}
    if isinstance(reward_model, str) and reward_model in check.unchecked:
        pass
    elif isinstance(reward_model, str) and reward_model in names:
        _add(
            check,
            f"{where}.config.reward_model",
            _stage_ref(plan, i, reward_model, ("train",), "train"),
        )
        earlier = _earlier(plan, i).get(reward_model)
        if earlier is not None and earlier.train is not None:
            their = resolve_method(earlier.train.method, {})[0]
            if their != "rm":
                check.problems.append(
                    f"{where}.config.reward_model: stage {reward_model!r} trains {their}, not a "
                    "reward model (method rm)"
                )
    teacher = config.get("teacher")
    if isinstance(teacher, str) and teacher in names and teacher not in plan.models:
        _add(check, f"{where}.config.teacher", _stage_ref(plan, i, teacher, ("train",), "train"))
        earlier = _earlier(plan, i).get(teacher)
        if earlier is not None and earlier.train is not None:
            if resolve_method(earlier.train.method, {})[0] == "rm":
                check.problems.append(
                    f"{where}.config.teacher: stage {teacher!r} trains a reward model, not a "
                    "policy to distil"
                )
    if "method" in config:
        check.problems.append(f"{where}.config.method: set the method as `method` of the stage")
        config.pop("method")
    _, errors = validate_strict(parse_config, {**config, "method": method})
    # One line per error, in order: a NaN's line says so rather than its range.
    for line, err in zip(config_error_lines(errors, f"{where}.config"), errors, strict=True):
        nan = _nan_message(err)
        check.problems.append(f"{line.split(': ', 1)[0]}: {nan}" if nan else line)
    if methods.get(method).data != "sft":
        # Both pick among passing rollouts: the methods that learn from failures too see all.
        for key, given in (
            ("passing", train.passing),
            ("skip_without_data", train.skip_without_data),
        ):
            if given:
                check.problems.append(
                    f"{where}.{key}: only for methods that train on passing rollouts "
                    f"({', '.join(m for m in methods.TABLE if methods.get(m).data == 'sft')})"
                )
    if methods.get(method).online:
        if train.env is None:
            check.problems.append(f"{where}.env: required for {method} (it trains online)")
        else:
            _add(check, f"{where}.env", _env_ref(plan, train.env), train.env)
        if train.from_ is not None:
            check.problems.append(
                f"{where}.from: {method} trains online on `env`, not on a run's rollouts"
            )
    else:
        if train.from_ is None:
            check.problems.append(f"{where}.from: required for {method} (a run or evaluate stage)")
        else:
            _add(
                check,
                f"{where}.from",
                _stage_ref(plan, i, train.from_, RUN_KINDS, "run/evaluate"),
                train.from_,
            )
        if train.env is not None:
            check.problems.append(f"{where}.env: only for online methods (grpo, ppo)")


def _add(check: PlanCheck, path: str, problem: str | None, ref: str | None = None) -> None:
    # A reference to an env or stage that is itself invalid was reported there already.
    if problem is not None and (ref is None or ref not in check.unchecked):
        check.problems.append(f"{path}: {problem}")


# --- models, resources, reward models -----------------------------------------------------------


def _check_models(plan: ExperimentPlan, check: PlanCheck) -> None:
    for key, name in plan.models.items():
        where = f"models.{key}"
        if not name.strip():
            check.problems.append(f"{where}: empty model name")
        elif name.startswith("local/") and local_model(name) is None and ":" not in name:
            known = ", ".join(local_model_names())
            if name not in ("local/scripted",):
                check.problems.append(f"{where}: unknown local model {name!r} (known: {known})")
        elif name.startswith("hf:") and ":" not in name[3:] and not Path(name[3:]).is_dir():
            check.problems.append(f"{where}: no model folder {name[3:]!r}")
        elif split_trained_name(name) is not None and not name.startswith(("http", "openai/")):
            if find_trained(name) is None:
                check.problems.append(
                    f"{where}: no trained model {name!r} (see `rollout jobs` for trained names)"
                )
        elif not has_backend_form(name):
            # What every run would refuse when its stage starts (the tracker's form check),
            # found by the name's form alone: no weights are loaded and no endpoint is asked.
            valid = "; ".join(f"{f.prefix}... (e.g. {f.example})" for f in backend_forms())
            check.problems.append(f"{where}: unknown model {name!r}: valid forms are {valid}")


def _check_resources(plan: ExperimentPlan, check: PlanCheck) -> None:
    if plan.resources.devices == "cuda":
        import torch

        if not torch.cuda.is_available():
            check.problems.append("resources.devices: cuda asked for, but no GPU is visible here")


async def _check_reward_models(plan: ExperimentPlan, check: PlanCheck) -> None:
    """A `reward_model` that names no stage must be a published reward model."""
    stage_names = {s.name for s in plan.stages if s is not None} | check.unchecked
    for i, stage in enumerate(plan.stages):
        name = stage.train.config.get("reward_model") if stage and stage.train else None
        if not isinstance(name, str) or not name or name in stage_names:
            continue
        where = f"stages[{i}].train.config.reward_model"
        try:
            _, path = await resolve(name)
        except RolloutError as exc:
            check.problems.append(f"{where}: {exc.message}")
            continue
        except OSError as exc:
            check.problems.append(f"{where}: could not fetch {name!r}: {exc}")
            continue
        _add(check, where, not_a_reward_model(name, path))


# --- environments -------------------------------------------------------------------------------


def parse_env_ref(ref: str) -> tuple[str, int | None] | str:
    """(slug, version or None) of `slug[@version]`, or the problem with it."""
    slug, sep, version = ref.partition("@")
    try:
        subjects.token(slug, "environment slug")
    except subjects.SubjectError as exc:
        return str(exc)
    if not sep:
        return slug, None
    if not version.isdigit() or int(version) < 1:
        return f"version {version!r} must be a whole number >= 1 (slug@version)"
    return slug, int(version)


async def _check_envs(plan: ExperimentPlan, base: Path, check: PlanCheck, client: Any) -> None:
    reached = client is not None
    for key, entry in plan.envs.items():
        where = f"envs.{key}"
        if entry.file is not None:
            file = base / entry.file
            try:
                envs = select_environment(load_environments(file), entry.slug)
            except RolloutError as exc:
                check.problems.append(f"{where}.file: {exc.message}")
                check.problems += [f"{where}.file: {p}" for p in exc.problems]
                continue
            if len(envs) != 1:
                slugs = ", ".join(e.slug for e in envs)
                check.problems.append(f"{where}.slug: {entry.file} defines {slugs}: pick one")
                continue
            env = envs[0]
            # validate_environment holds the split problems; the near misses are warnings.
            tasks = env.tasks if isinstance(env.tasks, list) else []
            warnings = split_check(tasks, ids_matter=ids_matter(env.template))[1]
            problems = validate_environment(env)
            check.problems += [f"{where}.file: {env.slug}: {p}" for p in problems]
            check.warnings += [f"{where}.file: {env.slug}: {w}" for w in warnings]
            if not problems:
                spec = env.to_spec()
                check.splits[key] = {t.split for t in spec.tasks if t.split}
                check.task_splits[key] = [t.split for t in spec.tasks]
                check.envs[key] = {
                    "source": "file",
                    "slug": spec.slug,
                    "version": None,
                    "specHash": spec.spec_hash(),
                }
            continue
        parsed = parse_env_ref(entry.ref or "")
        if isinstance(parsed, str):
            check.problems.append(f"{where}.ref: {parsed}")
            continue
        slug, version = parsed
        pin: dict[str, Any] = {"source": "registry", "slug": slug, "version": version}
        if not reached:
            pin["specHash"] = None
            check.envs[key] = pin
            continue
        try:
            found = await client.get_environment(slug, version)
        except RolloutError as exc:
            check.problems.append(f"{where}.ref: {await _missing_env(client, slug, version, exc)}")
            continue
        pin |= {"version": found["version"], "specHash": found["spec_hash"]}
        tasks = (found.get("spec") or {}).get("tasks") or []
        # A version pushed before these checks existed is held to them too.
        spec = found.get("spec") or {}
        problems, warnings = split_check(tasks, ids_matter=ids_matter(spec.get("template")))
        check.problems += [f"{where}.ref: {slug} v{found['version']}: {p}" for p in problems]
        check.warnings += [f"{where}.ref: {slug} v{found['version']}: {w}" for w in warnings]
        check.splits[key] = {t["split"] for t in tasks if t.get("split")}
        check.task_splits[key] = [t.get("split") for t in tasks]
        check.envs[key] = pin
    if not reached and any(e.ref for e in plan.envs.values()):
        check.notes.append(
            "no stack reachable: environment refs were not resolved (the plan is pinned when "
            "`rollout run --config` resolves them)"
        )


def _check_splits(plan: ExperimentPlan, check: PlanCheck) -> None:
    """A run or evaluate on a split its environment has no tasks of would score nothing."""
    for i, stage in enumerate(plan.stages):
        spec = (stage.run or stage.evaluate) if stage is not None else None
        if spec is None or spec.split is None or spec.env not in check.splits:
            continue
        have = check.splits[spec.env]
        if spec.split not in have:
            check.problems.append(
                f"stages[{i}].{stage.kind}.split: {check.envs[spec.env]['slug']} has no "
                f"{spec.split!r} tasks (splits: {', '.join(sorted(have)) or 'none'})"
            )


def _check_run_sizes(plan: ExperimentPlan, check: PlanCheck) -> None:
    """A run over the tracker's cap (tasks x n) is refused when its stage starts."""
    for i, stage in enumerate(plan.stages):
        spec = (stage.run or stage.evaluate) if stage is not None else None
        if spec is None or spec.env not in check.task_splits:
            continue
        if _repaired(check, [stage.name], {"n", "split"}):
            continue
        splits = check.task_splits[spec.env]
        tasks = sum(1 for split in splits if spec.split is None or split == spec.split)
        if tasks * spec.n > MAX_ROLLOUTS:
            check.problems.append(
                f"stages[{i}].{stage.kind}.n: {tasks} task(s) x {spec.n} = {tasks * spec.n:,} "
                f"rollouts, over the {MAX_ROLLOUTS:,} one run may ask for; lower n, pick a "
                "split, or spread them over several stages"
            )


def _not_registered(exc: RolloutError, slug: str) -> bool:
    """True when the registry answered that `slug` (or the version asked for) does not exist.

    Its replies carry no error code: this is the message of env_registry's `_registered`,
    `no [version N of ]environment 'slug'; push it ...`.
    """
    head = exc.message.split(";", 1)[0]
    return head.startswith("no ") and head.endswith(f"environment {slug!r}")


def _lookup_failed(slug: str, version: int | None, exc: RolloutError) -> str:
    """A registry that could not answer (down, timed out, refused): its error, not a verdict."""
    ref = f"{slug}@{version}" if version is not None else slug
    return f"could not look up {ref} in the registry: " + "; ".join([exc.message, *exc.problems])


async def _missing_env(client: Any, slug: str, version: int | None, exc: RolloutError) -> str:
    """What to say when the registry did not give `slug` (at `version`): why, in its terms."""
    absent = f"no environment {slug!r} in the registry (push it, or give a `file`)"
    if not _not_registered(exc, slug):
        return _lookup_failed(slug, version, exc)
    if version is None:
        return absent
    try:
        newest = await client.get_environment(slug)
    except RolloutError as again:
        return absent if _not_registered(again, slug) else _lookup_failed(slug, None, again)
    have = newest["version"]
    listed = ", ".join(map(str, range(1, have + 1))) if have <= 8 else f"1..{have}"
    return f"no version {version} of {slug} (have {listed})"


# --- what a compare or a score measures ---------------------------------------------------------


def _env_id(check: PlanCheck, key: str) -> str:
    """The environment a plan's env name stands for: its slug when known (two names may pin
    the same env), else the name."""
    pin = check.envs.get(key)
    return str(pin["slug"]) if pin else key


def _tasks_of(check: PlanCheck, spec: RunStage) -> str:
    """`the test tasks of support-refunds`, or every task of it when no split is given."""
    env = _env_id(check, spec.env)
    return f"the {spec.split} tasks of {env}" if spec.split else f"every task of {env}"


def _check_compares(plan: ExperimentPlan, check: PlanCheck) -> None:
    """A compare pairs task i of one run with task i of the other: the same tasks, or nothing."""
    for i, stage in enumerate(plan.stages):
        if stage is None or stage.compare is None:
            continue
        earlier = _earlier(plan, i)
        base, other = earlier.get(stage.compare.base), earlier.get(stage.compare.other)
        a = (base.run or base.evaluate) if base is not None else None
        b = (other.run or other.evaluate) if other is not None else None
        if a is None or b is None or base is other:
            continue  # reported by the reference checks
        if _repaired(check, [stage.name, base.name, other.name], {"split"}):
            continue  # a split left out for being wrong is not "every task"
        if a.env not in plan.envs or b.env not in plan.envs:
            continue  # an env the plan lacks: reported by the reference checks
        where = f"stages[{i}].compare.other"
        names = f"{other.name!r} scores {_tasks_of(check, b)}, {base.name!r} {_tasks_of(check, a)}"
        if _env_id(check, a.env) != _env_id(check, b.env):
            check.problems.append(
                f"{where}: {names}: a compare of two environments pairs unrelated tasks; "
                "compare stages run on the same environment"
            )
        elif a.split != b.split:
            # Meant sometimes (a model's train vs test pass rate), so said, not refused.
            check.warnings.append(
                f"{where}: {names}: the pass rates are of different tasks, and so are its "
                "per-task deltas (a gap between splits, not the effect of a change)"
            )
        elif a.env != b.env and check.envs.get(a.env) != check.envs.get(b.env):
            check.warnings.append(
                f"{where}: {names}, through envs.{b.env} and envs.{a.env}, which pin different "
                "versions: task i of one need not be task i of the other"
            )


@dataclass(frozen=True)
class _Learned:
    """Tasks a trained model has learned from: an env's split (None: every task of it)."""

    env: str
    split: str | None
    # In words: which train stage learned them, and from where.
    how: str


def _learned(
    plan: ExperimentPlan, i: int, check: PlanCheck, known: dict[str, list[_Learned]]
) -> list[_Learned]:
    """What stage i's model learned from: its own data, and what its base, teacher or reward
    model had learned (a model fine-tuned from, or distilled from, one that saw a split)."""
    stage = plan.stages[i]
    assert stage is not None and stage.train is not None
    train = stage.train
    earlier = _earlier(plan, i)
    learned: list[_Learned] = []
    source = earlier.get(train.from_) if train.from_ is not None else None
    spec = (source.run or source.evaluate) if source is not None else None
    if spec is not None:
        # The learner trains on a run's train tasks only and refuses rollouts of held-out ones
        # chosen by id (a plan cannot ask it otherwise): a plan it would stop is refused here.
        assert source is not None
        where, demos = f"stages[{i}].train", f"stage {source.name!r}"
        if spec.split is not None and spec.split != "train":
            check.problems.append(
                f"{where}.from: {demos} runs the {spec.split} tasks, held-out ones: the learner "
                f'never trains on them and would refuse the job; run {demos} on split = "train"'
            )
        elif spec.split is None and train.passing is not None:
            check.problems.append(
                f"{where}.passing: picks rollouts of {demos}, which runs every task, held-out "
                f'ones included: the learner refuses those; run {demos} on split = "train"'
            )
        else:
            how = f"stage {stage.name!r} trained on rollouts of {demos}, run " + (
                "on split train" if spec.split else "with no split (its train tasks only)"
            )
            learned.append(_Learned(_env_id(check, spec.env), "train", how))
    elif train.from_ is None and train.env is not None:
        # Online methods sample the env's train split (the learner's planning).
        how = f"stage {stage.name!r} trained online on its train split"
        learned.append(_Learned(_env_id(check, train.env), "train", how))
    config = train.config
    for name in (train.model, config.get("teacher"), config.get("reward_model")):
        if isinstance(name, str) and name not in plan.models and name in earlier:
            learned += known.get(name, [])
    return learned


def _uses_repaired(stage: Stage, check: PlanCheck) -> bool:
    """True when the stage, or a stage it takes data or a model from, was checked without a
    value of its own that was wrong."""
    refs: list[Any] = [stage.name]
    if stage.train is not None:
        t = stage.train
        refs += [t.model, t.from_, t.config.get("teacher"), t.config.get("reward_model")]
    elif stage.run or stage.evaluate:
        refs.append((stage.run or stage.evaluate).model)  # type: ignore[union-attr]
    return _repaired(check, refs, {"split", "from", "passing", "config", "model", "env"})


def _check_held_out(plan: ExperimentPlan, check: PlanCheck) -> None:
    """A trained model scored on tasks it learned from measures recall, not generalisation.

    Scored stages are the evaluates, and the runs a compare names. Scoring the split a model
    trained on is refused, unless that split is `train` (a measure of fit, asked for by name);
    scoring one with no split, so its train tasks too, is a warning.
    """
    compared = {
        ref
        for s in plan.stages
        if s is not None and s.compare is not None
        for ref in (s.compare.base, s.compare.other)
    }
    known: dict[str, list[_Learned]] = {}
    for i, stage in enumerate(plan.stages):
        if stage is None:
            continue
        if _uses_repaired(stage, check):
            continue  # judged on a default in place of a value left out for being wrong
        if stage.train is not None:
            known[stage.name] = _learned(plan, i, check, known)
            continue
        spec = stage.evaluate or (stage.run if stage.name in compared else None)
        if spec is None or spec.model in plan.models or spec.model not in known:
            continue
        if _earlier(plan, i).get(spec.model) is None:
            continue  # a later stage: reported by the reference checks
        where = f"stages[{i}].{stage.kind}.split"
        env = _env_id(check, spec.env)
        learned = [d for d in known[spec.model] if d.env == env]
        if spec.split is None and learned:
            d = learned[0]
            what = f", its {d.split} tasks included," if d.split else ""
            check.warnings.append(
                f"{where}: not set, so {stage.name!r} scores every task of {env}{what} which "
                f"model {spec.model!r} learned from ({d.how}); set a held-out split "
                '(e.g. split = "test")'
            )
            continue
        hit = next((d for d in learned if d.split in (None, spec.split)), None)
        if hit is None:
            continue
        if spec.split == "train":
            check.warnings.append(
                f"{where}: model {spec.model!r} learned from these train tasks ({hit.how}): "
                "this measures fit, not held-out performance"
            )
        else:
            check.problems.append(
                f"{where}: model {spec.model!r} learned from {_tasks_of(check, spec)} "
                f"({hit.how}): its score would measure recall, not held-out performance; "
                "train on another split"
            )


# --- the canonical plan ------------------------------------------------------------------------


def canonical_plan(plan: ExperimentPlan, envs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The validated plan as plain JSON, each environment with its pin."""
    doc = plan.model_dump(mode="json", by_alias=True)
    for key, pin in envs.items():
        doc["envs"][key] = {
            k: v for k, v in {**doc["envs"][key], **pin}.items() if v is not None or k == "version"
        }
    return doc


def plan_hash(canonical: dict[str, Any]) -> str:
    """sha256 of the canonical plan's sorted-keys JSON."""
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


# --- a plan's state from its events --------------------------------------------------------------


@dataclass
class PlanState:
    """One plan as its events tell it: stages, their outcomes and outputs, as of `version`."""

    plan_id: str
    hash: str | None = None
    name: str | None = None
    plan: dict[str, Any] | None = None
    stages: list[str] = field(default_factory=list)
    env_versions: dict[str, int] = field(default_factory=dict)
    # Failures per stage: a rerun after a failure is a new attempt (new run / job ids).
    attempts: dict[str, int] = field(default_factory=dict)
    started: set[str] = field(default_factory=set)
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    status: str = "new"
    reason: str | None = None
    events: int = 0
    # Stream sequence of the newest event of the plan: the guard for the next append.
    version: int = 0

    def apply(self, event: Any, seq: int) -> None:
        """Fold one event of the plan into the state."""
        body = event.body()
        self.events += 1
        self.version = max(self.version, seq)
        if event.type == PLAN_STARTED and self.hash is None:
            self.hash, self.name, self.plan = body.plan_hash, body.name, body.plan
            self.stages = list(body.stages)
            self.env_versions = dict(body.env_versions)
            self.status = "running"
        elif event.type == STAGE_STARTED:
            self.started.add(body.stage)
            self.failed.pop(body.stage, None)
            if self.status == "failed":
                self.status, self.reason = "running", None  # a rerun resumes it
        elif event.type == STAGE_COMPLETED:
            self.outputs.setdefault(body.stage, dict(body.outputs))
        elif event.type == STAGE_FAILED:
            self.failed[body.stage] = body.reason
            self.attempts[body.stage] = self.attempts.get(body.stage, 0) + 1
        elif event.type == PLAN_COMPLETED:
            self.status = "completed"
        elif event.type == PLAN_FAILED:
            self.status, self.reason = "failed", body.reason

    def stage_status(self, stage: str) -> str:
        """pending, running, completed or failed."""
        if stage in self.outputs:
            return "completed"
        if stage in self.failed:
            return "failed"
        return "running" if stage in self.started else "pending"

    def summary(self) -> dict[str, Any]:
        """What `rollout replay --plan` prints."""
        return {
            "planId": self.plan_id,
            "name": self.name,
            "hash": self.hash,
            "status": self.status,
            "reason": self.reason,
            "events": self.events,
            "stages": [
                {
                    "name": s,
                    "status": self.stage_status(s),
                    "outputs": self.outputs.get(s, {}),
                    "reason": self.failed.get(s),
                }
                for s in self.stages
            ],
        }


async def load_plan_state(js: Any, plan_id: str) -> PlanState:
    """Rebuild a plan's state from its events, up to the newest one when this was called."""
    from contextlib import aclosing

    from nats.js.errors import NotFoundError

    state = PlanState(plan_id)
    subject = subjects.aggregate_events("plan", plan_id)
    try:
        newest = await js.get_last_msg(subjects.EVENTS_STREAM, subject)
    except NotFoundError:
        return state
    async with aclosing(read_events(js, subject)) as messages:
        async for msg in messages:
            seq = msg.metadata.sequence.stream
            if seq > newest.seq:
                break
            state.apply(EventEnvelope.from_bytes(msg.data), seq)
    state.version = newest.seq
    return state


def require_ok(check: PlanCheck) -> None:
    """Raise RolloutError listing every problem when the plan is not valid."""
    if not check.ok:
        raise RolloutError(
            f"{check.path}: {len(check.problems)} problem(s); nothing was started",
            problems=check.problems,
        )
