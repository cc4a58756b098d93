"""Checks of an environment's splits: names a run could never select, and held-out tasks that
repeat a train task (part of `validate_environment`; near misses are warnings for `plan`)."""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from rollout.shared.contracts.envspec import TaskSpec
from rollout.shared.envs.templates import canonical_name

# The splits the platform knows by name: online training samples `train`; recipes are tuned on
# `validation` and report `test`. Any other name is allowed, and held out like these two.
STANDARD_SPLITS = ("train", "validation", "test")
# Repeats of train tasks listed one by one before the rest are counted.
MAX_LISTED = 5


def split_check(tasks: Iterable[Any], *, ids_matter: bool = False) -> tuple[list[str], list[str]]:
    """(problems, warnings) about the tasks' splits, each `tasks[i]...: message`.

    Problems: an empty or space-padded split name, or a case variant of train/validation/test
    (runs select a split by its exact name, so those tasks silently drop out of it); a held-out
    task with the same instruction, input and hidden ground truth as a train task (its score
    would measure recall). Warnings: a split name close to a standard one (`tset`), and a
    held-out instruction a train task also has, with another input or ground truth.
    Tasks that are not valid tasks are skipped: validation reports them. With `ids_matter`
    (a plugin env, whose `reset(task)` may pick its scenario by id) tasks with other ids are
    other tasks.
    """
    parsed = [(i, task) for i, raw in enumerate(tasks) if (task := _task(raw)) is not None]
    problems, warnings = _split_names(parsed)
    repeats, similar = _repeats(parsed, ids_matter)
    problems += repeats[:MAX_LISTED]
    warnings += similar[:MAX_LISTED]
    if len(repeats) > MAX_LISTED:
        problems.append(
            f"tasks: {len(repeats) - MAX_LISTED} more held-out task(s) repeat a train task "
            "word for word"
        )
    if len(similar) > MAX_LISTED:
        warnings.append(
            f"tasks: {len(similar) - MAX_LISTED} more held-out instruction(s) are train "
            "instructions too"
        )
    return problems, warnings


def ids_matter(template: Any) -> bool:
    """Whether an env of `template` tells its tasks apart by id (a plugin's reset sees it)."""
    return isinstance(template, str) and canonical_name(template) == "plugin"


def _task(raw: Any) -> TaskSpec | None:
    if isinstance(raw, TaskSpec):
        return raw
    if isinstance(raw, Mapping):
        try:
            return TaskSpec.model_validate(dict(raw))
        except ValidationError:
            return None
    return None


def _split_names(parsed: list[tuple[int, TaskSpec]]) -> tuple[list[str], list[str]]:
    """One line per odd split name, at its first task, with how many tasks carry it."""
    first: dict[str, int] = {}
    count: dict[str, int] = {}
    for i, task in parsed:
        first.setdefault(task.split, i)
        count[task.split] = count.get(task.split, 0) + 1
    problems: list[str] = []
    warnings: list[str] = []
    for split, i in first.items():
        if split in STANDARD_SPLITS:
            continue
        where = f"tasks[{i}].split"
        tasks = f"{count[split]} task(s)"
        name = split.strip()
        standard = next((s for s in STANDARD_SPLITS if s == name.casefold()), None)
        if not name:
            problems.append(
                f"{where}: {'empty' if not split else 'blank'} split name ({tasks}); "
                f"use {', '.join(STANDARD_SPLITS)} or another name"
            )
        elif standard is not None:
            problems.append(
                f"{where}: {split!r} is not {standard!r} ({tasks}): a run selects a split by "
                f"its exact name, so these tasks would not be in {standard!r}"
            )
        elif name != split:
            problems.append(
                f"{where}: {split!r} has spaces around it ({tasks}); a run asking for "
                f"{name!r} would not find these tasks"
            )
        elif close := difflib.get_close_matches(split.casefold(), STANDARD_SPLITS, 1, 0.75):
            warnings.append(
                f"{where}: {split!r} is close to {close[0]!r} ({tasks}); runs select a split by "
                f"its exact name (only 'train' is trained on online)"
            )
    return problems, warnings


def _repeats(
    parsed: list[tuple[int, TaskSpec]], ids_matter: bool = False
) -> tuple[list[str], list[str]]:
    """Held-out tasks that repeat a train task whole, and those that repeat its instruction."""
    whole: dict[tuple[str, ...], int] = {}
    texts: dict[str, int] = {}
    for i, task in parsed:
        if task.split == "train":
            whole.setdefault(_key(task, ids_matter), i)
            texts.setdefault(_text(task.instruction), i)
    repeats: list[str] = []
    similar: list[str] = []
    for i, task in parsed:
        if task.split == "train":
            continue
        same = whole.get(_key(task, ids_matter))
        if same is not None:
            repeats.append(
                f"tasks[{i}]: same instruction and ground truth as tasks[{same}] (train); "
                f"its {task.split} score would measure recall, not held-out performance"
            )
        elif not ids_matter and (seen := texts.get(_text(task.instruction))) is not None:
            similar.append(
                f"tasks[{i}].instruction: same instruction as tasks[{seen}] (train), with "
                f"another input or ground truth; a {task.split} task should share nothing "
                "with train"
            )
    return repeats, similar


def _text(instruction: str) -> str:
    # Case and spacing do not make a task new to a model that has seen it.
    return " ".join(instruction.split()).casefold()


def _key(task: TaskSpec, ids_matter: bool = False) -> tuple[str, ...]:
    """Everything that makes a task the same task (its id only where `ids_matter`)."""
    return (
        task.id or "" if ids_matter else "",
        _text(task.instruction),
        _canonical(task.input),
        _canonical(task.messages),
        _canonical(task.hidden_ground_truth),
    )


def _canonical(value: Any) -> str:
    try:
        return json.dumps(value, sort_keys=True, ensure_ascii=False, default=repr)
    except (TypeError, ValueError):  # keys of mixed types cannot be sorted
        return repr(value)
