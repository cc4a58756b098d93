"""Buffer: keeps scored rollouts and builds training data (SFT sets, DPO pairs, GRPO groups)."""
