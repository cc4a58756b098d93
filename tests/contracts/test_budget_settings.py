"""Budgets resolve run > env > platform, field by field; bad ones are refused by name."""

from __future__ import annotations

import pytest

from rollout import Environment
from rollout.cli.platform import budget_overrides
from rollout.errors import RolloutError
from rollout.shared.contracts.budgets import DEFAULT_BUDGETS, Budgets, resolve_budgets


def test_a_run_overrides_the_env_which_overrides_the_platform_field_by_field() -> None:
    env = Budgets(max_turn_tokens=64, max_repeated_calls=0)
    run = Budgets(max_rollout_seconds=30)
    resolved = resolve_budgets(env, run)
    assert resolved == Budgets(
        max_turn_tokens=64,
        max_rollout_tokens=DEFAULT_BUDGETS.max_rollout_tokens,
        max_rollout_seconds=30,
        max_repeated_calls=0,
    )
    assert resolve_budgets(None, None) == DEFAULT_BUDGETS
    assert resolve_budgets(env, Budgets(max_turn_tokens=8)).max_turn_tokens == 8


def test_an_env_file_sets_its_budgets_and_a_typo_is_named() -> None:
    env = Environment("e", config={"tools": []}, budgets={"max_rollout_tokens": 900})
    assert env.to_spec().budgets == Budgets(max_rollout_tokens=900)
    assert "maxRolloutTokens" in env.to_json()  # part of the content hash
    with pytest.raises(RolloutError) as bad:
        Environment("e", config={"tools": []}, budgets={"max_turn_token": 9}).to_spec()
    assert "budgets.max_turn_token" in str(bad.value)
    with pytest.raises(RolloutError) as negative:
        Environment("e", config={"tools": []}, budgets={"max_rollout_seconds": -1}).to_spec()
    assert "budgets.max_rollout_seconds" in str(negative.value)


def test_run_flags_become_budgets_and_bad_ones_name_the_flag() -> None:
    assert budget_overrides([]) is None
    assert budget_overrides(["max_rollout_seconds=60", "max_repeated_calls=0"]) == {
        "max_rollout_seconds": 60.0,
        "max_repeated_calls": 0,
    }
    with pytest.raises(RolloutError, match="expected NAME=VALUE"):
        budget_overrides(["max_rollout_seconds"])
    with pytest.raises(RolloutError) as unknown:
        budget_overrides(["max_seconds=5"])
    assert "--budget max_seconds" in str(unknown.value)
    assert "max_rollout_seconds" in str(unknown.value)  # the known names are listed
    with pytest.raises(RolloutError, match="--budget max_turn_tokens"):
        budget_overrides(["max_turn_tokens=lots"])
