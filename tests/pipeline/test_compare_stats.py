"""`rollout compare`'s statistics: Wilson and Newcombe intervals, and comparability warnings."""

from __future__ import annotations

import pytest

from rollout.cli.platform import print_comparison
from rollout.comparison import comparison, error_summary
from rollout.shared.stats import (
    design_effect,
    format_interval,
    newcombe_interval,
    paired_difference_interval,
    wilson_interval,
)


@pytest.mark.parametrize(
    ("successes", "n", "expected"),
    [
        # Newcombe (1998), "Two-sided confidence intervals for the single proportion", method 3.
        (81, 263, (0.2553, 0.3662)),
        (15, 148, (0.0624, 0.1605)),
        (0, 20, (0.0, 0.1611)),
        (1, 29, (0.0061, 0.1718)),
    ],
)
def test_wilson_interval_matches_published_values(successes, n, expected) -> None:
    assert wilson_interval(successes, n) == pytest.approx(expected, abs=5e-5)


@pytest.mark.parametrize(
    ("base", "other", "expected"),
    [
        # Newcombe (1998), "Interval estimation for the difference between independent
        # proportions", method 10 (hybrid score), as other - base.
        ((48, 80), (56, 70), (0.0524, 0.3339)),
        ((3, 10), (9, 10), (0.1705, 0.8090)),
        ((0, 29), (5, 56), (-0.0381, 0.1926)),
        ((0, 20), (0, 10), (-0.1611, 0.2775)),
        ((0, 20), (10, 10), (0.6791, 1.0)),
    ],
)
def test_newcombe_interval_matches_published_values(base, other, expected) -> None:
    assert newcombe_interval(*base, *other) == pytest.approx(expected, abs=5e-5)


def test_intervals_at_the_edges() -> None:
    assert wilson_interval(0, 0) == (0.0, 1.0)  # nothing scored: nothing known
    lo, hi = wilson_interval(16, 16)
    assert 0.79 < lo < 1.0 and hi == 1.0
    lo, hi = newcombe_interval(8, 16, 8, 16)
    assert lo == pytest.approx(-hi) and lo < 0 < hi
    with pytest.raises(ValueError, match="successes"):
        wilson_interval(5, 4)
    assert format_interval((0.25, 0.5)) == "[25%, 50%]"
    assert format_interval((-0.031, 0.28), signed=True) == "[-3%, +28%]"


def _run(run_id: str, passed: int, scored: int, **extra) -> dict:
    tasks = extra.pop("tasks", list(range(scored)))
    return {
        "runId": run_id, "model": "m", "envSlug": "ticket-routing", "envVersion": 1,
        "envHash": "h1", "split": "test", "passed": passed, "scored": scored,
        "passRate": passed / scored, "meanScore": passed / scored,
        "tasks": [{"taskIndex": i, "passRate": 0.0, "meanScore": 0.0} for i in tasks],
        **extra,
    }  # fmt: skip


def test_comparison_carries_intervals_and_no_warning_for_like_runs() -> None:
    result = comparison(_run("a", 4, 16), _run("b", 12, 16))
    assert result["base"]["passRateInterval"] == list(wilson_interval(4, 16))
    assert result["other"]["passRateInterval"] == list(wilson_interval(12, 16))
    assert result["deltaPassRateInterval"] == list(newcombe_interval(4, 16, 12, 16))
    assert result["deltaPassRateInterval"][0] > 0  # 25% -> 75% on 16 is a real gain
    assert result["warnings"] == []


def test_comparison_warns_about_other_versions_splits_and_task_sets() -> None:
    base = _run("a", 4, 16)
    warnings = comparison(base, _run("b", 5, 16, envVersion=2, envHash="h2"))["warnings"]
    assert len(warnings) == 1 and "v1 vs v2" in warnings[0]
    warnings = comparison(base, _run("b", 5, 16, split="train"))["warnings"]
    assert len(warnings) == 1 and "different splits (test vs train)" in warnings[0]
    warnings = comparison(base, _run("b", 5, 14, tasks=list(range(2, 16))))["warnings"]
    assert len(warnings) == 1 and "2 only in base: 0, 1" in warnings[0]
    warnings = comparison(base, _run("b", 5, 16, envSlug="fix-calc"))["warnings"]
    assert "different environments (ticket-routing vs fix-calc)" in warnings[0]


_DEFAULTS = {
    "sampling": {"temperature": 0.7, "top_p": 1.0, "max_tokens": 512, "seed": None},
    "maxToolCalls": 16,
}
_CAVEAT = " (the delta may come from the settings, not the model)"


def test_comparison_warns_when_the_runs_were_sampled_differently(capsys) -> None:
    base = _run("a", 4, 16, **_DEFAULTS)
    # Alike but for the seed (another draw of the same sampling): nothing to warn about.
    reseeded = _run("b", 12, 16, **_DEFAULTS | {"sampling": _DEFAULTS["sampling"] | {"seed": 7}})
    assert comparison(base, reseeded)["warnings"] == []
    assert comparison(base, _run("b", 12, 16, **_DEFAULTS))["warnings"] == []

    # `--temperature 1.5 --max-tool-calls 1 --max-tokens 16 --top-p 0.9` against the defaults.
    sampling = {"temperature": 1.5, "top_p": 0.9, "max_tokens": 16, "seed": None}
    result = comparison(base, _run("b", 12, 16, sampling=sampling, maxToolCalls=1))
    assert result["warnings"] == [
        "sampling differs: temperature 0.7 vs 1.5, top_p 1.0 vs 0.9, max_tokens 512 vs 16"
        + _CAVEAT,
        "max tool calls differ: 16 vs 1" + _CAVEAT,
    ]
    print_comparison(result)
    err = capsys.readouterr().err
    assert "warning: sampling differs: temperature 0.7 vs 1.5" in err
    assert "warning: max tool calls differ: 16 vs 1" in err

    # Budgets, where the summaries carry them: an override against the env's default.
    budgeted = _run("b", 12, 16, **_DEFAULTS, budgets={"maxTurnTokens": 8})
    assert comparison(_run("a", 4, 16, **_DEFAULTS, budgets=None), budgeted)["warnings"] == [
        "budgets differ: max_turn_tokens env default vs 8" + _CAVEAT
    ]
    same = _run("a", 4, 16, **_DEFAULTS, budgets={"max_turn_tokens": 8})
    assert comparison(same, budgeted)["warnings"] == []
    # A summary without the settings (an older run) is unknown, not different.
    assert comparison(_run("a", 4, 16), budgeted)["warnings"] == []


def test_other_settings_still_pair_the_same_tasks() -> None:
    base, other = _pairs(7, 5, 0, 4)
    result = comparison(
        _greedy_run("a", base, **_DEFAULTS), _greedy_run("b", other, maxToolCalls=1)
    )
    assert result["warnings"] == ["max tool calls differ: 16 vs 1" + _CAVEAT]
    assert result["deltaPassRatePairedInterval"] == list(
        paired_difference_interval(base, other)[1:]
    )


def _pairs(both: int, only_other: int, only_base: int, neither: int) -> tuple[list, list]:
    base = [True] * both + [False] * only_other + [True] * only_base + [False] * neither
    other = [True] * both + [True] * only_other + [False] * only_base + [False] * neither
    return base, other


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        # Newcombe (1998), "Improved confidence intervals for the difference between binomial
        # proportions based on paired data", method 10: (both, only other, only base, neither).
        ((36, 12, 2, 0), (0.0569, 0.3404)),
        ((18, 12, 2, 18), (0.0562, 0.3290)),
        ((53, 0, 0, 1), (-0.0729, 0.0729)),
    ],
)
def test_paired_interval_matches_published_values(table, expected) -> None:
    d, low, high = paired_difference_interval(*_pairs(*table))
    assert d == pytest.approx((table[1] - table[2]) / sum(table))
    assert (low, high) == pytest.approx(expected, abs=5e-5)


def test_paired_interval_is_narrower_than_independent_when_runs_agree() -> None:
    # 16 tasks: 7 pass in both, 5 more pass only after training, none lost.
    base, other = _pairs(7, 5, 0, 4)
    _, low, high = paired_difference_interval(base, other)
    independent = newcombe_interval(sum(base), 16, sum(other), 16)
    assert independent[0] < 0 < low  # the same numbers read as independent runs: not measurable
    assert high - low < independent[1] - independent[0]
    # Uncorrelated pairs give the independent interval.
    base, other = [True, False] * 8, [True, True, False, False] * 4
    assert paired_difference_interval(base, other)[1:] == pytest.approx(
        newcombe_interval(8, 16, 8, 16)
    )
    with pytest.raises(ValueError, match="equal lengths"):
        paired_difference_interval([True], [True, False])


def _greedy_run(run_id: str, outcomes: list[bool], **extra) -> dict:
    passed = sum(outcomes)
    return {
        "runId": run_id, "model": "m", "envSlug": "ticket-routing", "envVersion": 1,
        "envHash": "h1", "split": "test", "passed": passed, "scored": len(outcomes),
        "passRate": passed / len(outcomes), "meanScore": passed / len(outcomes),
        "tasks": [
            {"taskIndex": 48 + i, "n": 1, "scored": 1, "errored": 0, "passed": int(ok),
             "passRate": float(ok), "meanScore": float(ok)}
            for i, ok in enumerate(outcomes)
        ],
        **extra,
    }  # fmt: skip


def test_comparison_pairs_two_greedy_runs_of_the_same_tasks(capsys) -> None:
    base, other = _pairs(7, 5, 0, 4)
    result = comparison(_greedy_run("a", base), _greedy_run("b", other))
    assert result["deltaPassRatePairedInterval"] == list(
        paired_difference_interval(base, other)[1:]
    )
    print_comparison(result)
    assert "paired CI" in capsys.readouterr().out
    # Not pairs: another env version, a task sampled twice, an errored rollout.
    bumped = _greedy_run("b", other, envVersion=2, envHash="h2")
    assert comparison(_greedy_run("a", base), bumped)["deltaPassRatePairedInterval"] is None
    twice = _greedy_run("b", other)
    twice["tasks"][0] |= {"n": 2, "scored": 2}
    assert comparison(_greedy_run("a", base), twice)["deltaPassRatePairedInterval"] is None
    errored = _greedy_run("b", other)
    errored["tasks"][3]["errored"] = 1
    assert comparison(_greedy_run("a", base), errored)["deltaPassRatePairedInterval"] is None
    result = comparison(_run("a", 4, 16), _run("b", 12, 16))  # no per-task counts: unpaired
    assert result["deltaPassRatePairedInterval"] is None
    print_comparison(result)
    assert "paired CI" not in capsys.readouterr().out


def test_errored_rollouts_are_no_trials_and_a_mostly_errored_side_is_no_measurement() -> None:
    errored = [
        {"rolloutId": f"r{i}", "taskIndex": i, "errorKind": kind, "error": f"{kind} broke {i}"}
        for i, kind in enumerate(["model", "model", "infra"])
    ]
    # 16 rollouts ended, 3 errored: the rate and its interval are over the 13 verdicts.
    some = _run("b", 6, 16, errored=3)
    some["errorSummary"] = error_summary(some, errored)
    result = comparison(_run("a", 4, 16), some)
    assert result["other"]["judged"] == 13 and result["measured"] is True
    assert result["other"]["passRateInterval"] == list(wilson_interval(6, 13))
    assert result["deltaPassRateInterval"] == list(newcombe_interval(4, 16, 6, 13))
    summary = result["other"]["errorSummary"]
    assert [(k["kind"], k["count"], k["sample"]) for k in summary["kinds"]] == [
        ("model", 2, "model broke 0"),
        ("infra", 1, "infra broke 2"),
    ]
    assert summary["firstError"]["message"] == "model broke 0" and summary["complete"]
    assert result["warnings"] == [
        "other b: 3 of 16 rollouts errored (model 2, infra 1): model broke 0"
    ]

    # Over half errored: the delta is flagged as no measurement, whatever it says.
    mostly = _run("b", 0, 16, errored=9)
    result = comparison(mostly, _run("a", 4, 16))
    assert result["measured"] is False and result["mostlyErrored"] == ["base"]
    # Without the rollouts (a plan's compare stage) the counts still warn.
    assert result["base"]["errorSummary"]["kinds"] == []
    assert result["warnings"] == ["base b: 9 of 16 rollouts errored"]
    assert error_summary(_run("a", 4, 16)) is None


def test_a_run_with_no_verdict_has_no_delta_and_a_running_one_is_partial(capsys) -> None:
    # Cancelled before anything was scored: its passRate reads 0.0, which gave a "-100%"
    # delta with an interval, measured, against a run that passed every task.
    base = _greedy_run("a", [True, True, True])
    cancelled = {
        **_greedy_run("b", [True]), "passed": 0, "scored": 0, "passRate": 0.0,
        "meanScore": 0.0, "tasks": [], "status": "failed", "total": 3,
        "reason": "cancelled: wrong model (0/3 rollouts scored)",
    }  # fmt: skip
    result = comparison(base, cancelled)
    assert result["measured"] is False and result["unscored"] == ["other"]
    assert (result["deltaPassRate"], result["deltaPassRateInterval"], result["deltaScore"]) == (
        None, None, None,
    )  # fmt: skip
    said = "no rollout was scored (it failed: cancelled: wrong model (0/3 rollouts scored))"
    assert result["other"]["noVerdict"] == said and f"other b: {said}" in result["warnings"]
    print_comparison(result, per_task=False)
    rows = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()}
    assert rows["pass"] == ["rate", "100%", "-", "-"] and rows["95%"][-1] == "-", rows
    queued = {**cancelled, "status": "queued", "reason": None}
    assert comparison(base, queued)["other"]["noVerdict"] == (
        "no rollout scored yet (it is queued, 0 of 3): wait for it to score some"
    )
    # Under way with some verdicts: compared, and said to be partial.
    running = _greedy_run("b", [True, False], status="running", total=3)
    result = comparison(base, running)
    assert result["measured"] is True and result["deltaPassRate"] == pytest.approx(-0.5)
    assert "other b is still running: 2 of 3 rollouts scored so far, so its numbers are " \
        "partial" in result["warnings"]  # fmt: skip
    done = comparison(base, _greedy_run("b", [True, False], status="completed", total=2))
    assert not [w for w in done["warnings"] if "still" in w]


def test_a_task_whose_every_rollout_errored_has_no_rate(capsys) -> None:
    base = _greedy_run("a", [True, False])
    other = _greedy_run("b", [True, False], errored=1)
    other["tasks"][1] |= {"errored": 1, "passRate": 0.0}
    result = comparison(base, other)
    assert [t["otherPassRate"] for t in result["tasks"]] == [1.0, None]
    assert result["tasks"][1]["deltaPassRate"] is None
    print_comparison(result)
    assert "1 errored left out" in capsys.readouterr().out


def _sampled_run(run_id: str, per_task: list[int], n: int) -> dict:
    """A run of len(per_task) tasks, n samples each, per_task[i] of them passed."""
    passed, scored = sum(per_task), n * len(per_task)
    return {
        "runId": run_id, "model": "m", "envSlug": "ticket-routing", "envVersion": 1,
        "envHash": "h1", "split": "test", "n": n, "passed": passed, "scored": scored,
        "passRate": passed / scored, "meanScore": passed / scored,
        "tasks": [
            {"taskIndex": i, "n": n, "scored": n, "errored": 0, "passed": k,
             "passRate": k / n, "meanScore": k / n}
            for i, k in enumerate(per_task)
        ],
    }  # fmt: skip


def test_samples_of_one_task_are_not_counted_as_independent_trials(capsys) -> None:
    # A deterministic player: each task passes all its samples or none. Eight samples per task
    # carry no more than one does, and the interval must not pretend otherwise.
    once = comparison(_sampled_run("a", [1, 0] * 48, 1), _sampled_run("b", [1, 0] * 48, 1))
    eight = comparison(_sampled_run("a", [8, 0] * 48, 8), _sampled_run("b", [8, 0] * 48, 8))
    assert once["base"]["designEffect"] == 1.0
    assert eight["base"]["designEffect"] == pytest.approx(8 * 96 / 95, rel=1e-9)
    low1, high1 = once["base"]["passRateInterval"]
    low8, high8 = eight["base"]["passRateInterval"]
    assert abs(low8 - low1) < 0.01 and abs(high8 - high1) < 0.01, (low1, high1, low8, high8)
    assert (high8 - low8) > 2 * (high1 - low1) / 3  # was a third as wide, counted as 768 trials
    width = eight["deltaPassRateInterval"][1] - eight["deltaPassRateInterval"][0]
    width1 = once["deltaPassRateInterval"][1] - once["deltaPassRateInterval"][0]
    assert abs(width - width1) < 0.02
    print_comparison(eight, per_task=False)
    assert (
        "(samples of a task are correlated: counted as independent trials, base's 768 rollouts"
        " as 95, other's 768 rollouts as 95)" in capsys.readouterr().out
    )
    # Samples that vary within every task as much as across them are independent trials.
    mixed = comparison(_sampled_run("a", [4] * 96, 8), _sampled_run("b", [4] * 96, 8))
    assert mixed["base"]["designEffect"] == 1.0
    assert mixed["base"]["passRateInterval"] == list(wilson_interval(384, 768))


def test_a_deterministic_run_at_0_or_100_percent_is_no_surer_at_n8_than_at_n1() -> None:
    # Every sample of every task failed (or passed): eight samples of a task say no more than
    # one. Counted as 256 independent trials, 0 of 32 tasks read as "at most 1.5%".
    for per_task in ([0] * 32, [1] * 32):
        once = comparison(_sampled_run("a", per_task, 1), _sampled_run("b", per_task, 1))
        eight = comparison(
            _sampled_run("a", [8 * k for k in per_task], 8),
            _sampled_run("b", [8 * k for k in per_task], 8),
        )
        assert eight["base"]["designEffect"] == 8.0
        assert eight["base"]["passRateInterval"] == pytest.approx(once["base"]["passRateInterval"])
        assert eight["deltaPassRateInterval"] == pytest.approx(once["deltaPassRateInterval"])


def test_design_effect_edges() -> None:
    assert design_effect([]) == 1.0
    assert design_effect([(3, 8)]) == 1.0  # one task: nothing to cluster on
    assert design_effect([(8, 8), (8, 8)]) == 8.0  # a rate of 1: counted as one trial a task
    assert design_effect([(0, 8), (0, 4)]) == pytest.approx(80 / 12)  # sum(n^2) / sum(n)
    assert design_effect([(1, 1), (0, 1), (1, 1)]) == 1.0  # one sample per task
    # One task at a rate of 0 or 1 is no exception: its n samples are one trial.
    assert design_effect([(8, 8)]) == 8.0
    assert design_effect([(0, 3)]) == 3.0


def test_the_readme_one_task_env_at_n8_is_no_surer_than_at_n1() -> None:
    # The README's refund-agent has one task; `rollout run ... -n 8` with a player that always
    # solves it printed [68%, 100%] (and -n 50 [93%, 100%]): eight trials, where it is one.
    once = comparison(_sampled_run("a", [1], 1), _sampled_run("b", [1], 1))
    for n in (8, 50):
        many = comparison(_sampled_run("a", [n], n), _sampled_run("b", [0], n))
        assert many["base"]["designEffect"] == n
        assert many["base"]["passRateInterval"] == pytest.approx(once["base"]["passRateInterval"])
        assert many["other"]["passRateInterval"] == pytest.approx(list(wilson_interval(0, 1)))


def test_a_partial_task_table_with_several_samples_is_said_to_be_too_narrow() -> None:
    base = _sampled_run("a", [8, 0] * 4, 8) | {"tasksCursor": "4"}
    result = comparison(base, _sampled_run("b", [8, 0] * 4, 8))
    assert result["base"]["designEffect"] is None
    assert any("base a: several samples per task" in w for w in result["warnings"])
