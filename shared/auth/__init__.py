"""API keys as NATS users with roles: key format, key store, permissions, client credentials."""
