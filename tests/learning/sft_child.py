"""Child process of the SIGKILL test: train_sft that announces each checkpoint on stdout."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from learning_kit import refund_rollouts

from rollout.shared.learning import TrainConfig, sft_examples, train_sft


def main() -> None:
    """argv: base model dir, output dir, TrainConfig JSON."""
    base, out, config = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])

    def announce(path: Path, step: int) -> None:
        print(f"CHECKPOINT {step} {path}", flush=True)

    result = train_sft(
        base, sft_examples(refund_rollouts()), out, TrainConfig(**config), on_checkpoint=announce
    )
    print(f"DONE {result.steps}", flush=True)


if __name__ == "__main__":
    main()
