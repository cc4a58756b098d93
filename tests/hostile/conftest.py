"""The hostile suite reuses the auth tests' server and services (keys need a reloadable server)."""

import sys
from pathlib import Path

# Test folders have no __init__.py; put tests/ on the path so `auth` and `fakes` import.
if str(Path(__file__).resolve().parents[1]) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from auth.conftest import (  # noqa: E402, F401  (pytest fixtures)
    auth_nats,
    runner_key,
    service_settings,
    services,
    viewer_key,
)
