"""Shared fixtures: the scripted OpenAI-compatible server (see tests/fakes/openai_server.py)."""

import sys
from pathlib import Path

# Test folders have no __init__.py; put tests/ on the path so `fakes` imports from anywhere.
if str(Path(__file__).resolve().parents[1]) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fakes.openai_server import fake_openai  # noqa: E402, F401  (a pytest fixture)
