"""`rollout plan X.toml` without a stack: the shipped examples validate and hash; bad plans
list every problem by its path and exit 1."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rollout.plans import check_plan, plan_hash

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SHIPPED = ("local-ppo", "local-grpo", "distill-sft", "rlhf-rm-ppo")


def check(path: Path, **kw):  # noqa: ANN201
    return asyncio.run(check_plan(path, **kw))


def cli(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    """`rollout ARGS` with a home that holds no stack (nothing to resolve refs against)."""
    env = {"ROLLOUT_HOME": str(home), "HOME": str(home), "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-m", "rollout.cli", *args],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_examples_validate_with_stable_hash(name: str) -> None:
    result = check(EXAMPLES / f"{name}.toml")
    assert result.ok, result.problems
    assert result.plan is not None and result.plan.name == name
    # The canonical plan is the validated model's JSON, the env pinned by its content.
    assert result.hash == plan_hash(result.canonical)
    assert result.canonical["envs"]["support"]["specHash"]
    assert (
        result.canonical["stages"] == result.plan.model_dump(mode="json", by_alias=True)["stages"]
    )
    again = check(EXAMPLES / f"{name}.toml")
    assert (again.hash, again.plan_id) == (result.hash, result.plan_id)
    kinds = [s.kind for s in result.plan.stages]
    assert kinds[-1] == "compare" and "train" in kinds


def test_a_change_anywhere_is_another_plan(tmp_path: Path) -> None:
    text = (EXAMPLES / "local-grpo.toml").read_text()
    (tmp_path / "workflow_support.py").write_text((EXAMPLES / "workflow_support.py").read_text())
    (tmp_path / "a.toml").write_text(text)
    (tmp_path / "b.toml").write_text(text.replace("max_steps = 2", "max_steps = 3"))
    a, b = check(tmp_path / "a.toml"), check(tmp_path / "b.toml")
    assert a.ok and b.ok and a.hash != b.hash
    # The environment file's content is part of the plan too.
    env = tmp_path / "workflow_support.py"
    env.write_text(env.read_text().replace("Support refunds", "Support refunds v2", 1))
    c = check(tmp_path / "a.toml")
    assert (
        c.ok
        and c.canonical["envs"]["support"]["specHash"] != a.canonical["envs"]["support"]["specHash"]
    )


BAD = """
name = "bad"
[envs.refunds]
ref = "refund-agent@x"
[envs.gone]
file = "nope.py"
[models]
policy = "local/tiny-agnt"
good = "local/tiny-agent"
[resources]
replicas = 0
[[stages]]
name = "baseline"
run = { env = "refundz", model = "good" }
[[stages]]
name = "t"
train = { method = "bogus", model = "good", from = "baseline" }
[[stages]]
name = "p"
train = { method = "ppo", model = "t2", env = "refunds", config = { clip_range = 5, reward_model = "baseline" } }
[[stages]]
name = "s"
train = { method = "sft", model = "good", config = { epochs = 0 } }
[[stages]]
name = "g"
train = { method = "grpo", model = "good", env = "refunds", from = "baseline", passing = { per_task = 2 }, config = { loss_type = "gspo", aggregation = "token" } }
[[stages]]
name = "c"
compare = { base = "baseline", other = "later" }
[[stages]]
name = "later"
evaluate = { env = "refunds", model = "good", n = 0 }
[[stages]]
name = "x"
run = { env = "refunds", model = "good" }
train = { method = "sft", model = "good", from = "baseline" }
[[stages]]
name = "d"
train = { method = "opd", model = "good", env = "refunds", config = { teacher = "baseline", dynamic_sampling = true } }
"""


def test_every_problem_with_its_path(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(BAD)
    result = check(path)
    assert not result.ok and result.hash is None
    problems = "\n".join(result.problems)
    expected = [
        "resources.replicas: must be >= 1",
        "stages[6].evaluate.n: must be >= 1",
        "stages[7].kind: give exactly one of run, train, evaluate, compare (got run, train)",
        "stages[0].run.env: no environment 'refundz' in [envs] (have refunds, gone)",
        "stages[1].train.method: must be one of sft, dpo, kto, rm, grpo, ppo, opd, ipo (got 'bogus')",
        "stages[2].train.model: no earlier train stage 't2'",
        "stages[2].train.config.reward_model: stage 'baseline' is a run stage, not a train stage",
        "stages[2].train.config.clip_range: must be <= 1",
        "stages[3].train.from: required for sft",
        "stages[3].train.config.epochs: must be > 0",
        "stages[4].train.from: grpo trains online on `env`",
        "stages[4].train.passing: only for methods that train on passing rollouts (sft)",
        "stages[4].train.config.aggregation: gspo's ratio is one per sequence; use sequence",
        "models.policy: unknown local model 'local/tiny-agnt'",
        "envs.refunds.ref: version 'x' must be a whole number >= 1",
        "envs.gone.file: ",
        "stages[8].train.config.teacher: stage 'baseline' is a run stage, not a train stage",
        "stages[8].train.config.dynamic_sampling: distillation learns from the teacher",
    ]
    for line in expected:
        assert line in problems, f"{line!r} not in:\n{problems}"
    # `later` is itself invalid: the compare naming it is not reported a second time.
    assert "stages[5].compare.other" not in problems


def test_cli_plan_exit_codes_json_and_toml_syntax_line(tmp_path: Path) -> None:
    ok = cli("plan", str(EXAMPLES / "local-grpo.toml"), "--json", home=tmp_path)
    assert ok.returncode == 0, ok.stderr
    doc = json.loads(ok.stdout)
    assert doc["ok"] and len(doc["hash"]) == 64 and doc["planId"].startswith("local-grpo-")
    assert [s["name"] for s in doc["plan"]["stages"]] == ["baseline", "grpo", "trained", "delta"]
    text = cli("plan", str(EXAMPLES / "local-grpo.toml"), home=tmp_path)
    assert text.returncode == 0 and f"sha256 {doc['hash']}" in text.stdout

    (tmp_path / "syntax.toml").write_text('name = "x"\n[envs.a]\nref = "a@1"\n[[stages]\n')
    bad = cli("plan", str(tmp_path / "syntax.toml"), home=tmp_path)
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert "TOML syntax error" in bad.stdout and "line 4" in bad.stdout
    assert "nothing was started" in bad.stdout

    # `rollout run --config` refuses the same way before it starts anything.
    refused = cli("run", "--config", str(tmp_path / "syntax.toml"), home=tmp_path)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr


def test_a_split_the_env_lacks(tmp_path: Path) -> None:
    (tmp_path / "workflow_support.py").write_text((EXAMPLES / "workflow_support.py").read_text())
    text = (EXAMPLES / "local-grpo.toml").read_text().replace('split = "test"', 'split = "tset"')
    (tmp_path / "p.toml").write_text(text)
    result = check(tmp_path / "p.toml")
    assert result.problems == [
        f"stages[{i}].evaluate.split: support-refunds has no 'tset' tasks (splits: test, train, validation)"
        for i in (0, 2)
    ]


def test_with_overrides_a_model(tmp_path: Path) -> None:
    result = check(EXAMPLES / "local-grpo.toml", overrides=[f"policy=hf:{tmp_path}"])
    assert result.ok and result.canonical["models"]["policy"] == f"hf:{tmp_path}"
    missing = check(EXAMPLES / "local-grpo.toml", overrides=[f"policy=hf:{tmp_path}/none"])
    assert any(p.startswith("models.policy: no model folder") for p in missing.problems)


def test_the_distillation_plan_validates_and_names_its_teacher_stage() -> None:
    result = check(EXAMPLES / "distill-opd.toml")
    assert result.ok, result.problems
    student = next(s for s in result.canonical["stages"] if s["name"] == "student")
    assert student["train"]["method"] == "opd"
    assert student["train"]["config"]["teacher"] == "teacher"  # the SFT stage before it
