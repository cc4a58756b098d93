"""The in-process platform's fixtures (tests/pipeline/fixtures.py)."""

from pipeline.fixtures import actorless, agent_server, client, platform

__all__ = ["actorless", "agent_server", "client", "platform"]
