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
    # `later` has a wrong `n` but is still an evaluate stage: the compare naming it is told
    # what it would be told once `n` is fixed (it comes later), once.
    assert problems.count("stages[5].compare.other") == 1
    assert "stages[5].compare.other: stage 'later' comes later" in problems


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


def test_a_model_folder_relative_to_here_is_pinned_as_the_folder_it_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The check found ./ckpt here, but the actors and the learner load `hf:./ckpt` from their
    # own working folder (the stack's): the plan started, then its first stage was refused
    # ("no model directory at ckpt"). The plan names the folder that was checked.
    (tmp_path / "ckpt").mkdir()
    monkeypatch.chdir(tmp_path)
    for given in ("hf:./ckpt", "hf:ckpt", "vllm:ckpt"):
        result = check(EXAMPLES / "local-grpo.toml", overrides=[f"policy={given}"])
        prefix = given.split(":")[0]
        pinned = f"{prefix}:{(tmp_path / 'ckpt').resolve()}"
        assert result.ok and result.canonical["models"]["policy"] == pinned, result.problems
    # What names no folder here is left as written (and refused for hf:).
    missing = check(EXAMPLES / "local-grpo.toml", overrides=["policy=hf:./gone"])
    assert missing.problems == ["models.policy: no model folder './gone'"]


def test_the_distillation_plan_validates_and_names_its_teacher_stage() -> None:
    result = check(EXAMPLES / "distill-opd.toml")
    assert result.ok, result.problems
    student = next(s for s in result.canonical["stages"] if s["name"] == "student")
    assert student["train"]["method"] == "opd"
    assert student["train"]["config"]["teacher"] == "teacher"  # the SFT stage before it


# --- what a plan measures: held-out splits, compares, names (hostile-input audit) ------------

PLAN_HEAD = """
name = "p"
seed = 1
[envs.support]
file = "workflow_support.py"
[envs.stock]
file = "stock_reservations.py"
[models]
policy = "local/tiny-agent"
teacher = "local/scripted"
"""


def plan_in(tmp_path: Path, stages: str, head: str = PLAN_HEAD) -> Path:
    """A plan of `stages` next to copies of the example envs it names."""
    for env in ("workflow_support.py", "stock_reservations.py"):
        (tmp_path / env).write_text((EXAMPLES / env).read_text())
    path = tmp_path / "p.toml"
    path.write_text(head + stages)
    return path


def test_every_shipped_plan_validates_with_no_warning() -> None:
    for path in sorted(EXAMPLES.glob("*.toml")):
        result = check(path)
        assert result.ok and not result.warnings, (path.name, result.problems, result.warnings)


LEAK = """
[[stages]]
name = "demos"
run = { env = "support", model = "teacher", split = "test" }
[[stages]]
name = "sft"
train = { method = "sft", model = "policy", from = "demos" }
[[stages]]
name = "after"
evaluate = { env = "support", model = "sft", split = "test" }
[[stages]]
name = "before"
evaluate = { env = "support", model = "policy", split = "test" }
[[stages]]
name = "delta"
compare = { base = "before", other = "after" }
"""


def test_scoring_a_model_on_the_split_it_trained_on_is_refused(tmp_path: Path) -> None:
    # The learner never trains on held-out tasks and refuses a job on them: the plan would stop
    # at its train stage after running the ones before, so it is refused before anything runs.
    result = check(plan_in(tmp_path, LEAK))
    assert result.problems == [
        "stages[1].train.from: stage 'demos' runs the test tasks, held-out ones: the learner "
        "never trains on them and would refuse the job; run stage 'demos' on split = \"train\""
    ]
    # Demonstrations of the train split: the same plan is fine.
    fixed = check(
        plan_in(tmp_path, LEAK.replace('"teacher", split = "test"', '"teacher", split = "train"'))
    )
    assert fixed.ok and not fixed.warnings, (fixed.problems, fixed.warnings)
    # A run with no split: the job trains on its train tasks only, so a test score is held out
    # (this was refused as "learned from the test tasks").
    no_split = LEAK.replace(
        ', split = "test" }\n[[stages]]\nname = "sft"', ' }\n[[stages]]\nname = "sft"'
    )
    every = check(plan_in(tmp_path, no_split))
    assert every.ok and not every.warnings, (every.problems, every.warnings)
    # Scored on train, it is a measure of fit, said so.
    fit = check(
        plan_in(tmp_path, no_split.replace('"sft", split = "test"', '"sft", split = "train"'))
    )
    assert fit.ok and any("(its train tasks only)" in w for w in fit.warnings), fit.warnings
    # Choosing its rollouts by id picks held-out ones too, which the learner refuses.
    picked = check(
        plan_in(
            tmp_path,
            no_split.replace(
                'train = { method = "sft", model = "policy", from = "demos" }',
                'train = { method = "sft", model = "policy", from = "demos", passing = {} }',
            ),
        )
    )
    assert [p.split(": ")[0] for p in picked.problems] == ["stages[1].train.passing"]
    # A validation split is held out as well: the plan stopped at its train stage.
    val = check(
        plan_in(
            tmp_path, LEAK.replace('"teacher", split = "test"', '"teacher", split = "validation"')
        )
    )
    assert [p.split(": ")[0] for p in val.problems] == ["stages[1].train.from"], val.problems


def test_what_a_model_learned_passes_to_models_trained_from_it(tmp_path: Path) -> None:
    # GRPO on top of an SFT of train demonstrations still knows the train tasks.
    stages = LEAK.replace('"teacher", split = "test"', '"teacher", split = "train"').replace(
        '[[stages]]\nname = "after"\nevaluate = { env = "support", model = "sft", split = "test"',
        '[[stages]]\nname = "g"\ntrain = { method = "grpo", model = "sft", env = "support" }\n'
        '[[stages]]\nname = "after"\nevaluate = { env = "support", model = "g", split = "train"',
    )
    result = check(plan_in(tmp_path, stages))
    assert result.ok, result.problems
    assert any(
        w.startswith("stages[3].evaluate.split: model 'g' learned from these train tasks")
        for w in result.warnings
    ), result.warnings
    # Another environment's train split is not what it learned from.
    elsewhere = """
[[stages]]
name = "demos"
run = { env = "support", model = "teacher", split = "train" }
[[stages]]
name = "sft"
train = { method = "sft", model = "policy", from = "demos" }
[[stages]]
name = "after"
evaluate = { env = "stock", model = "sft", split = "train" }
"""
    result = check(plan_in(tmp_path, elsewhere))
    assert result.ok and not result.warnings, (result.problems, result.warnings)


def test_scoring_train_tasks_of_a_trained_model_is_flagged(tmp_path: Path) -> None:
    grpo = """
[[stages]]
name = "g"
train = { method = "grpo", model = "policy", env = "support" }
[[stages]]
name = "after"
evaluate = { env = "support", model = "g" }
[[stages]]
name = "fit"
evaluate = { env = "support", model = "g", split = "train" }
"""
    result = check(plan_in(tmp_path, grpo))
    assert result.ok, result.problems
    assert result.warnings == [
        "stages[1].evaluate.split: not set, so 'after' scores every task of support-refunds, "
        "its train tasks included, which model 'g' learned from (stage 'g' trained online on "
        'its train split); set a held-out split (e.g. split = "test")',
        "stages[2].evaluate.split: model 'g' learned from these train tasks (stage 'g' trained "
        "online on its train split): this measures fit, not held-out performance",
    ]
    assert check(plan_in(tmp_path, grpo.replace(
        'model = "g" }', 'model = "g", split = "test" }').replace('split = "train"', 'split = "validation"')
    )).warnings == []  # fmt: skip


def test_a_compare_across_environments_is_refused_across_splits_flagged(tmp_path: Path) -> None:
    stages = """
[[stages]]
name = "a"
evaluate = { env = "support", model = "policy", split = "test", temperature = 0.0 }
[[stages]]
name = "b"
evaluate = { env = "stock", model = "policy", split = "train", n = 4, temperature = 1.0 }
[[stages]]
name = "c"
compare = { base = "a", other = "b" }
"""
    result = check(plan_in(tmp_path, stages))
    assert result.problems == [
        "stages[2].compare.other: 'b' scores the train tasks of stock-reservations, 'a' the "
        "test tasks of support-refunds: a compare of two environments pairs unrelated tasks; "
        "compare stages run on the same environment"
    ]
    same_env = check(plan_in(tmp_path, stages.replace('env = "stock"', 'env = "support"')))
    assert same_env.ok and same_env.warnings == [
        "stages[2].compare.other: 'b' scores the train tasks of support-refunds, 'a' the test "
        "tasks of support-refunds: the pass rates are of different tasks, and so are its "
        "per-task deltas (a gap between splits, not the effect of a change)"
    ]


def test_with_a_name_the_plan_lacks_is_refused(tmp_path: Path) -> None:
    result = check(EXAMPLES / "local-grpo.toml", overrides=["polcy=local/smollm2-135m"])
    assert result.problems == ["--with 'polcy': the plan has no model 'polcy' (models: policy)"]
    refused = cli(
        "plan", str(EXAMPLES / "local-grpo.toml"), "--with", "polcy=local/smollm2-135m",
        home=tmp_path,
    )  # fmt: skip
    assert refused.returncode == 1 and "the plan has no model 'polcy'" in refused.stdout
    assert "model polcy" not in refused.stdout


def test_a_model_name_no_run_accepts_is_refused_by_path(tmp_path: Path) -> None:
    path = plan_in(
        tmp_path,
        '[[stages]]\nname = "b"\nevaluate = { env = "support", model = "policy", split = "test" }\n',
        head=PLAN_HEAD.replace('"local/tiny-agent"', '"nonsense-model-xyz"'),
    )
    (problem,) = check(path).problems
    assert problem.startswith("models.policy: unknown model 'nonsense-model-xyz': valid forms are")
    assert "openai/... (e.g. openai/gpt-4o-mini)" in problem and "hf:..." in problem
    (problem,) = check(EXAMPLES / "local-grpo.toml", overrides=["policy=bogus"]).problems
    assert problem.startswith("models.policy: unknown model 'bogus': valid forms are")
    # Endpoint forms are known by their form; nothing is contacted.
    assert check(EXAMPLES / "local-grpo.toml", overrides=["policy=openai/gpt-4o-mini"]).ok
    # A form's prefix with nothing after it names no model: the tracker refuses its run, so
    # the plan would stop at its first stage (after pushing its envs and starting).
    for bare in ("openai/", "http://", "vllm:", "together/", "openai-compatible:"):
        (problem,) = check(EXAMPLES / "local-grpo.toml", overrides=[f"policy={bare}"]).problems
        assert problem.startswith(f"models.policy: unknown model {bare!r}: valid forms"), problem


def test_a_plan_file_that_is_not_utf8_is_named_and_a_bom_is_accepted(tmp_path: Path) -> None:
    (tmp_path / "bin.toml").write_bytes(b"\xff\xfe\x00binary")
    (tmp_path / "latin1.toml").write_bytes(b'name = "caf\xe9"\n')
    assert check(tmp_path / "bin.toml").problems == [
        f"{tmp_path / 'bin.toml'}: not UTF-8 text (byte 0xff at offset 0)"
    ]
    assert check(tmp_path / "latin1.toml").problems == [
        f"{tmp_path / 'latin1.toml'}: not UTF-8 text (byte 0xe9 at offset 11)"
    ]
    bad = cli("plan", str(tmp_path / "bin.toml"), home=tmp_path)
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert "not UTF-8 text" in bad.stdout
    (tmp_path / "workflow_support.py").write_text((EXAMPLES / "workflow_support.py").read_text())
    bom = tmp_path / "bom.toml"
    bom.write_bytes(b"\xef\xbb\xbf" + (EXAMPLES / "local-grpo.toml").read_bytes())
    assert check(bom).hash == check(EXAMPLES / "local-grpo.toml").hash


def test_a_stage_naming_itself_and_a_nan_say_so(tmp_path: Path) -> None:
    stages = """
[[stages]]
name = "s"
train = { method = "sft", model = "policy", from = "s", config = { learning_rate = nan } }
[[stages]]
name = "e"
evaluate = { env = "support", model = "policy", split = "test", temperature = nan }
[[stages]]
name = "c"
compare = { base = "c", other = "e" }
"""
    assert sorted(check(plan_in(tmp_path, stages)).problems) == [
        "stages[0].train.config.learning_rate: not a number (nan)",
        "stages[0].train.from: refers to its own stage 's': a stage may only use earlier stages",
        "stages[1].evaluate.temperature: not a number (nan)",
        "stages[2].compare.base: refers to its own stage 'c': a stage may only use earlier stages",
    ]


MANY = """
[[stages]]
name = "before"
evaluate = { env = "support", model = "polcy", split = "test", n = "eight", temperature = "hot", max_tokens = 0, colour = "blue" }
[[stages]]
name = "sft"
train = { method = "sft", model = "policy", from = "before", suffix = 5, config = { learning_rate = "fast", epochs = 0 } }
[[stages]]
name = "both"
run = { env = "support", model = "policy", n = "x" }
compare = { base = "before", other = "before" }
[[stages]]
name = "shapeless"
evaluate = 3
[[stages]]
name = "delta"
compare = { base = "shapeless", other = "before", extra = 1 }
"""


def test_every_mistake_of_every_section_is_said_in_one_pass(tmp_path: Path) -> None:
    # A wrong value made pydantic skip the rest of its table (the model and env references, a
    # train stage's config, the stage's own kind check): each fix met the next mistake.
    path = plan_in(tmp_path, MANY, head=PLAN_HEAD + '[resources]\nthreads = "four"\n')
    done = cli("plan", str(path), home=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr + done.stdout, done.stderr
    problems = [line.removeprefix("    - ") for line in done.stdout.splitlines()[1:]]
    assert sorted(problems) == sorted([
        "resources.threads: must be a whole number, got 'four'",
        "stages[0].evaluate.n: must be a whole number, got 'eight'",
        "stages[0].evaluate.temperature: must be a number, got 'hot'",
        "stages[0].evaluate.max_tokens: must be >= 1",
        "stages[0].evaluate.colour: unknown setting",
        "stages[0].evaluate.model: no earlier train stage 'polcy' (have none); nor a model of "
        "[models] (have policy, teacher)",
        "stages[1].train.suffix: must be a string, got 5",
        "stages[1].train.config.learning_rate: must be a number, got 'fast'",
        "stages[1].train.config.epochs: must be > 0",
        "stages[1].train.from: stage 'before' runs the test tasks, held-out ones: the learner "
        'never trains on them and would refuse the job; run stage \'before\' on split = "train"',
        "stages[2].run.n: must be a whole number, got 'x'",
        "stages[2].kind: give exactly one of run, train, evaluate, compare (got run, compare)",
        "stages[3].evaluate: must be a table",
        "stages[4].compare.extra: unknown setting",
    ])  # fmt: skip
    assert done.stdout.startswith(f"✗ {path}: {len(problems)} problem(s); nothing was started")
    # `shapeless` is no stage at all: the compare naming it is not told it does not exist.
    assert not any(p.startswith("stages[4].compare.base") for p in problems)


def test_a_value_left_out_for_being_wrong_is_not_missing_too(tmp_path: Path) -> None:
    # The rest is checked without it: its absence (`from: required`, no split so every task)
    # is not a second problem, nor a warning.
    stages = """
[[stages]]
name = "demos"
run = { env = "support", model = "teacher", split = "train" }
[[stages]]
name = "sft"
train = { method = "sft", model = "policy", from = 3 }
[[stages]]
name = "after"
evaluate = { env = "support", model = "sft", split = "" }
"""
    result = check(plan_in(tmp_path, stages))
    assert result.problems == [
        "stages[1].train.from: must be a string, got 3",
        "stages[2].evaluate.split: must not be empty",
    ]
    assert result.warnings == []


def test_stages_are_not_told_they_lack_an_entry_that_was_itself_wrong(tmp_path: Path) -> None:
    # `support` and `policy` are there, with wrong values: said once, where they are.
    head = 'name = "p"\nenvs = { support = 5 }\n[models]\npolicy = 5\n'
    stages = """
[[stages]]
name = "e"
evaluate = { env = "support", model = "policy", n = "x" }
[[stages]]
name = "f"
evaluate = { env = "other", model = "policy" }
"""
    assert check(plan_in(tmp_path, stages, head=head)).problems == [
        "envs.support: must be a table",
        "models.policy: must be a string, got 5",
        "stages[0].evaluate.n: must be a whole number, got 'x'",
        "stages[1].evaluate.env: no environment 'other' in [envs] (have none)",
    ]


TYPED = """
[resources]
replicas = 1.0
[[stages]]
name = "b"
evaluate = { env = "support", model = "policy", split = "test", n = "4", max_tokens = 64.0, max_tool_calls = 4.7, temperature = true }
[[stages]]
name = "g"
train = { method = "grpo", model = "policy", env = "support", config = { max_steps = "2", lora = 1, group_size = 4.0 } }
"""


def test_a_value_of_the_wrong_type_is_named_not_coerced(tmp_path: Path) -> None:
    result = check(plan_in(tmp_path, TYPED, head=PLAN_HEAD.replace("seed = 1", "seed = true")))
    assert result.problems == [
        "seed: must be a whole number, got true",
        "stages[0].evaluate.n: must be a whole number, got '4'",
        "stages[0].evaluate.temperature: must be a number, got true",
        "stages[0].evaluate.max_tool_calls: must be a whole number, got 4.7",
        "stages[1].train.config.max_steps: must be a whole number, got '2'",
        "stages[1].train.config.lora: must be true or false, got 1",
    ]
    # A whole float for a whole number (`4.0`) is taken, as it always was: the same plan.
    fixed = TYPED.replace('n = "4"', "n = 4").replace("max_tool_calls = 4.7", "max_tool_calls = 4")
    fixed = fixed.replace("temperature = true", "temperature = 1").replace('"2"', "2.0")
    fixed = fixed.replace("lora = 1", "lora = true")
    whole = check(plan_in(tmp_path, fixed))
    assert whole.ok, whole.problems
    ints = fixed.replace("replicas = 1.0", "replicas = 1").replace("64.0", "64")
    assert check(plan_in(tmp_path, ints)).hash == whole.hash
    assert whole.canonical["stages"][0]["evaluate"]["temperature"] == 1.0


def test_slug_is_refused_for_a_plan(tmp_path: Path) -> None:
    refused = cli("plan", str(EXAMPLES / "local-grpo.toml"), "--slug", "nope", home=tmp_path)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert "--slug: only for an environment file (.py)" in refused.stderr
    doc = json.loads(
        cli(
            "plan", str(EXAMPLES / "local-grpo.toml"), "--slug", "x", "--json", home=tmp_path
        ).stdout
    )
    assert not doc["ok"] and doc["error"].startswith("--slug: only for an environment file")


def test_an_env_whose_test_split_repeats_train_is_refused_in_a_plan(tmp_path: Path) -> None:
    text = (EXAMPLES / "workflow_support.py").read_text()
    path = plan_in(
        tmp_path,
        '[[stages]]\nname = "b"\nevaluate = { env = "support", model = "policy", split = "test" }\n',
    )
    # Every test task made a word-for-word copy of the first train task.
    (tmp_path / "workflow_support.py").write_text(
        text + "\nfor _t in env.tasks:\n"
        "    if _t.split == 'test':\n"
        "        _first = next(t for t in env.tasks if t.split == 'train')\n"
        "        _t.instruction, _t.hidden_ground_truth = _first.instruction, _first.hidden_ground_truth\n"
        "        _t.input = _first.input\n"
    )
    result = check(path)
    listed = [p for p in result.problems if "same instruction and ground truth" in p]
    assert len(listed) == 5 and all(
        p.startswith("envs.support.file: support-refunds: tasks[") for p in listed
    )
    assert "(train); its test score would measure recall" in listed[0]
    assert result.problems[-1] == (
        "envs.support.file: support-refunds: tasks: 11 more held-out task(s) repeat a train task word for word"
    )


def test_a_run_over_the_trackers_size_cap_is_refused_before_anything_starts(
    tmp_path: Path,
) -> None:
    # 108 tasks x 1024 samples: the plan checked, pushed its env and started, and then the
    # tracker refused the stage's run (over its 100,000 rollouts a run), failing the plan.
    stages = (
        '[[stages]]\nname = "sweep"\nrun = { env = "support", model = "policy", n = 1024 }\n'
        '[[stages]]\nname = "fits"\n'
        'run = { env = "support", model = "policy", split = "test", n = 1024 }\n'
    )
    path = plan_in(tmp_path, stages)
    env = tmp_path / "workflow_support.py"
    env.write_text(
        env.read_text() + "\nimport copy as _copy\n"
        "for _k in range(60):\n"
        "    _t = _copy.deepcopy(next(t for t in env.tasks if t.split == 'train'))\n"
        "    _t.id, _t.instruction = f'extra-{_k}', f'{_t.instruction} (case {_k})'\n"
        "    env.tasks.append(_t)\n"
    )
    result = check(path)
    assert result.problems == [
        "stages[0].run.n: 108 task(s) x 1024 = 110,592 rollouts, over the 100,000 one run may "
        "ask for; lower n, pick a split, or spread them over several stages"
    ]


# The plan runner's stand-in: says it started, then waits as a stage's run would.
_RUNNING_PLAN = """
import asyncio, sys
from rollout.cli import experiments, main

async def stage(args):
    print("stage running", flush=True)
    try:
        await asyncio.sleep(600)
    except asyncio.CancelledError:
        print("interrupted: plan p stopped in stage 's'", file=sys.stderr, flush=True)
        raise

experiments._run_config = stage
sys.exit(main(["run", "--config", sys.argv[1]]))
"""


@pytest.mark.parametrize(("signal_name", "code"), [("SIGTERM", 143), ("SIGINT", 130)])
def test_a_plan_stopped_by_sigterm_says_how_to_resume_as_ctrl_c_does(
    tmp_path: Path, signal_name: str, code: int
) -> None:
    import signal

    # `timeout`, a batch scheduler or `kill` send SIGTERM: the plan used to die without a word.
    env = {"ROLLOUT_HOME": str(tmp_path), "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    with subprocess.Popen(
        [sys.executable, "-c", _RUNNING_PLAN, "plan.toml"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    ) as proc:  # fmt: skip
        assert proc.stdout is not None and proc.stdout.readline() == "stage running\n"
        proc.send_signal(getattr(signal, signal_name))
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert "interrupted: plan p stopped in stage 's'" in err
    assert "to resume, run the same command again: rollout run --config plan.toml" in err
    assert "Traceback" not in err
