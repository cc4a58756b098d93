"""The in-process platform's fixtures (tests/pipeline/fixtures.py)."""

from pipeline.fixtures import agent_server, client, platform

__all__ = ["agent_server", "client", "platform"]
