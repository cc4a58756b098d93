"""Learner service: training jobs (SFT, DPO, online GRPO, provider fine-tunes) and policies."""
