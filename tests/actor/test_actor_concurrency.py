"""An actor replica takes several work items per fetch and generates them at once."""

from __future__ import annotations

import pytest

from rollout.errors import RolloutError
from rollout.services.actor import main as actor_main
from rollout.services.actor import tuning


def _generate_pull(settings) -> int:
    broker = actor_main.build_broker(settings)
    (sub,) = [s for s in broker.subscribers if getattr(s, "pull_sub", None) is not None]
    return sub.pull_sub.batch_size


def test_the_actor_fetches_as_many_items_as_it_generates_at_once(settings, monkeypatch) -> None:
    assert _generate_pull(settings) == tuning.DEFAULT_CONCURRENCY > 1
    monkeypatch.setenv(tuning.CONCURRENCY_ENV, "1")
    assert _generate_pull(settings) == 1
    monkeypatch.setenv(tuning.CONCURRENCY_ENV, " 12 ")
    assert _generate_pull(settings) == 12


@pytest.mark.parametrize(("raw", "problem"), [("many", "whole number"), ("0", ">= 1")])
async def test_a_bad_concurrency_is_refused_before_the_actor_connects(
    settings, monkeypatch, raw: str, problem: str
) -> None:
    monkeypatch.setenv(tuning.CONCURRENCY_ENV, raw)
    with pytest.raises(RolloutError, match=f"ROLLOUT_ACTOR_CONCURRENCY must be (a )?{problem}"):
        await actor_main.serve(settings)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("http://127.0.0.1:8000/v1", "name the base model"),
        ("ftp://127.0.0.1/v1#local/smollm2-135m", "http"),
        ("http://10.9.8.7:8000/v1#local/smollm2-135m", "is not allowed"),
    ],
)
async def test_a_bad_inference_server_is_refused_before_the_actor_connects(
    settings, monkeypatch, value: str, problem: str
) -> None:
    monkeypatch.setenv("ROLLOUT_INFERENCE_SERVER", value)
    with pytest.raises(RolloutError, match="ROLLOUT_INFERENCE_SERVER") as caught:
        await actor_main.serve(settings)
    assert problem in str(caught.value) + " ".join(caught.value.problems)
