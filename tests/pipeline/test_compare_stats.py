"""`rollout compare`'s statistics: Wilson and Newcombe intervals, and comparability warnings."""

from __future__ import annotations

import pytest

from rollout.cli.platform import comparison
from rollout.shared.stats import format_interval, newcombe_interval, wilson_interval


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
