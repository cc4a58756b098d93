"""pydantic models: the single source of every contract (JSON Schema in schemas/ is generated)."""
