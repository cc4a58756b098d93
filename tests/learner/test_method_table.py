"""A training method is one table entry: a toy one, registered here alone, is offered by the CLI,
checked by plans and the job contracts, and planned and run by the learner from its entry."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

import pydantic
import pytest
from learner_kit import job_events, scripted_run, wait_for_event

from rollout.cli import build_parser
from rollout.errors import RolloutError
from rollout.plans import check_plan
from rollout.shared.contracts.requests import CreateTrainingJob
from rollout.shared.contracts.training import CONFIG_MODELS, TrainConfig, config_problems
from rollout.shared.learning import methods
from rollout.shared.learning.config import Progress, TrainResult, parse_config
from rollout.shared.learning.methods import Method
from rollout.shared.learning.trainer_rows import sft_rows

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


class EchoConfig(TrainConfig):
    """A toy method: the base weights unchanged, the rows counted."""

    method_name: ClassVar[str] = "echo"
    method: Literal["echo"] = pydantic.Field(description="The toy method.")
    copies: int = pydantic.Field(1, ge=1, le=3, description="How often each row is counted.")


def train_echo(
    base_model: Path,
    rows: Sequence[dict[str, Any]],
    out_dir: Path,
    config: TrainConfig,
    *,
    on_progress: Any = None,
    on_checkpoint: Any = None,
    resume: bool = True,
) -> TrainResult:
    """Publish the base weights as the policy; count what it was given."""
    assert isinstance(config, EchoConfig)
    model_dir = out_dir / "model"
    shutil.copytree(base_model, model_dir, dirs_exist_ok=True)
    if on_progress is not None:
        on_progress(Progress(step=1, total_steps=1, loss=0.0))
    seen = sum(1 for row in rows if row["messages"]) * config.copies
    return TrainResult(model_dir=model_dir, steps=1, metrics={"rows_seen": float(seen)})


@pytest.fixture
def echo() -> Iterator[Method]:
    """The toy method in the table for one test (and out of it afterwards)."""
    method = methods.register(
        Method(EchoConfig, "echo", "sft", rows=lambda s: sft_rows(s.items), train=train_echo)
    )
    yield method
    methods.TABLE.pop("echo")
    CONFIG_MODELS.pop("echo")


def test_a_registered_method_is_offered_and_checked_everywhere(echo: Method, tmp_path) -> None:
    args = build_parser().parse_args(["improve", "--model", "local/tiny-agent", "--method", "echo"])
    assert args.method == "echo" and methods.get("echo") is echo and not echo.online
    assert "echo" in methods.names(online=False)
    # Its settings are validated like a built-in's, by path.
    assert parse_config({"method": "echo", "copies": 2}).copies == 2
    with pytest.raises(pydantic.ValidationError) as bad:
        parse_config({"method": "echo", "copies": 9})
    assert config_problems(bad.value, "hyperparams") == ["hyperparams.copies: must be <= 3"]
    assert CreateTrainingJob(method="echo", base_model="local/tiny-agent").method == "echo"
    # A plan stage may train with it.
    text = (EXAMPLES / "distill-sft.toml").read_text()
    (tmp_path / "workflow_support.py").write_text((EXAMPLES / "workflow_support.py").read_text())
    plan = tmp_path / "echo.toml"
    plan.write_text(text.replace('method = "sft"', 'method = "echo"').replace(
        "max_steps = 4, batch_size = 4, learning_rate = 1e-4", "copies = 2"
    ))  # fmt: skip
    checked = asyncio.run(check_plan(plan))
    assert checked.ok, checked.problems
    plan.write_text(plan.read_text().replace("copies = 2", "copies = 7, epochs = 2"))
    assert sorted(asyncio.run(check_plan(plan)).problems) == [
        "stages[2].train.config.copies: must be <= 3",
        "stages[2].train.config.epochs: unknown setting",
    ]


def test_an_unknown_method_is_refused_by_name() -> None:
    with pytest.raises(
        pydantic.ValidationError, match=r"must be one of sft, dpo, .* \(got 'echo'\)"
    ):
        CreateTrainingJob(method="echo", base_model="local/tiny-agent")
    with pytest.raises(RolloutError, match="'echo' is not a training method"):
        methods.get("echo")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["improve", "--model", "m", "--method", "echo"])


def test_a_method_is_offline_with_a_trainer_or_online_with_a_learner() -> None:
    with pytest.raises(ValueError, match="an online method has a learner"):
        methods.register(Method(EchoConfig, "echo", "online", train=train_echo))
    with pytest.raises(ValueError, match="shapes its rows"):
        methods.register(Method(EchoConfig, "echo", "sft", train=train_echo))
    assert "echo" not in methods.TABLE and "echo" not in CONFIG_MODELS


async def test_the_learner_plans_and_runs_a_registered_method(
    echo: Method, client, agent_server, tiny_model: Path, learner_env
) -> None:
    run = await scripted_run(client, agent_server, n=2, tasks=3)
    job = await client.create_training_job(
        base_model=f"hf:{tiny_model}", method="echo", source_run_id=run["runId"],
        suffix="echo", hyperparams={"copies": 2},
    )  # fmt: skip
    # The entry's data kind (`sft`): the run's passing rollouts.
    assert job["method"] == "echo" and 1 <= job["trainingRows"] <= 6
    js = await client.jetstream()
    done = await wait_for_event(js, job["jobId"], "job.completed")
    # The trainer of the table entry ran on the buffer's SFT rows, shaped by the entry's `rows`.
    assert done.body().metrics["rows_seen"] == 2.0 * job["trainingRows"]
    assert done.body().model_id == f"hf:{tiny_model}:echo"
    assert [e.type for e in await job_events(js, job["jobId"])][0] == "job.requested"
