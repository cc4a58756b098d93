"""One rule for every service's numeric knob: default when unset, the variable named when wrong."""

from __future__ import annotations

import pytest

from rollout.errors import RolloutError
from rollout.shared.settings import env_number

V = "ROLLOUT_TEST_KNOB"


@pytest.mark.parametrize(
    ("raw", "kw", "value"),
    [(None, {}, 7.0), ("  ", {}, 7.0), (" 2.5 ", {}, 2.5), ("3", {"whole": True}, 3)],
)
def test_values_and_defaults(raw: str | None, kw: dict, value: float) -> None:
    env = {} if raw is None else {V: raw}
    got = env_number(V, 7.0, env=env, **kw)
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize(
    ("raw", "kw", "message"),
    [
        ("soon", {"unit": "seconds"}, f"{V} must be a number of seconds, got 'soon'"),
        ("2.5", {"whole": True}, f"{V} must be a whole number, got '2.5'"),
        ("0", {"above": 0}, f"{V} must be > 0, got 0"),
        ("0", {"whole": True, "low": 1}, f"{V} must be >= 1, got 0"),
        ("99", {"high": 60}, f"{V} must be <= 60, got 99"),
        ("0.1", {"low": 0.5, "high": 60, "unit": "seconds"},
         f"{V} must be between 0.5 and 60 seconds, got 0.1"),
        ("nan", {"low": 0}, f"{V} must be a finite number, got 'nan'"),
        ("inf", {"above": 0}, f"{V} must be a finite number, got 'inf'"),
        ("-Infinity", {}, f"{V} must be a finite number, got '-Infinity'"),
    ],
)  # fmt: skip
def test_a_bad_value_names_the_variable_and_the_rule(raw: str, kw: dict, message: str) -> None:
    with pytest.raises(RolloutError) as caught:
        env_number(V, 1.0, env={V: raw}, **kw)
    assert str(caught.value) == message
