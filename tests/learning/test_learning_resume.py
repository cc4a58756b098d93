"""Crash safety: SIGKILL a training process after a checkpoint; rerunning resumes from it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from learning_kit import refund_rollouts, weights

from rollout.shared.learning import (
    Progress,
    TrainConfig,
    load_checkpoint_state,
    read_step_log,
    sft_examples,
    train_sft,
)

pytestmark = pytest.mark.slow

CONFIG = {
    "method": "sft",
    "max_steps": 12,
    "save_every": 3,
    "learning_rate": 3e-3,
    "batch_size": 2,
    "threads": 1,
}
KILL_AFTER = 6


def test_sigkill_then_resume_completes_without_repeating_steps(
    tiny_base: Path, tmp_path: Path
) -> None:
    out = tmp_path / "job"
    child = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).with_name("sft_child.py")),
            str(tiny_base),
            str(out),
            json.dumps(CONFIG),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parent)},
    )
    # Wait on the child's own announcement that checkpoint N is on disk (no sleeping).
    assert child.stdout is not None
    for line in child.stdout:
        if line.startswith(f"CHECKPOINT {KILL_AFTER} "):
            child.send_signal(signal.SIGKILL)
            break
    assert child.wait(timeout=60) == -signal.SIGKILL

    state = load_checkpoint_state(out)
    assert state is not None and KILL_AFTER <= state.step < CONFIG["max_steps"]

    seen: list[Progress] = []
    result = train_sft(
        tiny_base,
        sft_examples(refund_rollouts()),
        out,
        TrainConfig(**CONFIG),
        on_progress=seen.append,
    )
    assert result.steps == CONFIG["max_steps"]
    # The rerun started right after the checkpoint and did only the remaining steps.
    assert [p.step for p in seen] == list(range(state.step + 1, CONFIG["max_steps"] + 1))
    assert [e["step"] for e in read_step_log(out)] == list(range(1, CONFIG["max_steps"] + 1))

    # Weights, optimizer, scheduler, RNG and data order all resumed: same model as one
    # uninterrupted run of the same job.
    straight = train_sft(
        tiny_base,
        sft_examples(refund_rollouts()),
        tmp_path / "straight",
        TrainConfig(**CONFIG),
        resume=False,
    )
    resumed, reference = weights(result.model_dir), weights(straight.model_dir)
    for name, tensor in reference.items():
        assert torch.allclose(resumed[name], tensor, atol=1e-5), name


def test_resume_false_starts_over(tiny_base: Path, tmp_path: Path) -> None:
    config = TrainConfig(**{**CONFIG, "max_steps": 4, "save_every": 2})
    examples = sft_examples(refund_rollouts())
    train_sft(tiny_base, examples, tmp_path / "o", config)
    seen: list[Progress] = []
    train_sft(tiny_base, examples, tmp_path / "o", config, on_progress=seen.append, resume=False)
    assert [p.step for p in seen] == [1, 2, 3, 4]
    assert [e["step"] for e in read_step_log(tmp_path / "o")] == [1, 2, 3, 4]
