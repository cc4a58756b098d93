"""Verifier: scores generated batches with the environment's verifier primitives."""
