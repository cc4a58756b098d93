"""Actor: pulls rollout work items (replicas share one consumer) and runs the agent loop."""
