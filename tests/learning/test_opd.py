"""On-policy distillation on the tiny model: each sampled token's advantage is the teacher's
logprob minus the student's, the student moves towards the teacher, and the learner resumes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from rollout.errors import RolloutError
from rollout.shared.learning import GRPOLearner, OPDLearner, TrainConfig

PROMPT = [{"role": "user", "content": "Pick one."}]


def _completions(learner: GRPOLearner, texts: tuple[str, ...]) -> list[dict]:
    """The student's 'samples' of PROMPT (hand-given), with its own logprobs recorded."""
    completions = []
    for text in texts:
        ids = learner.tokenizer(text, add_special_tokens=False)["input_ids"]
        completions.append(
            {
                "token_ids": [ids],
                "messages": [*PROMPT, {"role": "assistant", "content": text}],
                "reward": 0.0,
                "policy_version": learner.policy_version,
            }
        )
    return [{"prompt": PROMPT, "tools": None, "completions": completions}]


def _per_token(learner: GRPOLearner, model, groups: list[dict]) -> list[list[float]]:
    """`model`'s logprob of each completion token (rows in order)."""
    learner.merge_turns = False
    rows, _ = learner._rows(groups)
    batch = learner._tensors(rows)
    with torch.no_grad():
        logp = learner._logprobs(model, batch)
    out = []
    for i, row in enumerate(rows):
        first = len(row.context) - 1
        out.append([float(v) for v in logp[i, first : first + len(row.completion)]])
    return out


@pytest.fixture(scope="module")
def teacher(tiny_base: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model after GRPO taught it to answer `yes` (and not `no sir`) to PROMPT."""
    out = tmp_path_factory.mktemp("teacher")
    config = TrainConfig(method="grpo", learning_rate=5e-3, beta=0.0, lora=False)
    learner = GRPOLearner(tiny_base, out / "run", config, resume=False)
    for _ in range(6):
        group = _completions(learner, ("yes", "no sir"))
        group[0]["completions"][0]["reward"] = 1.0
        learner.step(group)
    return learner.save()


def _opd(tiny_base: Path, out: Path, teacher: Path, **extra) -> OPDLearner:
    config = TrainConfig(method="opd", teacher=str(teacher), learning_rate=1e-3, **extra)
    return OPDLearner(tiny_base, out, config, resume=False, teacher=teacher)


def test_each_tokens_advantage_is_the_teachers_logprob_minus_the_students(
    tiny_base: Path, tmp_path: Path, teacher: Path
) -> None:
    learner = _opd(tiny_base, tmp_path / "s", teacher, kl_coef=0.5)
    groups = _completions(learner, ("yes", "no sir"))
    student = _per_token(learner, learner.model, groups)
    taught = _per_token(learner, learner.teacher, groups)
    rows, _ = learner._rows(groups)
    batch = learner._tensors(rows)
    logp = learner._logprobs(learner.model, batch)
    advantages = learner._advantages(batch, logp)
    for i, row in enumerate(rows):
        first = len(row.context) - 1
        got = advantages[i, first : first + len(row.completion)].tolist()
        want = [0.5 * (t - s) for t, s in zip(taught[i], student[i], strict=True)]
        assert got == pytest.approx(want, abs=1e-5)
        # Only the sampled tokens carry a signal: the prompt and padding are masked out.
        assert float(advantages[i].abs().sum()) == pytest.approx(sum(map(abs, want)), abs=1e-4)
    # The teacher was taught `yes` over `no sir`: it gives `yes` more than the student does.
    assert sum(taught[0]) - sum(student[0]) > sum(taught[1]) - sum(student[1])


def test_the_student_moves_towards_the_teacher_and_the_reverse_kl_falls(
    tiny_base: Path, tmp_path: Path, teacher: Path
) -> None:
    learner = _opd(tiny_base, tmp_path / "s", teacher)
    groups = _completions(learner, ("yes", "no sir"))
    yes, no = (sum(t) for t in _per_token(learner, learner.model, groups))
    kls = []
    for _ in range(4):
        learner.step(_completions(learner, ("yes", "no sir")))
        kls.append(learner.metrics["last_reverse_kl"])
    groups = _completions(learner, ("yes", "no sir"))
    yes2, no2 = (sum(t) for t in _per_token(learner, learner.model, groups))
    # Distillation needs no reward: every completion here scored 0, yet the student learns
    # the teacher's preference for `yes`.
    assert (yes2 - no2) > (yes - no) + 0.1, (yes, no, yes2, no2)
    assert kls[-1] < kls[0], kls
    assert learner.policy_version == 4
    # The job's progress `kl` is the reverse KL to the teacher.
    assert learner.progress_kl == "last_reverse_kl"


def test_a_teacher_with_another_tokenizer_is_refused(
    tiny_base: Path, tmp_path: Path, teacher: Path
) -> None:
    from transformers import AutoTokenizer

    other = tmp_path / "other"
    shutil.copytree(teacher, other)
    tokenizer = AutoTokenizer.from_pretrained(str(other))
    tokenizer.add_tokens(["<not-in-the-student>"])
    tokenizer.save_pretrained(str(other))
    with pytest.raises(RolloutError, match="teacher: .* another tokenizer than the student's"):
        _opd(tiny_base, tmp_path / "s", other)


def test_distillation_settings_that_mean_nothing_are_refused() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="teacher"):
        TrainConfig(method="opd")
    for bad, field in (
        ({"dynamic_sampling": True}, "dynamic_sampling"),
        ({"advantage": "rloo"}, "advantage"),
        ({"overlong_buffer": 8}, "overlong_buffer"),
    ):
        with pytest.raises(ValidationError, match=field):
            TrainConfig(method="opd", teacher="t", **bad)
    config = TrainConfig(method="opd", teacher="t")
    assert (config.group_size, config.beta, config.kl_coef) == (1, 0.0, 1.0)


def test_the_distilled_student_resumes_from_its_checkpoint(
    tiny_base: Path, tmp_path: Path, teacher: Path
) -> None:
    learner = _opd(tiny_base, tmp_path / "s", teacher, is_correction="tis")
    for _ in range(2):
        learner.step(_completions(learner, ("yes", "no sir", "yes yes")))
    learner.save()
    learner.step(_completions(learner, ("no",)))  # not saved: lost in the "crash"
    config = learner.config
    again = OPDLearner(tiny_base, tmp_path / "s", config, resume=True, teacher=teacher)
    assert again.policy_version == 2
    shutil.copytree(tmp_path / "s", tmp_path / "twin")
    twin = OPDLearner(tiny_base, tmp_path / "twin", config, resume=True, teacher=teacher)
    groups = _completions(again, ("yes", "no sir"))
    again.step(groups)
    twin.step(groups)
    for a, b in zip(again.model.parameters(), twin.model.parameters(), strict=True):
        assert torch.allclose(a, b)
    # A GRPO learner's checkpoint is not a distilled student's to resume.
    grpo = TrainConfig(method="grpo")
    with pytest.raises(RolloutError, match="holds a opd learner's checkpoint"):
        GRPOLearner(tiny_base, tmp_path / "s", grpo, resume=True)
