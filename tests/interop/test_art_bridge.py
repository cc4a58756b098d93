"""The ART bridge with openpipe-art's real classes: a real run's rollouts exported as ART
TrajectoryGroups (in-process platform on real NATS + Postgres), and ART trajectories imported
as scored rollouts that the SFT / DPO / GRPO builders take."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator

import pytest
from fakes.openai_server import FakeOpenAI
from openai.types.chat.chat_completion import Choice
from pipeline.kit import Platform, refund_agent, refund_env, wait_for_platform

from rollout.cli import main
from rollout.client import AsyncClient
from rollout.errors import RolloutError
from rollout.shared.interop.art import (
    art,
    export_run,
    from_trajectory_groups,
    read_groups,
    training_sets,
    write_groups,
)
from rollout.shared.settings import Settings


@pytest.fixture
async def client(settings: Settings) -> AsyncIterator[AsyncClient]:
    platform = Platform(settings)
    for name in ("env-registry", "tracker", "verifier", "actor"):
        platform.start(name)
    c = AsyncClient(settings, timeout_s=20)
    await wait_for_platform(c, platform)
    yield c
    await c.close()
    platform.check()
    await platform.stop_all()


@pytest.fixture
def agent() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(refund_agent) as server:
        yield server


async def test_a_runs_rollouts_export_as_art_trajectory_groups(client, agent, tmp_path) -> None:
    await client.push_environment(refund_env(tasks=2))
    run = await client.create_run("refunds", f"{agent.base_url}#m", n=4, seed=1)
    done = await client.wait_for_run(run["runId"], timeout_s=120)
    assert done["status"] == "completed"
    rollouts = await client.get_rollouts(run["runId"])

    groups = await export_run(client, run["runId"])
    assert [type(g) for g in groups] == [art.TrajectoryGroup] * 2
    assert [len(g) for g in groups] == [4, 4]
    by_id = {r["rolloutId"]: r for r in rollouts}
    for task_index, group in enumerate(groups):
        assert group.metadata["task_index"] == task_index
        for trajectory in group:
            ours = by_id[trajectory.metadata["rollout_id"]]
            assert trajectory.reward == ours["score"]
            assert trajectory.metrics["passed"] is ours["passed"]
            assert trajectory.metadata["task_index"] == task_index
            choices = [m for m in trajectory.messages_and_choices if isinstance(m, Choice)]
            assert choices and choices[0].message.tool_calls[0].function.name == "refund"
            assert [t["function"]["name"] for t in trajectory.tools] == ["lookup_order", "refund"]
    # Seeds divisible by 4 refund one too much: the group's rewards differ (GRPO has signal).
    assert any(len({t.reward for t in g}) > 1 for g in groups)

    # Through a file and back with ART's own models.
    path = write_groups(groups, tmp_path / "groups.jsonl")
    again = read_groups(path)
    assert [[t.reward for t in g] for g in again] == [[t.reward for t in g] for g in groups]
    imported = from_trajectory_groups(again)
    assert [r["score"] for r in imported] == [t.reward for g in groups for t in g]
    assert imported[0]["trajectory"]["messages"][-1]["content"] == "refunded"


async def test_engine_rollouts_export_with_their_sampled_tokens(tmp_path) -> None:
    """Rollouts our own engine generated and scored (no platform) as ART groups."""
    from rollout.shared.agent.loop import Episode, SamplingParams, run_episodes
    from rollout.shared.envs import build_runtime, score
    from rollout.shared.interop.art import to_trajectory_groups
    from rollout.shared.models.catalog import resolve_backend

    spec = refund_env(tasks=2)

    def agent_with_tokens(body):
        reply = refund_agent(body)
        reply.body["choices"][0]["logprobs"] = {
            "content": [{"token": "token_id:7", "logprob": -0.5, "top_logprobs": []}]
        }
        return reply

    rows = []
    with FakeOpenAI(agent_with_tokens) as server:
        backend = resolve_backend(f"{server.base_url}?logprobs=1&token_ids=1#m")
        for task_index in (0, 1):
            runtimes = [build_runtime(spec, task_index) for _ in range(3)]
            episodes = [
                Episode(
                    rt, spec["tasks"][task_index]["instruction"], sampling=SamplingParams(seed=s)
                )
                for s, rt in enumerate(runtimes)
            ]
            trajectories = await run_episodes(episodes, backend)
            for rt in runtimes:
                await rt.close()
            for sample_index, trajectory in enumerate(trajectories):
                verdict = await score(spec, task_index, trajectory)
                rows.append(
                    {
                        "rolloutId": f"r-{task_index}-{sample_index}",
                        "runId": "local",
                        "taskIndex": task_index,
                        "sampleIndex": sample_index,
                        "score": verdict.score,
                        "passed": verdict.passed,
                        "outcome": "passed" if verdict.passed else "failed",
                        "primitives": [p.model_dump() for p in verdict.primitives],
                        "trajectory": trajectory.model_dump(mode="json"),
                    }
                )
    rows.append({**rows[0], "rolloutId": "errored", "outcome": "errored", "score": None})
    groups = to_trajectory_groups(rows)
    assert [len(g) for g in groups] == [3, 3]  # the errored rollout is nobody's reward
    first = groups[0].trajectories[0]
    assert first.reward == 0.0 and first.metrics["passed"] is False  # seed 0 refunds too much
    assert groups[0].trajectories[1].reward == 1.0
    choice = next(m for m in first.messages_and_choices if isinstance(m, Choice))
    assert [t.token for t in choice.logprobs.content] == ["token_id:7"]
    # Through a file (ART's own JSON) and back: the same tokens, nothing training needs lost.
    back = from_trajectory_groups(read_groups(write_groups(groups, tmp_path / "g.jsonl")))
    assert [r["score"] for r in back] == [t.reward for g in groups for t in g]
    assert back[0]["trajectory"]["token_ids"] == rows[0]["trajectory"]["token_ids"]


def _group(prompt: str, replies: list[tuple[str, float]]) -> art.TrajectoryGroup:
    trajectories = []
    for text, reward in replies:
        choice = Choice.model_validate(
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": text},
                "logprobs": {
                    "content": [
                        {"token": "token_id:11", "logprob": -0.1, "top_logprobs": []},
                        {"token": "token_id:12", "logprob": -0.3, "top_logprobs": []},
                    ]
                },
            }
        )
        trajectories.append(
            art.Trajectory(
                messages_and_choices=[{"role": "user", "content": prompt}, choice],
                reward=reward,
            )
        )
    return art.TrajectoryGroup(trajectories)


def test_art_trajectories_import_as_scored_rollouts_and_training_sets(tmp_path, capsys) -> None:
    groups = [
        _group("What is 2+2?", [("4", 1.0), ("5", 0.0), ("four", 0.5)]),
        _group("Capital of France?", [("Paris", 1.0), ("Lyon", 0.0)]),
    ]
    rollouts = from_trajectory_groups(groups)
    assert [(r["task_index"], r["sample_index"]) for r in rollouts] == [
        (0, 0), (0, 1), (0, 2), (1, 0), (1, 1)
    ]  # fmt: skip
    first = rollouts[0]
    assert first["passed"] is True and rollouts[2]["passed"] is False  # 0.5 < pass_at 1.0
    # The sampled tokens survive, so training sees exactly what ART's model sampled.
    assert first["trajectory"]["token_ids"] == [[11, 12]]
    assert first["trajectory"]["logprobs"] == [[-0.1, -0.3]]

    sets = training_sets(rollouts)
    assert [e["messages"][-1]["content"] for e in sets["sft"]] == ["4", "Paris"]
    assert {(p["chosen"][-1]["content"], p["rejected"][-1]["content"]) for p in sets["dpo"]} == {
        ("4", "5"),
        ("Paris", "Lyon"),
    }
    assert sets["grpo"][0] == {"prompt": "What is 2+2?", "rewards": [1.0, 0.0, 0.5]}

    path = write_groups(groups, tmp_path / "in.jsonl")
    assert main(["art", "import", str(path), "-o", str(tmp_path / "out")]) == 0
    assert "5 rollouts imported" in capsys.readouterr().out
    lines = (tmp_path / "out" / "dpo.jsonl").read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[0])["margin"] == 1.0
    for margin in ("nan", "inf", "-1"):
        argv = ["art", "import", str(path), "-o", str(tmp_path / "m"), "--min-margin", margin]
        assert main(argv) == 1
        assert "--min-margin must be a finite number >= 0" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


def test_a_file_that_is_not_art_groups_is_named(tmp_path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"trajectories": [{"reward": "high"}]}\n')
    with pytest.raises(RolloutError, match=r"bad.jsonl:1: not an ART TrajectoryGroup"):
        read_groups(bad)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(RolloutError, match="no trajectory groups"):
        read_groups(empty)
    silent = art.TrajectoryGroup(
        [art.Trajectory(messages_and_choices=[{"role": "user", "content": "hi"}])]
    )
    with pytest.raises(RolloutError, match="group 0 trajectory 0: .*no assistant turn"):
        from_trajectory_groups([silent])


def test_importing_the_bridge_leaves_transformers_masking_untouched() -> None:
    """ART's import-time monkeypatch broke every later model forward in the process."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers import masking_utils

    assert masking_utils._preprocess_mask_arguments.__module__ == "transformers.masking_utils"
    config = transformers.LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    model = transformers.LlamaForCausalLM(config)
    out = model(
        input_ids=torch.tensor([[1, 2, 3]]), attention_mask=torch.ones(1, 3, dtype=torch.long)
    )
    assert out.logits.shape == (1, 3, 32)


def test_art_import_and_export_never_overwrite_a_users_files(tmp_path, capsys) -> None:
    groups = [_group("What is 2+2?", [("4", 1.0), ("5", 0.0)])]
    path = write_groups(groups, tmp_path / "in.jsonl")
    # A folder of the user's own: refused, nothing in it changed.
    mine = tmp_path / "mydata"
    mine.mkdir()
    (mine / "sft.jsonl").write_text('{"my": "precious"}\n')
    assert main(["art", "import", str(path), "-o", str(mine)]) == 1
    err = capsys.readouterr().err
    assert "not empty and not the output of an earlier `rollout art import`" in err, err
    assert "in the way: sft.jsonl" in err and "Traceback" not in err
    assert (mine / "sft.jsonl").read_text() == '{"my": "precious"}\n'
    # Its own earlier output is replaced, as the command redone.
    out = tmp_path / "sets"
    assert main(["art", "import", str(path), "-o", str(out)]) == 0
    assert main(["art", "import", str(path), "-o", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["dpo.jsonl", "grpo.jsonl", "rollouts.jsonl",
                                                     "sft.jsonl"]  # fmt: skip
    capsys.readouterr()

    # Export: a file that is not an earlier export, or a folder, is refused before the
    # platform is asked anything (there is none here).
    from rollout.cli.backends import check_groups_out

    env_file = tmp_path / "refund_agent.py"
    env_file.write_text("env = 1\n")
    for target, says in ((env_file, "exists and is not an earlier `rollout art export`"),
                         (mine, "is a folder")):  # fmt: skip
        with pytest.raises(RolloutError, match=says):
            check_groups_out(target)
        assert main(["art", "export", "r1", "-o", str(target)]) == 1
        assert says in capsys.readouterr().err
    assert env_file.read_text() == "env = 1\n"
    check_groups_out(path)  # an earlier export may be replaced
    assert write_groups(groups, path) == path
