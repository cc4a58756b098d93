"""The training core: SFT, DPO (IPO, ...), KTO and reward models through TRL, online GRPO and PPO on torch, checkpoints and resume.

Heavy libraries (torch, transformers, TRL, peft) are imported inside the functions that need
them, so importing this package stays cheap for services that only validate configs.
"""

from rollout.shared.learning.checkpoints import (
    CheckpointState,
    load_checkpoint_state,
    read_step_log,
)
from rollout.shared.learning.config import Progress, TrainConfig, TrainResult
from rollout.shared.learning.data import dpo_pairs, sft_examples
from rollout.shared.learning.dpo import train_dpo
from rollout.shared.learning.grpo import Group, GRPOLearner
from rollout.shared.learning.kto import train_kto
from rollout.shared.learning.opd import OPDLearner
from rollout.shared.learning.ppo import PPOLearner, gae
from rollout.shared.learning.rm import train_rm
from rollout.shared.learning.sft import train_sft

__all__ = [
    "CheckpointState",
    "GRPOLearner",
    "Group",
    "OPDLearner",
    "PPOLearner",
    "Progress",
    "TrainConfig",
    "TrainResult",
    "dpo_pairs",
    "gae",
    "load_checkpoint_state",
    "read_step_log",
    "sft_examples",
    "train_dpo",
    "train_kto",
    "train_rm",
    "train_sft",
]
