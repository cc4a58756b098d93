"""The embedded stack: nats-server and Postgres launchers, the supervisor, health and services."""
