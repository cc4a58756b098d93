"""`rollout serve-model`: online inference, a local or trained policy as an OpenAI-compatible API."""
