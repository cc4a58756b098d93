"""`state_match`: each expected path in the final state equals its value (numbers by value)."""

from __future__ import annotations

from typing import Any

from rollout.shared.contracts.envspec import CamelModel, TaskSpec
from rollout.shared.contracts.trajectory import Trajectory
from rollout.shared.envs.compare import short, values_equal
from rollout.shared.envs.paths import PathError, parse_cached, resolve_path
from rollout.shared.envs.verifiers.primitives.common import MISSING, lookup
from rollout.shared.envs.verifiers.registry import (
    Compiled,
    register_compiled,
)


class StateMatchParams(CamelModel):
    """`state_match`: each key is a dot path into the final state, each value what it must equal."""

    expected: dict[str, Any] | None = None
    partial: bool = False
    # Score 0 unless every path matches. Credit per path pays for paths that already hold
    # (an untouched `refunds: []` an idle agent leaves as it found it).
    all_or_nothing: bool = False


def _state_match(expected: Any, state: Any, partial: bool) -> tuple[float, bool, str]:
    if expected is None:
        return 0.0, False, "nothing to compare: no expected state and no hidden ground truth"
    if not isinstance(expected, dict):
        return 0.0, False, f"expected state must be an object of paths, got {short(expected)}"
    if not expected:
        return 1.0, True, "no paths to check"
    misses = []
    for key, want in expected.items():
        have = lookup(state, key)
        if have is MISSING:
            misses.append(f"{key}: missing (expected {short(want)})")
        elif not values_equal(want, have, partial=partial):
            misses.append(f"{key}: expected {short(want)}, got {short(have)}")
    matched = len(expected) - len(misses)
    if not misses:
        return 1.0, True, f"all {len(expected)} path(s) match"
    return matched / len(expected), False, "; ".join(misses)


def _segments(key: str) -> tuple[Any, ...] | None:
    try:
        return parse_cached(key)
    except PathError:
        return None


@register_compiled("state_match", StateMatchParams)
def state_match(p: StateMatchParams) -> Compiled:
    """Each expected path in the final state equals its value (numbers by value); with
    allOrNothing, a state with any path wrong scores 0."""
    matcher = _matcher(p)
    if not p.all_or_nothing:
        return matcher

    def strict(trajectory: Trajectory, task: TaskSpec) -> tuple[float, bool, str]:
        score, passed, reason = matcher(trajectory, task)
        return (1.0 if passed else 0.0), passed, reason

    return strict


def _matcher(p: StateMatchParams) -> Compiled:
    partial = p.partial
    fixed = p.expected
    if not isinstance(fixed, dict) or not fixed:
        # The hidden ground truth (or a degenerate expectation): read on every score.
        def from_task(trajectory: Trajectory, task: TaskSpec) -> tuple[float, bool, str]:
            expected = fixed if fixed is not None else task.hidden_ground_truth
            return _state_match(expected, trajectory.final_state or {}, partial)

        return from_task
    # Fixed paths: parsed once; the general loop (_state_match) runs when one misses.
    checks = [(key, want, _segments(key)) for key, want in fixed.items()]
    all_match = f"all {len(fixed)} path(s) match"

    def run(trajectory: Trajectory, task: TaskSpec) -> tuple[float, bool, str]:
        state = trajectory.final_state or {}
        is_dict = isinstance(state, dict)
        for key, want, segments in checks:
            if is_dict and key in state:
                have = state[key]
            elif segments is None:
                return _state_match(fixed, state, partial)
            else:
                try:
                    have = resolve_path(state, segments)
                except PathError:
                    return _state_match(fixed, state, partial)
            if not values_equal(want, have, partial=partial):
                return _state_match(fixed, state, partial)
        return 1.0, True, all_match

    return run
