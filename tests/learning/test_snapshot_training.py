"""An exported snapshot, imported with `rollout import`, is a training set the trainers take:
SFT and DPO on the tiny model for a few steps from the imported files (weights change)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from learning_kit import TOOLS, refund_messages, weights

from rollout.cli import main
from rollout.shared.learning import TrainConfig, train_dpo, train_sft


def _snapshot_row(order: int, sample: int, good: bool) -> dict:
    messages = refund_messages(order)
    if not good:
        messages = messages[:2] + [{"role": "assistant", "content": "I cannot help with refunds."}]
    return {
        "format": "rollout.snapshot/1",
        "rollout_id": f"run1-{order}-{sample}",
        "run_id": "run1",
        "task_index": order,
        "sample_index": sample,
        "model": "local/tiny-agent",
        "policy_version": 3,
        "env_slug": "refunds",
        "env_version": 2,
        "env_hash": "abc123",
        "score": 1.0 if good else 0.0,
        "passed": good,
        "outcome": "passed" if good else "failed",
        "primitives": "[]",
        "trajectory": json.dumps({"messages": messages, "final_output": messages[-1]["content"]}),
        "tools": json.dumps(TOOLS),
    }


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_imported_snapshot_trains_sft_and_dpo(tiny_base: Path, tmp_path: Path, capsys) -> None:
    snapshot = tmp_path / "snap.jsonl"
    rows = [_snapshot_row(o, s, good=s == 0) for o in range(1, 5) for s in range(2)]
    snapshot.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["import", str(snapshot), "-o", str(tmp_path / "sets"), "--json"]) == 0
    counts = json.loads(capsys.readouterr().out)
    assert (counts["rollouts"], counts["sft"], counts["dpo"], counts["kto"]) == (8, 4, 4, 8)

    sft = _jsonl(tmp_path / "sets" / "sft.jsonl")
    dpo = _jsonl(tmp_path / "sets" / "dpo.jsonl")
    assert all(p["rejected"][0]["content"] == "I cannot help with refunds." for p in dpo)
    before = weights(tiny_base)
    for name, train, data in (("sft", train_sft, sft), ("dpo", train_dpo, dpo)):
        config = TrainConfig(method=name, max_steps=2, learning_rate=3e-3, batch_size=2)
        result = train(tiny_base, data, tmp_path / name, config, resume=False)
        assert result.steps == 2 and math.isfinite(result.final_loss or 0.0), name
        after = weights(result.model_dir)
        assert any(not torch.equal(before[k], after[k]) for k in before), name
