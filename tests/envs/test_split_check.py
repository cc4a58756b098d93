"""`rollout plan` on an env's splits: names a run could never select, and held-out tasks that
repeat a train task, by path (the hostile-input audit's findings 4 and 11)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollout import Task
from rollout.environment import split_check
from rollout.shared.envs import load_environments

ROOT = Path(__file__).resolve().parents[2]
GT = {"refunds": [{"order_id": "O-1", "amount": 100.0}]}


def task(instruction: str, split: str = "train", truth: object = GT, **kw: object) -> Task:
    return Task(instruction=instruction, hidden_ground_truth=truth, split=split, **kw)


ENV_FILES = sorted(
    [*(ROOT / "examples").glob("*.py"), *(ROOT / "tests/envs/seed_examples").glob("*.py")]
)


@pytest.mark.parametrize("path", ENV_FILES, ids=[p.name for p in ENV_FILES])
def test_every_example_and_seed_env_passes_unchanged(path: Path) -> None:
    for env in load_environments(path):
        assert split_check(env.tasks) == ([], []), env.slug


def test_a_held_out_task_repeating_a_train_task_is_a_problem() -> None:
    tasks = [task("Refund O-1 for Alice"), task("Refund  o-1 for ALICE ", "test", id="x")]
    assert split_check(tasks) == (
        [
            "tasks[1]: same instruction and ground truth as tasks[0] (train); its test score "
            "would measure recall, not held-out performance"
        ],
        [],
    )
    # The same in validation, and as plain dicts (camelCase, as the registry stores them).
    raw = [t.model_dump(by_alias=True) for t in tasks]
    raw[1]["split"] = "validation"
    assert "its validation score" in split_check(raw)[0][0]


def test_the_same_instruction_with_another_answer_is_a_warning() -> None:
    tasks = [task("Refund O-1"), task("Refund O-1", "test", truth={"refunds": []})]
    assert split_check(tasks) == (
        [],
        [
            "tasks[1].instruction: same instruction as tasks[0] (train), with another input or "
            "ground truth; a test task should share nothing with train"
        ],
    )
    # Another input is another task too; two held-out splits may share (train is the issue).
    assert (
        split_check([task("Fix it", input={"f": 1}), task("Fix it", "test", input={"f": 2})])[0]
        == []
    )
    assert split_check([task("a", "test"), task("a", "validation")]) == ([], [])


def test_many_repeats_are_counted_after_the_first_five() -> None:
    tasks = [task(f"Refund O-{i}") for i in range(8)]
    tasks += [task(f"Refund O-{i}", "test") for i in range(8)]
    problems, _ = split_check(tasks)
    assert len(problems) == 6 and problems[4].startswith("tasks[12]: same instruction")
    assert problems[5] == "tasks: 3 more held-out task(s) repeat a train task word for word"


@pytest.mark.parametrize(
    ("split", "problem"),
    [
        ("", "tasks[1].split: empty split name (2 task(s)); use train, validation, test or another name"),
        ("  ", "tasks[1].split: blank split name (2 task(s))"),
        ("Test", "tasks[1].split: 'Test' is not 'test' (2 task(s)): a run selects a split by its exact name, so these tasks would not be in 'test'"),
        ("Test ", "tasks[1].split: 'Test ' is not 'test' (2 task(s))"),
        ("TRAIN", "tasks[1].split: 'TRAIN' is not 'train'"),
        (" dev", "tasks[1].split: ' dev' has spaces around it (2 task(s)); a run asking for 'dev' would not find these tasks"),
    ],
)  # fmt: skip
def test_split_names_a_run_cannot_select_are_problems(split: str, problem: str) -> None:
    tasks = [task("a"), task("b", split), task("c", split)]
    problems, _ = split_check(tasks)
    assert len(problems) == 1 and problems[0].startswith(problem), problems


def test_near_misses_warn_and_other_names_pass() -> None:
    assert split_check([task("a"), task("b", "tset")])[1] == [
        "tasks[1].split: 'tset' is close to 'test' (1 task(s)); runs select a split by its "
        "exact name (only 'train' is trained on online)"
    ]
    for name in ("dev", "holdout", "ood", "validation", "test"):
        assert split_check([task("a"), task("b", name)]) == ([], []), name


def test_invalid_tasks_are_left_to_validation() -> None:
    assert split_check([{"instruction": 3}, "nonsense", None, task("a")]) == ([], [])


def test_a_plugin_env_tells_its_tasks_apart_by_id() -> None:
    from rollout.shared.envs.splits import ids_matter

    # A plugin's reset(task) sees the id: level-1..level-3 may be three scenarios behind one
    # instruction, with level-3 held out. Elsewhere the same tasks are repeats.
    tasks = [task("Play the level", id=f"level-{i}") for i in (1, 2)]
    tasks.append(task("Play the level", "test", id="level-3"))
    assert ids_matter("plugin") and not ids_matter("workflow") and not ids_matter(None)
    assert split_check(tasks, ids_matter=True) == ([], [])
    assert len(split_check(tasks)[0]) == 1
    # The same id in train and test is the same task, plugin or not.
    tasks[2] = task("Play the level", "test", id="level-1")
    assert len(split_check(tasks, ids_matter=True)[0]) == 1
