"""Held out means held out: no example env's test or validation task shares text or an entity with a train task.

For every example env (each file in examples/ with both splits):

- no test instruction is identical to a train instruction;
- no 6-word span is shared between a test and a train instruction (lowercased, split at
  punctuation and spaces);
- no *entity value* is shared between the splits. An entity value is an id, a name, an amount,
  an email, an order or ticket number, a ticket text or a file's contents: every string and
  number leaf (and data key, e.g. a file path; not a field name) of a task's `id`, `input` and `hiddenGroundTruth`, of the env-level
  records that belong to the task (a fixture record or state entry keyed by one of the task's
  ids), the tokens holding a digit of the instruction (ids, amounts, targets), and the quoted
  literals and numbers inside one-line ground-truth strings (a SQL query's 'DE' or 20).
  Excluded: the small per-env `SHARED_VOCABULARY` below, the labels and structural words that
  must be shared for a task family to be learnable at all (ticket-routing's four team names,
  status words, plan names, a form id). The env-level world itself (pages, a database, the
  full fixture table) is shared by design; only a task's own records in it are compared.

And every task of every split is solved by its scripted plan (the test split's too: a check
that the held-out tasks are valid, not a source of training data).
"""

from __future__ import annotations

import asyncio
import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest

from rollout.shared.contracts.budgets import resolve_budgets
from rollout.shared.envs import build_runtime, load_environments, score
from rollout.shared.learning.scripted import ScriptedBackend, plan_for

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SPAN = 6
# Recipes are tuned on validation and test is only reported: both are held out from train.
HELD_OUT = ("validation", "test")

# Labels and structure every task of a family shares (documented in the module docstring).
SHARED_VOCABULARY: dict[str, set[Any]] = {
    "ticket-routing": {"billing", "shipping", "technical", "account"},
    "ticket-desk": {"closed", "open", 1, "closed.length", "closed.0.note"},
    "support-refunds": {"shipped"},
    "stock-reservations": {"north", "south", "east", "west"},
    "returns-desk": {"delivered", "lost", "in_transit"},
    "shop-signup": {"signup", "free", "pro", "team"},
    "fix-calc": set(),
    "sales-sql": set(),
    "counter-plugin": set(),
}


def example_envs() -> list[tuple[str, Any]]:
    """(file name, spec) of every example env with both a train and a test split."""
    out = []
    for path in sorted(EXAMPLES.glob("*.py")):
        for env in load_environments(path):
            spec = env.to_spec()
            if {t.split for t in spec.tasks} >= {"train", "test"}:
                out.append((path.name, spec))
    return out


ENVS = example_envs()
IDS = [f"{name}:{spec.slug}" for name, spec in ENVS]


def words(text: str) -> list[str]:
    """Lowercased word tokens; punctuation splits (`ana@example.com` is ana, example, com)."""
    return re.findall(r"[a-z0-9]+", text.lower())


def spans(text: str, n: int = SPAN) -> set[tuple[str, ...]]:
    """Every n-word span of the text."""
    w = words(text)
    return {tuple(w[i : i + n]) for i in range(len(w) - n + 1)}


def _digit_tokens(text: str) -> set[str]:
    tokens = (t.strip(".,;:!?()[]\"'`$") for t in text.split())
    return {t for t in tokens if any(c.isdigit() for c in t)}


def _leaves(value: Any, out: set[Any]) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            if not re.fullmatch(r"[A-Za-z_]\w*", str(key)):  # data keys ("calc.py", "a.T-3.b")
                out.add(str(key))  # (identifier keys are field names: structure, not data)
            _leaves(item, out)
    elif isinstance(value, list | tuple):
        for item in value:
            _leaves(item, out)
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, int | float):
        out.add(float(value) if isinstance(value, float) and not value.is_integer() else int(value))
    elif isinstance(value, str):
        out.add(value)
        if "\n" not in value:  # one-line strings: their literals and numbers (a SQL query's)
            out.update(re.findall(r"'([^']*)'", value))
            out.update(int(n) for n in re.findall(r"(?<![\w.-])\d+(?![\w.-])", value))


def _own_records(config: Any, keys: set[str], out: list[Any]) -> None:
    """Env-level records belonging to the task: dicts holding one of its ids, or keyed by one."""
    if isinstance(config, dict):
        for key, item in config.items():
            if str(key) in keys and isinstance(item, dict):
                out.append(item)
            else:
                _own_records(item, keys, out)
        if any(isinstance(v, str) and v in keys for v in config.values()):
            out.append(config)
    elif isinstance(config, list):
        for item in config:
            _own_records(item, keys, out)


def entities(spec: Any, task: Any) -> set[Any]:
    """The entity values of one task (see the module docstring)."""
    own: set[Any] = set()
    _leaves({"id": task.id, "input": task.input, "truth": task.hidden_ground_truth}, own)
    own |= _digit_tokens(task.instruction)
    parts = {part for v in own if isinstance(v, str) for part in [v, *v.split(".")]}
    ids = {p for p in parts if any(c.isdigit() for c in p)}
    records: list[Any] = []
    _own_records(spec.config, ids, records)
    for record in records:
        _leaves(record, own)
    return own - SHARED_VOCABULARY.get(spec.slug, set())


def split_tasks(spec: Any) -> tuple[list[Any], list[Any]]:
    """The train tasks and the held-out ones (test, and validation where an env has it)."""
    return (
        [t for t in spec.tasks if t.split == "train"],
        [t for t in spec.tasks if t.split in HELD_OUT],
    )


def test_every_generated_example_is_checked() -> None:
    slugs = {spec.slug for _, spec in ENVS}
    assert slugs == set(SHARED_VOCABULARY), slugs


@pytest.mark.parametrize(("name", "spec"), ENVS, ids=IDS)
def test_no_test_instruction_is_a_train_instruction(name: str, spec: Any) -> None:
    train, test = split_tasks(spec)
    shared = {t.instruction for t in test} & {t.instruction for t in train}
    assert not shared, shared


@pytest.mark.parametrize(("name", "spec"), ENVS, ids=IDS)
def test_no_six_word_span_is_shared_across_splits(name: str, spec: Any) -> None:
    train, test = split_tasks(spec)
    seen = set().union(*(spans(t.instruction) for t in train))
    overlaps = {t.instruction: spans(t.instruction) & seen for t in test}
    assert not {k: v for k, v in overlaps.items() if v}


@pytest.mark.parametrize(("name", "spec"), ENVS, ids=IDS)
def test_no_entity_value_is_shared_across_splits(name: str, spec: Any) -> None:
    train, test = split_tasks(spec)
    seen = set().union(*(entities(spec, t) for t in train))
    for task in test:
        mine = entities(spec, task)
        assert mine, f"{task.instruction!r}: no entity found (the check would be vacuous)"
        assert not mine & seen, (task.instruction, mine & seen)


def test_the_span_and_entity_checks_can_fail() -> None:
    # The detectors themselves: a shared span and a shared id are found.
    assert spans("Route this ticket from Ana: the app crashes every day.") & spans(
        "route this ticket, from ANA - the app is fine"
    )
    (_, spec) = next(e for e in ENVS if e[1].slug == "support-refunds")
    train, test = split_tasks(spec)
    leaked = test[0].model_copy(update={"instruction": f"Refund {train[0].id}."})
    assert entities(spec, leaked) & entities(spec, train[0])


def _module(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"_example_{name[:-3]}", EXAMPLES / name)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def test_ticket_routing_is_learnable_from_its_train_split() -> None:
    # Disjoint sentences, shared cues: each test complaint holds a cue word of its own team
    # that some train complaint of that team holds too, and no other team's cue.
    module = _module("ticket_routing.py")
    cues = module.CUES
    train_words = {
        team: set().union(*(set(words(c)) for c in module.COMPLAINTS["train"][team]))
        for team in cues
    }
    for split, by_team in module.COMPLAINTS.items():
        for team, complaints in by_team.items():
            for complaint in complaints:
                tokens = set(words(complaint))
                assert tokens & set(cues[team]), (split, complaint)
                others = {c for t, cs in cues.items() if t != team for c in cs}
                assert not tokens & others, (split, complaint, tokens & others)
                if split in HELD_OUT:
                    assert tokens & set(cues[team]) & train_words[team], complaint


@pytest.mark.parametrize(("name", "spec"), ENVS, ids=IDS)
async def test_scripted_plan_solves_every_task_of_both_splits(name: str, spec: Any) -> None:
    from rollout.shared.agent.loop import run_episode

    trajectories = []
    for index, task in enumerate(spec.tasks):
        runtime = build_runtime(spec, task)
        try:
            plan = plan_for(spec, task, runtime)
            assert plan is not None, f"task {index}: no scripted plan"
            # Under the env's own budgets, as the actor runs it.
            budgets = resolve_budgets(spec.budgets, None)
            trajectories.append(
                await run_episode(runtime, ScriptedBackend(plan), task.instruction, budgets=budgets)
            )
        finally:
            await runtime.close()
    # Scoring may run the tests in the sandbox (a second or two each): all at once.
    results = await asyncio.gather(*(score(spec, i, t) for i, t in enumerate(trajectories)))
    failures = [
        (i, spec.tasks[i].split, r.error, r.primitives)
        for i, r in enumerate(results)
        if not r.passed or r.error
    ]
    assert not failures, failures
