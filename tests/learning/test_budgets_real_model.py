"""Budgets hold on a real model that never stops talking (a freshly initialised tiny Llama).

Untrained, the model writes noise and never an end-of-turn token: each turn runs to whatever
limit it is given. The hf backend must stop it at the turn's token budget and at the rollout's
wall deadline (mid-generation, not after the turn), and the trajectory must say which.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from learning_kit import TOOLS

from rollout.shared.agent.loop import Episode, SamplingParams, run_episodes
from rollout.shared.contracts.budgets import Budgets
from rollout.shared.envs.runtime import ToolResult, ToolSpec
from rollout.shared.models.hf import HFBackend


class Shop:
    """A runtime with the kit's two tools; every call answers the same."""

    def tool_specs(self) -> list[ToolSpec]:
        return [
            ToolSpec(
                name=t["function"]["name"],
                description=t["function"]["description"],
                parameters=t["function"]["parameters"],
            )
            for t in TOOLS
        ]

    async def call_tool(self, name: str, arguments: dict) -> ToolResult:
        return ToolResult(output={"ok": True})

    def final_state(self) -> dict:
        return {}

    async def close(self) -> None:
        return None


@pytest.fixture(scope="module")
def talker(tiny_base: Path) -> HFBackend:
    """The untrained tiny model on the hf backend (no stop at a closed tool call)."""
    return HFBackend(tiny_base, device="cpu", threads=1, max_new_tokens=100_000)


def episodes(count: int) -> list[Episode]:
    greedy = SamplingParams(temperature=0.0)
    return [Episode(Shop(), f"Refund order O-{i}", sampling=greedy) for i in range(count)]


async def test_the_turn_budget_cuts_a_model_that_never_stops(talker: HFBackend) -> None:
    budgets = Budgets(max_turn_tokens=12, max_rollout_tokens=1000, max_rollout_seconds=600.0)
    trajectories = await run_episodes(episodes(3), talker, budgets=budgets)
    for t in trajectories:
        assert t.ended_by == "max_turn_tokens" and t.finish_reason == "length", t.final_output
        assert t.turns == 1 and t.completion_tokens == 12 and len(t.token_ids[0]) == 12


async def test_the_deadline_stops_generation_mid_turn(talker: HFBackend) -> None:
    # A turn may write up to the model's context; the rollout has half a second.
    budgets = Budgets(max_turn_tokens=100_000, max_rollout_tokens=100_000, max_rollout_seconds=0.5)
    started = time.monotonic()
    trajectories = await run_episodes(episodes(4), talker, budgets=budgets)
    elapsed = time.monotonic() - started
    unbounded = min(talker.model.config.max_position_embeddings, 100_000)
    for t in trajectories:
        assert t.ended_by == "max_rollout_seconds", (t.ended_by, t.completion_tokens)
        # Stopped where the deadline fell: well short of a turn that fills the context.
        assert 0 < t.completion_tokens < unbounded - 64
    # Generation ended at the deadline, not at the end of the turn.
    assert elapsed < 0.5 + 10.0
