"""`rollout demo` end to end: every stage runs and every number printed is the tracker's."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from rollout.cli import main
from rollout.client import AsyncClient
from rollout.shared.learning import examples, tiny_agent

# The trained names (`BASE:SUFFIX`) resolve in this process, where the actor runs.
import rollout.shared.models.trained  # noqa: F401  isort: skip


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_demo_runs_the_loop_and_reports_measured_pass_rates(
    stack, demo_env, monkeypatch, capsys
) -> None:
    # A short recipe: this test checks the loop, not how good the tiny model gets.
    monkeypatch.setattr(tiny_agent, "TRAINING", {**tiny_agent.TRAINING, "max_steps": 60})
    argv = ["demo", "--json", "--env", "submit-codes", "--model", "local/tiny-agent",
            "--steps", "1", "--group-size", "2",
            "--train-n", "4", "--temperature", "1.0"]  # fmt: skip
    code = await asyncio.to_thread(main, argv)
    captured = capsys.readouterr()
    stack.check()
    assert code == 0, captured.err[-3000:]
    # The services share this process's stdout here (in `rollout up` they are processes of
    # their own), so the document is found where it starts rather than assumed to be alone.
    start = captured.out.find("{\n")
    assert start >= 0, captured.out[-3000:]
    doc, _ = json.JSONDecoder().raw_decode(captured.out, start)
    assert "[8/8]" in captured.err  # progress went to stderr, stdout holds only the document
    assert doc["env"] == "submit-codes" and doc["baseModel"] == "local/tiny-agent"
    stages = {s["stage"]: s for s in doc["stages"]}
    assert list(stages) == ["baseline", "train", "sft", "grpo"]

    client = AsyncClient(demo_env)
    try:
        # Every pass rate is the one the tracker measured for that run.
        for stage in doc["stages"]:
            if stage["runId"] is None:
                continue
            run = await client.get_run(stage["runId"])
            assert run["status"] == "completed"
            assert (stage["passRate"], stage["meanScore"], stage["model"], stage["split"]) == (
                run["passRate"], run["meanScore"], run["model"], run["split"],
            )  # fmt: skip
        assert stages["baseline"]["split"] == stages["grpo"]["split"] == "test"
        assert stages["train"]["split"] == "train" and stages["train"]["scored"] == 12 * 4
        sft = stages["sft"]
        if sft["runId"] is None:  # nothing passed in the train run: SFT was honestly skipped
            assert stages["train"]["passed"] == 0 and "no passing rollouts" in sft["skipped"]
        else:
            job = await client.get_training_job(sft["jobId"])
            assert job["status"] == "completed" and job["modelId"] == sft["model"]
        grpo = await client.get_training_job(stages["grpo"]["jobId"])
        assert grpo["status"] == "completed" and grpo["method"] == "grpo"
        assert grpo["modelId"] == doc["finalModel"] == stages["grpo"]["model"]
        assert grpo["baseModel"] == (sft["model"] or "local/tiny-agent")
    finally:
        await client.close()
    compare = doc["compare"]
    assert compare["base"]["runId"] == stages["baseline"]["runId"]
    assert compare["other"]["runId"] == stages["grpo"]["runId"]
    assert compare["deltaPassRate"] == pytest.approx(
        stages["grpo"]["passRate"] - stages["baseline"]["passRate"]
    )
    # What GRPO added: the SFT'd model's test run against the final one (None without SFT).
    added = doc["grpoOverSft"]
    if sft["runId"] is None:
        assert added is None
    else:
        assert (added["base"]["runId"], added["other"]["runId"]) == (
            sft["runId"], stages["grpo"]["runId"],
        )  # fmt: skip
        assert added["deltaPassRate"] == pytest.approx(stages["grpo"]["passRate"] - sft["passRate"])


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--env", "nope"], "--env 'nope' is not an example environment"),
        (["--steps", "0"], "--steps must be >= 1"),
        (["--group-size", "1"], "--group-size must be >= 2"),
        (["--temperature", "0"], "--temperature must be in (0, 2]"),
        (["--model", "openai/gpt-4o"], "--model 'openai/gpt-4o': the demo has no recipe for it"),
    ],
)
def test_bad_demo_options_fail_before_anything_starts(
    argv, expected, monkeypatch, tmp_path, capsys
) -> None:
    monkeypatch.setenv("ROLLOUT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ROLLOUT_EXAMPLES_DIR", str(Path(__file__).parent / "demo_examples"))
    assert main(["demo", *argv]) == 1
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err
    assert not (tmp_path / "home").exists()  # no stack was started


@pytest.mark.parametrize("env", ["ticket-routing", "returns-desk"])
async def test_every_recipe_is_a_valid_plan_that_learns_from_a_known_source(
    env: str, monkeypatch
) -> None:
    from argparse import Namespace

    from rollout.cli import demo
    from rollout.plans import check_plan_data

    monkeypatch.delenv("ROLLOUT_EXAMPLES_DIR", raising=False)  # the repo's examples
    assert set(demo.RECIPES) == {"local/tiny-agent", "local/smollm2-135m"}
    # The pretrained base passes ~nothing before training: it learns from the scripted player.
    assert demo.recipe_for("local/smollm2-135m").demos == "scripted"
    # The shipped plan is the default model's recipe on the default env, unchanged.
    assert demo.Recipe.of_plan(demo.shipped_plan()) == demo.replace(
        demo.recipe_for(demo.BASE_MODEL), per_env={}
    )
    for model, recipe in demo.RECIPES.items():
        assert recipe.demos in demo.DEMO_SOURCES
        recipe = recipe.for_env(env)
        args = Namespace(model=model, n=1, demos=recipe.demos, train_n=3, temperature=0.9,
                         steps=recipe.steps, group_size=2)  # fmt: skip
        data = recipe.plan(args, demo.example_env(env, None), env, tag="t")
        check = await check_plan_data(data, demo.PLAN_FILE)
        assert check.ok, check.problems
        stages = {s.name: s for s in check.plan.stages}
        teacher = check.plan.models[stages["train"].run.model]
        assert teacher == ("local/scripted" if recipe.demos == "scripted" else model)
        grpo = stages["grpo"].train.config
        assert (grpo["max_steps"], grpo["group_size"]) == (recipe.steps, 2)
        assert grpo["learning_rate"] == recipe.grpo["learning_rate"]
        assert stages["sft"].train.passing.limit == recipe.sft_max


def _rollouts(passing: list[tuple[int, int]]) -> list[dict]:
    return [
        {"rolloutId": f"r{t}-{s}", "taskIndex": t, "sampleIndex": s, "passed": True, "score": 1.0}
        for t, s in passing
    ]


def test_sft_selection_with_a_limit_takes_one_round_over_the_tasks_first() -> None:
    from rollout.plan_runner import passing_selection
    from rollout.shared.contracts.plan import PassingSelection

    rollouts = _rollouts([(t, s) for t in range(3) for s in range(2)])
    chosen = passing_selection(rollouts, PassingSelection(per_task=4, limit=4))
    assert chosen == ["r0-0", "r1-0", "r2-0", "r0-1"]
    assert len(passing_selection(rollouts, PassingSelection(per_task=4))) == 6
    assert passing_selection(rollouts, PassingSelection(per_task=1)) == ["r0-0", "r1-0", "r2-0"]


async def test_the_scripted_player_solves_train_tasks_and_knows_no_test_task(monkeypatch) -> None:
    from rollout.shared.agent.loop import run_episode
    from rollout.shared.envs.engine import build_runtime, score
    from rollout.shared.envs.loader import load_environments
    from rollout.shared.learning.scripted import UNKNOWN_TASK_ANSWER, ScriptedPlayer
    from rollout.shared.models.catalog import resolve_backend

    monkeypatch.delenv("ROLLOUT_EXAMPLES_DIR", raising=False)  # the repo's examples
    player = resolve_backend("local/scripted")
    assert isinstance(player, ScriptedPlayer)
    [spec] = [
        env.to_spec()
        for file in examples.example_files()
        for env in load_environments(file)
        if env.to_spec().slug == "ticket-routing"
    ]
    verdicts = {}
    for split in ("train", "test"):
        task = next(t for t in spec.tasks if t.split == split)
        runtime = build_runtime(spec, task)
        try:
            trajectory = await run_episode(runtime, player, task.instruction)
        finally:
            await runtime.close()
        verdicts[split] = ((await score(spec, task, trajectory)).passed, trajectory.messages[-1])
    assert verdicts["train"][0] is True
    # A held-out task has no plan: the player answers without a tool call and fails.
    assert verdicts["test"][0] is False
    assert verdicts["test"][1]["content"] == UNKNOWN_TASK_ANSWER
