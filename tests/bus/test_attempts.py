"""A delivery retries while attempts remain and gives up on the last, saying how many there were."""

from __future__ import annotations

import pytest

from rollout.shared.bus.attempts import Delivery, gave_up


def test_only_the_last_delivery_swallows_the_error() -> None:
    error = RuntimeError("endpoint down")
    with pytest.raises(RuntimeError) as raised:
        Delivery(2, limit=3).retry(error)
    assert raised.value is error
    Delivery(3, limit=3).retry(error)  # the last: the caller records the failure
    assert Delivery(4, limit=3).last


def test_the_reason_counts_the_attempts() -> None:
    assert Delivery(5).gave_up("no sandbox") == "gave up after 5 attempts: no sandbox"
    assert gave_up(1, "killed") == "gave up after 1 attempt: killed"
