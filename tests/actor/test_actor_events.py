"""The actor's and verifier's fast paths build exactly what the plain pydantic ones did: the
generated event's payload (assembled from already-dumped trajectories), each rollout's
sampling, and the verdicts (primitives validated from their results' fields)."""

from __future__ import annotations

import datetime
import json

from pipeline.kit import refund_env

from rollout.services.actor.generate import dumped_batch, generate_batch, without_trajectory
from rollout.services.verifier.scoring import errored_verdict, score_rollout
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.contracts.events import (
    GeneratedRollout,
    PrimitiveScore,
    RolloutsGenerated,
    ScoredRollout,
)
from rollout.shared.contracts.trajectory import ToolCallRecord, Trajectory
from rollout.shared.contracts.work import RolloutItem, RolloutWork
from rollout.shared.envs.coerce import as_spec
from rollout.shared.envs.engine import score
from rollout.shared.models.base import ChatRequest, ChatResponse, ToolCall


class Refunder:
    """Refunds the task's order in full, then answers."""

    name = "test-refunder"

    async def generate(self, requests: list[ChatRequest]) -> list[ChatResponse]:
        out = []
        for r in requests:
            if any(m.get("role") == "tool" for m in r.messages):
                out.append(ChatResponse(content="done"))
                continue
            order = next(m["content"] for m in r.messages if m["role"] == "user").split()[2]
            args = json.dumps({"order_id": order, "amount": 10 * int(order.split("-")[1])})
            out.append(ChatResponse(tool_calls=[ToolCall(id="c", name="refund", arguments=args)]))
        return out


def _work(count: int) -> RolloutWork:
    return RolloutWork(
        work_item_id="w1",
        run_id="run1",
        env_slug="refunds",
        env_version=1,
        env_hash="h",
        model="m",
        sampling={"temperature": 0.3, "top_p": 0.9, "max_tokens": 64},
        items=[
            RolloutItem(rollout_id=f"r{i}", task_index=i % 3, sample_index=i, seed=100 + i)
            for i in range(count)
        ],
        trace_id="t",
        correlation_id="c",
        causation_id="x",
    )


async def test_the_generated_event_is_byte_for_byte_the_plain_dump() -> None:
    work = _work(6)
    rollouts = await generate_batch(work, as_spec(refund_env()), Refunder(), actor_id="a1")
    rollouts[0].policy_version = 7  # set after generation, as a trained backend's is
    # A trajectory whose JSON-mode dump converted values (tuple, datetime, int key), one
    # claim-checked away and one that never generated.
    odd = Trajectory(
        tool_calls=[ToolCallRecord(index=0, name="t", arguments={"a": (1, 2)}, result={3: "x"})],
        final_state={"when": datetime.datetime(2026, 1, 2, 3, 4, 5), "pair": (1, 2.5)},
    )
    rollouts[1] = rollouts[1].model_copy(update={"trajectory": odd.model_dump(mode="json")})
    rollouts[2] = rollouts[2].model_copy(
        update={"trajectory": None, "trajectory_uri": "file:///t", "trajectory_sha256": "ab"}
    )
    rollouts[3] = without_trajectory(rollouts[3], "too large")
    batch = RolloutsGenerated(run_id="run1", work_item_id="w1", rollouts=rollouts)

    fast = dumped_batch(batch)
    assert fast == batch.model_dump(mode="json")
    ids = {"aggregate_id": "run1", "id_parts": ("w1",), "trace_id": "t"}
    plain = EventEnvelope.new(batch, **ids)
    ours = EventEnvelope.new(batch, **ids, dumped=fast)
    ours.time = plain.time
    assert ours.to_bytes() == plain.to_bytes()
    # And it reads back as the batch it was built from.
    assert EventEnvelope.from_bytes(ours.to_bytes()).body() == batch


async def test_each_rollout_keeps_the_runs_sampling_with_its_own_seed() -> None:
    work = _work(4)
    rollouts = await generate_batch(work, as_spec(refund_env()), Refunder(), actor_id="a1")
    for item, rollout in zip(work.items, rollouts, strict=True):
        assert rollout.sampling == work.sampling.model_copy(update={"seed": item.seed})
        assert rollout.seed == item.seed
        assert rollout.trajectory is not None
        assert rollout.trajectory["final_state"]["refunds"] == [
            {"order_id": f"O-{item.task_index}", "amount": 10 * item.task_index}
        ]
    # The run's own sampling is untouched (no seed leaks into it).
    assert work.sampling.seed is None
    assert isinstance(rollouts[0], GeneratedRollout)


async def test_the_verifiers_verdicts_are_the_plainly_built_ones() -> None:
    spec = as_spec(refund_env())
    work = _work(3)
    rollouts = await generate_batch(work, spec, Refunder(), actor_id="a1")
    wrong = rollouts[1].trajectory | {"final_state": {"refunds": []}}
    rollouts[1] = rollouts[1].model_copy(update={"trajectory": wrong})
    rollouts[2] = rollouts[2].model_copy(update={"error": "cut short", "error_kind": "model"})
    verdicts = [await score_rollout(spec, r) for r in rollouts]
    assert [v.outcome for v in verdicts] == ["passed", "failed", "errored"]
    for rollout, verdict in zip(rollouts, verdicts, strict=True):
        result = await score(spec, rollout.task_index, Trajectory(**rollout.trajectory))
        primitives = [PrimitiveScore(**p.model_dump()) for p in result.primitives]
        if rollout.error:
            plain = errored_verdict(rollout, rollout.error, "model").model_copy(
                update={"primitives": primitives}
            )
        else:
            plain = ScoredRollout(
                rollout_id=rollout.rollout_id,
                task_index=rollout.task_index,
                sample_index=rollout.sample_index,
                score=result.score,
                passed=result.passed,
                primitives=primitives,
            )
        assert verdict == plain
        assert verdict.model_dump_json() == plain.model_dump_json()
        assert all(isinstance(p, PrimitiveScore) for p in verdict.primitives)
